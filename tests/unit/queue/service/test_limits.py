"""What one caller may take of the server: rate limits, waits, connections, over real HTTP.

Each test makes its own app with small limits (the defaults are far above what the other tests
ask), serves it on a free loopback port, and speaks HTTP to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi import FastAPI

from preemptible.queue.core import ServiceSettings
from preemptible.queue.service.app import create_app
from preemptible.queue.service.auth import resolve_tokens
from preemptible.queue.service.connections import (
    RESERVED_FDS,
    ConnectionLimits,
    connection_limits,
)
from preemptible.queue.service.http_edge import ITEMS_PER_REQUEST, InFlight
from preemptible.queue.service.limits import RateLimiter, WaitSlots
from preemptible.queue.service.log_limits import RepeatFilter, quiet_repeats
from preemptible.queue.service.views import SubmitRequest
from tests.polling import wait_until

from .fake_manager import (
    ADMIN_TOKEN,
    ENVIRON,
    TEAM_A_TOKEN,
    TEAM_B_TOKEN,
    FakeQueueManager,
    live_server,
    make_config,
)

TEAM_A = {"Authorization": f"Bearer {TEAM_A_TOKEN}"}
TEAM_B = {"Authorization": f"Bearer {TEAM_B_TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def limited(**limits: object) -> tuple[FakeQueueManager, FastAPI]:
    config = dataclasses.replace(make_config(), service=ServiceSettings(**limits))  # type: ignore[arg-type]
    fake = FakeQueueManager(config)
    return fake, create_app(fake, tokens=resolve_tokens(config, ENVIRON))


@pytest.fixture
def slow_server() -> Iterator[tuple[FakeQueueManager, httpx.Client]]:
    """One request a second, three at once, for each caller."""
    fake, app = limited(rate_per_s=1.0, burst=3)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        yield fake, client


# --- the bucket ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_gives_its_burst_then_its_rate_and_says_how_long_to_wait() -> None:
    clock = Clock()
    limiter = RateLimiter(2.0, 3, clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)  # one more in half a second
    assert limiter.take("b") == 0.0  # another key has its own bucket
    clock.now += 0.5
    assert limiter.take("a") == 0.0 and limiter.take("a") == pytest.approx(0.5)
    clock.now += 100
    assert [limiter.take("a") for _ in range(4)][-1] > 0  # refilled to the burst, not beyond


def test_work_done_is_charged_after_it_and_the_caller_waits_it_off() -> None:
    clock = Clock()
    limiter = RateLimiter(10.0, 5, clock=clock)
    assert limiter.take("a") == 0.0
    limiter.charge("a", 14.0)  # a large answer: 4 + 1 - 14 = -10 left
    assert limiter.take("a") == pytest.approx(1.1)  # 11 short at 10 a second
    clock.now += 1.1
    assert limiter.take("a") == 0.0


def test_idle_buckets_are_forgotten_when_there_are_too_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("preemptible.queue.service.limits.MAX_BUCKETS", 3)
    clock = Clock()
    limiter = RateLimiter(1.0, 2, clock=clock)
    for key in "abc":
        limiter.take(key)
    clock.now += 2  # a, b and c are full again
    limiter.take("d")
    assert len(limiter._buckets) == 1


def test_wait_slots_bound_each_key_alone() -> None:
    slots = WaitSlots(2)
    assert slots.acquire("a") and slots.acquire("a") and not slots.acquire("a")
    assert slots.acquire("b")
    slots.release("a")
    assert slots.acquire("a") and slots.held("a") == 2


# --- over HTTP -----------------------------------------------------------------------------------


def test_a_caller_past_its_rate_is_429_with_retry_after_and_the_others_are_not(
    slow_server: tuple[FakeQueueManager, httpx.Client],
) -> None:
    _, http = slow_server
    answers = [http.get("/v1/queues", headers=TEAM_A) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    refused = answers[-1]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert "queue 'team-a'" in refused.json()["error"]["message"]
    assert int(refused.headers["retry-after"]) == 1
    assert http.get("/v1/queues", headers=TEAM_B).status_code == 200  # its own bucket
    assert http.get("/v1/queues", headers=ADMIN).status_code == 200
    time.sleep(1.05)
    assert http.get("/v1/queues", headers=TEAM_A).status_code == 200


def test_submissions_are_counted_with_the_rest(
    slow_server: tuple[FakeQueueManager, httpx.Client],
) -> None:
    fake, http = slow_server
    body = {"queue": "team-a", "command": ["true"]}
    codes = [http.post("/v1/jobs", json=body, headers=TEAM_A).status_code for _ in range(5)]
    assert codes == [201, 201, 201, 429, 429] and len(fake.submissions) == 3


def test_a_page_of_a_listing_costs_a_request_more_per_so_many_items() -> None:
    extra = 1000 // ITEMS_PER_REQUEST  # what a page of 1000 costs beyond its request
    fake, app = limited(rate_per_s=0.01, burst=2 + extra)
    for _ in range(1000):
        fake.submit(SubmitRequest(queue="team-a", command=["x"]))
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        page = http.get("/v1/jobs", params={"limit": 1000}, headers=TEAM_A)
        assert page.status_code == 200 and len(page.json()) == 1000  # 1 + extra: 1 left
        assert http.get("/v1/jobs", params={"limit": 1}, headers=TEAM_A).status_code == 200
        refused = http.get("/v1/jobs", params={"limit": 1}, headers=TEAM_A)
        assert refused.status_code == 429, refused.text  # nothing left
        assert int(refused.headers["retry-after"]) > 60  # 1 at 0.01 a second
        assert http.get("/v1/jobs", params={"limit": 1}, headers=TEAM_B).status_code == 200


def test_the_callers_without_a_token_share_one_bucket() -> None:
    _, app = limited(rate_per_s=1.0, burst=2)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        codes = [http.get("/metrics").status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        assert http.get("/healthz").status_code == 200  # liveness is never refused
        assert http.get("/v1/queues", headers=ADMIN).status_code == 200


# --- notice long-polls ---------------------------------------------------------------------------


def job_headers(fake: FakeQueueManager, job_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {fake.job_token(job_id)}"}


def running_jobs(fake: FakeQueueManager, n: int) -> list[str]:
    jobs = [fake.submit(SubmitRequest(queue="team-a", command=["x"])).id for _ in range(n)]
    for job_id in jobs:
        fake.start(job_id)
    return jobs


def test_a_notice_reaches_its_poll_at_once_among_three_hundred_waiting() -> None:
    fake, app = limited()
    jobs = running_jobs(fake, 301)
    waiting, last = jobs[:-1], jobs[-1]
    limits = httpx.Limits(max_connections=len(jobs) + 8)
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, timeout=90, limits=limits) as http,
        ThreadPoolExecutor(len(waiting)) as pool,
    ):
        polls = [
            pool.submit(http.get, f"/v1/jobs/{j}/notice?wait=40", headers=job_headers(fake, j))
            for j in waiting
        ]
        fake.wait_for_pollers(len(waiting), timeout_s=20)  # all waiting on the manager at once
        fake.notify(last, reason="preempted by j0 (tier high)")
        started = time.monotonic()
        answer = http.get(f"/v1/jobs/{last}/notice?wait=40", headers=job_headers(fake, last))
        took = time.monotonic() - started
        assert answer.json()["notice"]["reason"] == "preempted by j0 (tier high)"
        assert took < 10, f"the notice took {took:.1f} s to reach its poll"
        for j in waiting:
            fake.notify(j)
        assert all(p.result(timeout=60).json()["notice"] for p in polls)


def test_one_job_may_have_only_so_many_polls_waiting() -> None:
    fake, app = limited(notice_polls=2)
    job, other = running_jobs(fake, 2)
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, timeout=30) as http,
        ThreadPoolExecutor(2) as pool,
    ):
        polls = [
            pool.submit(http.get, f"/v1/jobs/{job}/notice?wait=20", headers=job_headers(fake, job))
            for _ in range(2)
        ]
        fake.wait_for_pollers(2)
        refused = http.get(f"/v1/jobs/{job}/notice?wait=20", headers=job_headers(fake, job))
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert "2 notice long-polls" in refused.json()["error"]["message"]
        # another job has its own
        assert http.get(f"/v1/jobs/{other}/notice", headers=job_headers(fake, other)).json() == {
            "notice": None
        }
        fake.notify(job)
        assert all(p.result(timeout=20).json()["notice"] for p in polls)
        assert http.get(f"/v1/jobs/{job}/notice", headers=job_headers(fake, job)).status_code == 200


# --- connections ---------------------------------------------------------------------------------


def until(check: Callable[[], object], timeout_s: float = 10.0) -> None:
    wait_until(check, "the connections to settle", timeout=timeout_s, every=0.02)


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def idle_connections(url: str, n: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    return [socket.create_connection((host, int(port)), timeout=5) for _ in range(n)]


GUARDED_APPS: dict[str, FastAPI] = {}


@pytest.fixture
def guarded() -> Iterator[tuple[str, ConnectionLimits]]:
    """A server that takes 4 connections and closes one idle for 1.5 s."""
    _, app = limited(max_connections=4, keep_alive_s=1.5)
    limits = connection_limits(app.state.manager.config.service)
    with live_server(app, limits) as url:
        GUARDED_APPS[url] = app
        yield url, limits
        del GUARDED_APPS[url]


def test_a_flood_of_idle_connections_cannot_keep_a_client_out(
    guarded: tuple[str, ConnectionLimits],
) -> None:
    url, limits = guarded
    held = idle_connections(url, 4)  # every connection the server takes, none sends a byte
    until(lambda: limits.open == 4)
    assert httpx.get(f"{url}/v1/queues", headers=ADMIN, timeout=5).status_code == 200
    assert closed_by_server(held[0])  # the one idle the longest made room
    assert not any(closed_by_server(sock) for sock in held[1:])
    for sock in held:
        sock.close()


def test_past_its_connections_all_busy_the_server_answers_503_and_closes(
    guarded: tuple[str, ConnectionLimits],
) -> None:
    url, limits = guarded
    fake: FakeQueueManager = GUARDED_APPS[url].state.manager
    jobs = running_jobs(fake, 4)
    with ThreadPoolExecutor(4) as pool:
        polls = [
            pool.submit(
                httpx.get, f"{url}/v1/jobs/{j}/notice?wait=20", headers=job_headers(fake, j)
            )
            for j in jobs
        ]
        fake.wait_for_pollers(4)  # four requests in: no connection is idle
        refused = httpx.get(f"{url}/v1/queues", headers=ADMIN, timeout=5)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "unavailable"
        assert "4 connections" in refused.json()["error"]["message"]
        assert refused.headers["connection"] == "close" and limits.refused >= 1
        for j in jobs:
            fake.notify(j)
        assert all(p.result(timeout=20).status_code == 200 for p in polls)
    until(lambda: limits.open == 0)
    assert httpx.get(f"{url}/v1/queues", headers=ADMIN, timeout=5).status_code == 200


def test_idle_connections_are_closed_new_and_between_requests(
    guarded: tuple[str, ConnectionLimits],
) -> None:
    url, limits = guarded
    held = idle_connections(url, 4)  # a flood that never sends a byte
    until(lambda: all(closed_by_server(sock) for sock in held), timeout_s=5)
    with httpx.Client(base_url=url, headers=ADMIN, timeout=5) as http:
        assert http.get("/v1/queues").status_code == 200  # the server answers again
        until(lambda: limits.open == 0, timeout_s=5)  # and closes a keep-alive one left idle
    for sock in held:
        sock.close()


def test_a_request_sent_a_byte_at_a_time_is_cut_off(
    guarded: tuple[str, ConnectionLimits],
) -> None:
    url, _ = guarded
    (sock,) = idle_connections(url, 1)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    while not closed_by_server(sock):  # one header byte every 0.1 s, never the blank line
        assert time.monotonic() - started < 5, "still open after 5 s"
        sock.sendall(b"X")
        time.sleep(0.1)
    sock.close()


def test_a_long_poll_is_not_idle(guarded: tuple[str, ConnectionLimits]) -> None:
    url, _ = guarded
    fake: FakeQueueManager = GUARDED_APPS[url].state.manager
    (job,) = running_jobs(fake, 1)
    with httpx.Client(base_url=url, timeout=10) as http:
        started = time.monotonic()
        poll = http.get(f"/v1/jobs/{job}/notice?wait=3", headers=job_headers(fake, job))
        assert poll.json() == {"notice": None} and time.monotonic() - started >= 3


def test_the_connections_fit_under_the_file_descriptor_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = connection_limits(ServiceSettings(max_connections=10**6))
    assert limits.fd_limit >= soft  # raised towards the hard limit where it may be
    assert limits.refuse_beyond + limits.backlog + RESERVED_FDS <= limits.fd_limit
    assert connection_limits(ServiceSettings(max_connections=8)).max_connections == 8


def test_metrics_count_the_connections_open_and_refused(
    guarded: tuple[str, ConnectionLimits],
) -> None:
    url, limits = guarded
    fake: FakeQueueManager = GUARDED_APPS[url].state.manager
    jobs = running_jobs(fake, 4)
    with ThreadPoolExecutor(4) as pool:
        polls = [
            pool.submit(
                httpx.get, f"{url}/v1/jobs/{j}/notice?wait=20", headers=job_headers(fake, j)
            )
            for j in jobs
        ]
        fake.wait_for_pollers(4)
        assert httpx.get(f"{url}/metrics", timeout=5).status_code == 503
        for j in jobs:
            fake.notify(j)
        assert all(p.result(timeout=20).status_code == 200 for p in polls)
    until(lambda: limits.open == 0)
    text = httpx.get(f"{url}/metrics", timeout=5).text
    assert "preemptible_api_connections_max 4.0" in text
    assert "preemptible_api_connections 1.0" in text  # this one
    assert "preemptible_api_connections_refused_total 1.0" in text


# --- the log under a storm -----------------------------------------------------------------------


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_same_error_is_logged_a_few_times_an_interval_then_counted() -> None:
    clock = Clock()
    logger = logging.getLogger("test.storm")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    lines = Lines()
    logger.addHandler(lines)
    lines.addFilter(RepeatFilter(burst=3, interval_s=60, clock=clock))
    try:
        for i in range(1000):
            logger.error("accept failed: %s", i)  # one template, a thousand times
            logger.info("an ordinary line %s", i)  # below WARNING: never held back
        logger.warning("another warning")
        assert [x for x in lines.lines if x.startswith("accept")] == [
            "accept failed: 0",
            "accept failed: 1",
            "accept failed: 2",
        ]
        assert sum(x.startswith("an ordinary") for x in lines.lines) == 1000
        assert "another warning" in lines.lines
        clock.now += 60
        logger.error("accept failed: %s", "again")
        assert lines.lines[-1] == (
            "accept failed: again [997 more like it suppressed in the last 60 s]"
        )
    finally:
        logger.removeHandler(lines)


def test_quiet_repeats_filters_every_handler_of_the_logger() -> None:
    logger = logging.getLogger("test.storm.handlers")
    first, second = Lines(), Lines()
    logger.addHandler(first)
    logger.addHandler(second)
    logger.propagate = False
    try:
        quiet_repeats(logger)
        for _ in range(100):
            logger.error("the same")
        assert len(first.lines) == len(second.lines) == 5
    finally:
        logger.removeHandler(first)
        logger.removeHandler(second)


# --- requests in flight --------------------------------------------------------------------------


def test_in_flight_lets_per_key_in_and_hands_each_slot_on_in_order() -> None:
    async def scenario() -> list[str]:
        gate, order = InFlight(2), []

        async def request(name: str, key: str, hold: asyncio.Event) -> None:
            await gate.enter(key)
            order.append(name)
            await hold.wait()
            gate.leave(key)

        holds = {name: asyncio.Event() for name in ("a1", "a2", "a3", "a4", "b1")}
        tasks = [asyncio.create_task(request(name, name[0], hold)) for name, hold in holds.items()]
        await asyncio.sleep(0.01)
        assert order == ["a1", "a2", "b1"] and gate.held("a") == 2  # a3, a4 wait their turn
        holds["a2"].set()
        await asyncio.sleep(0.01)
        assert order[-1] == "a3"
        tasks[3].cancel()  # a4 gives up waiting
        for hold in holds.values():
            hold.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert gate.held("a") == 0 and gate.held("b") == 0
        return order

    assert asyncio.run(scenario()) == ["a1", "a2", "b1", "a3"]


def test_one_callers_requests_wait_their_turn_and_the_others_go_on() -> None:
    fake, app = limited(in_flight=1)
    fake.gate = threading.Event()
    with (
        live_server(app) as url,
        ThreadPoolExecutor(3) as pool,
    ):
        calls = [
            pool.submit(httpx.get, f"{url}/v1/queues", headers=headers, timeout=30)
            for headers in (TEAM_A, TEAM_A, TEAM_B)
        ]
        until(lambda: fake.at_gate == 2)  # one of team a's, and team b's
        time.sleep(0.3)
        assert fake.at_gate == 2  # team a's second waits for its first
        fake.gate.set()
        assert [c.result(timeout=30).status_code for c in calls] == [200, 200, 200]
        assert fake.at_gate == 3
