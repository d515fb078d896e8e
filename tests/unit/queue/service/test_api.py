"""The HTTP API over real HTTP: every route, who may call it, and the one error shape.

A uvicorn server runs the app over `FakeQueueManager` on a free loopback port for the whole
module; each test makes its own jobs, so tests do not depend on one another. The schemathesis
test at the end drives the same app in-process from its OpenAPI schema.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient

from preemptible.queue.service import api
from preemptible.queue.service.app import MAX_BODY_BYTES, create_app
from preemptible.queue.service.auth import resolve_tokens
from preemptible.queue.service.http_edge import QueueManagerProtocol
from preemptible.queue.service.logs import read_log_slice
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.views import (
    CostView,
    JobView,
    QueueView,
    SignalsView,
    SubmitRequest,
)

from .fake_manager import (
    ADMIN_TOKEN,
    ENVIRON,
    TEAM_A_TOKEN,
    TEAM_B_TOKEN,
    FakeQueueManager,
    live_server,
    make_config,
)

TOKENS = resolve_tokens(make_config(), ENVIRON)
WHO = ("admin", "own", "other", "job", "other-job", "none", "bad")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ADMIN = bearer(ADMIN_TOKEN)
TEAM_A = bearer(TEAM_A_TOKEN)
TEAM_B = bearer(TEAM_B_TOKEN)


@pytest.fixture(scope="module")
def fake() -> FakeQueueManager:
    return FakeQueueManager(make_config())


@pytest.fixture(scope="module")
def app(fake: FakeQueueManager) -> FastAPI:
    return create_app(fake, tokens=TOKENS)


@pytest.fixture(scope="module")
def http(app: FastAPI) -> Iterator[httpx.Client]:
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def running_job(fake: FakeQueueManager, queue: str = "team-a", **kwargs: Any) -> JobView:
    job = fake.submit(SubmitRequest(queue=queue, command=["python", "train.py"], **kwargs))
    return fake.start(job.id, gpu_ids=[0])


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> str:
    """The response is `status` with the error shape; returns its message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"
    return str(body["error"]["message"])


# --- who may call what -------------------------------------------------------------------------

QUEUE_OR_ADMIN = {"admin": True, "own": True, "other": False, "job": False, "other-job": False}
JOB_ONLY = {"admin": False, "own": False, "other": False, "job": True, "other-job": False}
LISTING = {"admin": True, "own": True, "other": True, "job": False, "other-job": False}
"""Any queue's token or the admin's; never a job's, which acts on its own job only."""

# name: (method, path, body, success status, who may call it)
ENDPOINTS: dict[str, tuple[str, str, dict[str, Any] | None, int, dict[str, bool]]] = {
    "submit": ("POST", "/v1/jobs", {"queue": "team-a", "command": ["true"]}, 201, QUEUE_OR_ADMIN),
    "list": ("GET", "/v1/jobs", None, 200, LISTING),
    "list-queue": ("GET", "/v1/jobs?queue=team-a", None, 200, QUEUE_OR_ADMIN),
    "get": ("GET", "/v1/jobs/{id}", None, 200, QUEUE_OR_ADMIN),
    "cancel": ("DELETE", "/v1/jobs/{id}", None, 202, QUEUE_OR_ADMIN),
    # the target runs: hold and release answer 409 to whoever may ask (not 403)
    "hold": ("POST", "/v1/jobs/{id}/hold", None, 409, QUEUE_OR_ADMIN),
    "release": ("POST", "/v1/jobs/{id}/release", None, 409, QUEUE_OR_ADMIN),
    "priority": ("POST", "/v1/jobs/{id}/priority", {"tier": "high"}, 409, QUEUE_OR_ADMIN),
    "why": ("GET", "/v1/jobs/{id}/why", None, 200, QUEUE_OR_ADMIN),
    "logs": ("GET", "/v1/jobs/{id}/logs", None, 200, QUEUE_OR_ADMIN),
    "cost": ("POST", "/v1/jobs/{id}/cost", {"save_seconds_p95": 5.0}, 200, JOB_ONLY),
    "notice": ("GET", "/v1/jobs/{id}/notice?wait=0", None, 200, JOB_ONLY),
    "checkpointed": ("POST", "/v1/jobs/{id}/checkpointed", {"step": 10}, 200, JOB_ONLY),
    "progress": ("POST", "/v1/jobs/{id}/progress", {"step": 10}, 200, JOB_ONLY),
    "queues": ("GET", "/v1/queues", None, 200, LISTING),
    "stats": ("GET", "/v1/stats", None, 200, LISTING),
    "events": ("GET", "/v1/events", None, 200, LISTING),
    "events-queue": ("GET", "/v1/events?queue=team-a", None, 200, QUEUE_OR_ADMIN),
    # the dashboard's answers (dashboard_api.py)
    "dashboard": ("GET", "/v1/dashboard", None, 200, LISTING),
    "dashboard-queue": ("GET", "/v1/dashboard?queue=team-a", None, 200, QUEUE_OR_ADMIN),
    "detail": ("GET", "/v1/jobs/{id}/detail", None, 200, QUEUE_OR_ADMIN),
    "signal-history": ("GET", "/v1/signals/history", None, 200, LISTING),
}


def headers_for(who: str, fake: FakeQueueManager, target: str, sibling: str) -> dict[str, str]:
    tokens = {
        "admin": ADMIN_TOKEN,
        "own": TEAM_A_TOKEN,
        "other": TEAM_B_TOKEN,
        "job": fake.job_token(target),
        "other-job": fake.job_token(sibling),
        "bad": "not-a-token-of-this-server",
    }
    return bearer(tokens[who]) if who in tokens else {}


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_access_matrix(http: httpx.Client, fake: FakeQueueManager, endpoint: str, who: str) -> None:
    method, path, body, ok, allowed = ENDPOINTS[endpoint]
    target = running_job(fake)  # team-a's job: "own" is team-a's token, "job" this job's own
    sibling = running_job(fake)
    response = http.request(
        method,
        path.format(id=target.id),
        json=body,
        headers=headers_for(who, fake, target.id, sibling.id),
    )
    if who in ("none", "bad"):
        assert_error(response, 401, "unauthenticated")
    elif allowed[who]:
        assert response.status_code == ok, response.text
    else:
        assert_error(response, 403, "forbidden")


# Paths any caller may read, with a token or without: the dashboard's page and files, and
# what monitoring reads.
NO_TOKEN = ["/metrics", "/healthz", "/openapi.json", "/", "/static/app.js"]


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("path", NO_TOKEN)
def test_metrics_health_schema_and_the_dashboards_files_need_no_token(
    http: httpx.Client, fake: FakeQueueManager, path: str, who: str
) -> None:
    target, sibling = running_job(fake), running_job(fake)
    response = http.get(path, headers=headers_for(who, fake, target.id, sibling.id))
    assert response.status_code == 200


def test_every_route_is_in_the_access_matrix(app: FastAPI) -> None:
    """A new route cannot go untested for who may call it."""
    tested = {
        (method.lower(), path.split("?")[0].replace("{id}", "{job_id}"))
        for method, path, *_ in ENDPOINTS.values()
    } | {("get", path) for path in NO_TOKEN}
    for path, operations in app.openapi()["paths"].items():
        for method in operations:
            assert (method, path) in tested, f"{method.upper()} {path} is not in ENDPOINTS"


def test_a_queue_token_lists_only_its_own_queues_jobs_and_events(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    mine = running_job(fake, "team-a")
    theirs = running_job(fake, "team-b")
    jobs = http.get("/v1/jobs", headers=TEAM_B).json()
    assert {j["queue"] for j in jobs} == {"team-b"}
    assert theirs.id in {j["id"] for j in jobs} and mine.id not in {j["id"] for j in jobs}
    events = http.get("/v1/events", headers=TEAM_B).json()
    assert events and {e["queue"] for e in events} == {"team-b"}
    message = assert_error(http.get("/v1/events?queue=team-a", headers=TEAM_B), 403)
    assert "team-a" in message


@pytest.mark.parametrize(
    "path",
    ["/v1/queues", "/v1/stats", "/v1/signals/history", "/v1/dashboard", "/v1/jobs", "/v1/events"],
)
def test_a_job_token_acts_on_its_own_job_only(
    http: httpx.Client, fake: FakeQueueManager, path: str
) -> None:
    job = running_job(fake)
    message = assert_error(http.get(path, headers=job_headers(fake, job)), 403, "forbidden")
    assert f"job {job.id!r}" in message and "its own job only" in message


def test_a_job_token_expires_when_its_job_has_finished(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = running_job(fake)
    headers = job_headers(fake, job)
    assert http.get(f"/v1/jobs/{job.id}/notice", headers=headers).status_code == 200
    fake.finish(job.id)
    for method, path, body in (
        ("GET", "notice", None),
        ("POST", "cost", {"save_seconds_p95": 1.0}),
        ("POST", "checkpointed", {"step": 1}),
        ("POST", "progress", {"step": 1}),
    ):
        response = http.request(method, f"/v1/jobs/{job.id}/{path}", json=body, headers=headers)
        message = assert_error(response, 401, "unauthenticated")
        assert message.startswith("this job has finished; its token expired"), message


def test_a_queue_token_cannot_submit_to_another_queue(http: httpx.Client) -> None:
    response = http.post("/v1/jobs", json={"queue": "team-a", "command": ["x"]}, headers=TEAM_B)
    assert "team-a" in assert_error(response, 403, "forbidden")


def test_a_job_may_wait_only_for_jobs_its_submitter_may_see(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    theirs = fake.submit(SubmitRequest(queue="team-b", command=["x"]))
    mine = fake.submit(SubmitRequest(queue="team-a", command=["x"]))
    body = {"queue": "team-a", "command": ["x"], "after": [f"{theirs.id}:ok"]}
    assert "team-b" in assert_error(http.post("/v1/jobs", json=body, headers=TEAM_A), 403)
    body["after"] = ["nope"]
    assert_error(http.post("/v1/jobs", json=body, headers=TEAM_A), 404, "not_found")
    for bad in (["j1:maybe"], ["j 1"], [f"{mine.id}:"], [mine.id] * 65):
        body["after"] = bad
        assert_error(http.post("/v1/jobs", json=body, headers=TEAM_A), 422)
    body["after"] = [mine.id, f"{mine.id}:started"]
    assert http.post("/v1/jobs", json=body, headers=TEAM_A).status_code == 201
    assert fake.submissions[-1].after == [mine.id, f"{mine.id}:started"]
    body["after"] = [f"{theirs.id}:any"]
    assert http.post("/v1/jobs", json=body, headers=ADMIN).status_code == 201


def test_an_unknown_job_is_404_for_the_admin_and_for_a_queue(http: httpx.Client) -> None:
    for headers in (ADMIN, TEAM_A):
        for path in ("/v1/jobs/nope", "/v1/jobs/nope/why", "/v1/jobs/nope/logs"):
            assert_error(http.get(path, headers=headers), 404, "not_found")
        assert_error(http.delete("/v1/jobs/nope", headers=headers), 404)


# --- happy paths -------------------------------------------------------------------------------


def test_submit_returns_201_with_the_job_and_passes_every_field_on(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    body = {
        "queue": "team-a",
        "command": ["python", "train.py", "--lr", "3e-4"],
        "gpus": 2,
        "tier": "high",
        "cpus": 8,
        "memory_gb": 64.5,
        "gang": True,
        "estimate_s": 7200,
        "name": "exp1",
        "env": {"WANDB_MODE": "offline"},
        "cwd": "/tmp",
    }
    response = http.post("/v1/jobs", json=body, headers=TEAM_A)
    assert response.status_code == 201, response.text
    job = response.json()
    assert set(job) == {f.name for f in dataclasses.fields(JobView)}
    assert job["queue"] == "team-a" and job["state"] == "pending" and job["name"] == "exp1"
    assert job["gpus"] == 2 and job["tier"] == "high" and job["command"] == body["command"]
    assert fake.get_job(job["id"]).cpus == 8.0


def test_submit_defaults_match_the_contract(http: httpx.Client) -> None:
    job = http.post("/v1/jobs", json={"queue": "team-a", "command": ["a.sh"]}, headers=ADMIN)
    assert job.status_code == 201
    assert job.json()["tier"] == "normal" and job.json()["gpus"] == 0


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"queue": "nope", "command": ["x"]}, "no queue named 'nope'"),
        ({"queue": "team-a", "command": ["x"], "gpus": 9}, "9 GPUs"),
        ({"queue": "team-a", "command": [""]}, "command is empty"),
    ],
    ids=["unknown-queue", "more-gpus-than-the-machine", "empty-program"],
)
def test_impossible_requests_are_400_with_the_managers_words(
    http: httpx.Client, body: Any, words: str
) -> None:
    assert words in assert_error(http.post("/v1/jobs", json=body, headers=ADMIN), 400)


def test_list_filters_by_state(http: httpx.Client, fake: FakeQueueManager) -> None:
    job = running_job(fake)
    fake.finish(job.id, exit_code=1)
    failed = http.get("/v1/jobs", params={"state": "failed"}, headers=ADMIN).json()
    assert job.id in {j["id"] for j in failed} and {j["state"] for j in failed} == {"failed"}
    assert_error(http.get("/v1/jobs", params={"state": "lost"}, headers=ADMIN), 422)


def pages(http: httpx.Client, path: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of a listing, following each answer's `Link: <...>; rel="next"`."""
    found = []
    response = http.get(path, params=params, headers=ADMIN)
    while True:
        assert response.status_code == 200, response.text
        found.append(response.json())
        if "next" not in response.links:
            return found
        response = http.get(response.links["next"]["url"], headers=ADMIN)


def test_jobs_come_a_page_at_a_time_oldest_first(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    ours = [fake.submit(SubmitRequest(queue="team-b", command=["x"])).id for _ in range(1100)]
    listed = pages(http, "/v1/jobs", queue="team-b")
    assert [len(page) for page in listed[:2]] == [api.DEFAULT_PAGE] * 2  # the default page
    ids = [j["id"] for page in listed for j in page]
    assert len(ids) == len(set(ids)) and ids[-len(ours) :] == ours  # each once, in order
    assert [len(p) for p in pages(http, "/v1/jobs", queue="team-b", limit=1000)][:1] == [1000]
    assert_error(http.get("/v1/jobs", params={"limit": 1001}, headers=ADMIN), 422)
    mine = pages(http, "/v1/jobs", queue="team-b", after=ours[-3])
    assert [j["id"] for page in mine for j in page] == ours[-2:]
    assert "j-none" in assert_error(http.get("/v1/jobs?after=j-none", headers=ADMIN), 400)


def test_events_come_a_page_at_a_time(http: httpx.Client, fake: FakeQueueManager) -> None:
    for _ in range(api.DEFAULT_PAGE + 10):
        fake.submit(SubmitRequest(queue="team-b", command=["x"]))
    listed = pages(http, "/v1/events", queue="team-b")
    assert len(listed[0]) == api.DEFAULT_PAGE and len(listed) >= 2
    ids = [e["id"] for page in listed for e in page]
    assert ids == sorted(set(ids)) and len(ids) == len(fake.events(queue="team-b", limit=10**9))
    assert_error(http.get("/v1/events", params={"limit": api.MAX_PAGE + 1}, headers=ADMIN), 422)


def test_get_shows_the_job(http: httpx.Client, fake: FakeQueueManager) -> None:
    job = running_job(fake, gpus=1)
    got = http.get(f"/v1/jobs/{job.id}", headers=TEAM_A).json()
    assert got["id"] == job.id and got["state"] == "running" and got["gpu_ids"] == [0]
    assert got["attempts"] == 1 and got["cost"]["save_seconds_p95"] is None


def test_cancel_is_202_then_409_once_finished(http: httpx.Client, fake: FakeQueueManager) -> None:
    job = running_job(fake)
    response = http.delete(f"/v1/jobs/{job.id}", headers=TEAM_A)
    assert response.status_code == 202 and response.json()["state"] == "cancelled"
    assert "cancelled" in assert_error(http.delete(f"/v1/jobs/{job.id}", headers=TEAM_A), 409)


def test_why_gives_the_reason_and_history_newest_first(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = running_job(fake)
    why = http.get(f"/v1/jobs/{job.id}/why", headers=TEAM_A).json()
    assert why["state"] == "running" and why["reason"]
    assert [e["kind"] for e in why["history"]] == ["admitted", "submitted"]


def test_cost_reports_reach_the_manager_without_an_observed_exit(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = running_job(fake)
    cost_file = {
        "save_seconds_p95": 40.0,
        "stall_seconds_p95": 0.5,
        "restore_seconds": 12.0,
        "bytes": 1 << 30,
        "last_checkpoint_step": 500,
        "last_checkpoint_time": 1.7e9,
        "samples": 12,  # the cost file's other fields are ignored
        "updated_at": 1.7e9,
        "observed_exit_seconds": 1.0,  # a job cannot claim what the manager observed
    }
    response = http.post(f"/v1/jobs/{job.id}/cost", json=cost_file, headers=job_headers(fake, job))
    assert response.json() == {"grace_s": 70.0, "min_runtime_s": 300.0,
                               "checkpoint_interval_hint_s": None}  # fmt: skip
    job_id, cost = fake.cost_reports[-1]
    assert job_id == job.id and cost.bytes == 1 << 30 and cost.last_checkpoint_step == 500
    assert cost.observed_exit_seconds is None


def job_headers(fake: FakeQueueManager, job: JobView) -> dict[str, str]:
    return bearer(fake.job_token(job.id))


def test_checkpointed_of_a_job_that_is_not_running_is_409(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = fake.submit(SubmitRequest(queue="team-a", command=["x"]))  # pending: no process
    headers = job_headers(fake, job)
    response = http.post(f"/v1/jobs/{job.id}/checkpointed", json={"step": 1}, headers=headers)
    assert_error(response, 409, "conflict")


def test_notice_is_null_without_one(http: httpx.Client, fake: FakeQueueManager) -> None:
    job = running_job(fake)
    got = http.get(f"/v1/jobs/{job.id}/notice", headers=job_headers(fake, job))
    assert got.json() == {"notice": None}


def test_a_notice_long_poll_returns_as_soon_as_the_notice_is_sent(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = running_job(fake)
    before = len(fake.notice_waits)
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        poll = pool.submit(
            http.get, f"/v1/jobs/{job.id}/notice?wait=30", headers=job_headers(fake, job)
        )
        fake.wait_for_pollers(before + 1)
        fake.notify(job.id, reason="preempted by j9 (tier high)", grace_s=45.0)
        answer = poll.result(timeout=30).json()["notice"]
    assert time.monotonic() - started < 25
    assert answer["reason"] == "preempted by j9 (tier high)" and answer["grace_s"] == 45.0
    assert answer["deadline"] > time.time()


def test_a_notice_wait_is_capped_at_60_seconds(http: httpx.Client, fake: FakeQueueManager) -> None:
    job = running_job(fake)
    fake.notify(job.id)  # so the poll returns at once
    http.get(f"/v1/jobs/{job.id}/notice", params={"wait": 3600}, headers=job_headers(fake, job))
    assert fake.notice_waits[-1] == (job.id, api.MAX_NOTICE_WAIT_S)


def test_waiting_pollers_do_not_starve_the_other_routes(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    pollers = 48  # more than the default thread pool of 40
    jobs = [running_job(fake) for _ in range(pollers)]
    before = len(fake.notice_waits)
    limits = httpx.Limits(max_connections=pollers + 8)
    with (
        httpx.Client(base_url=str(http.base_url), timeout=60, limits=limits) as client,
        ThreadPoolExecutor(pollers) as pool,
    ):
        polls = [
            pool.submit(client.get, f"/v1/jobs/{j.id}/notice?wait=50", headers=job_headers(fake, j))
            for j in jobs
        ]
        fake.wait_for_pollers(before + pollers)
        assert client.get("/v1/stats", headers=ADMIN, timeout=10).status_code == 200
        assert client.get(f"/v1/jobs/{jobs[0].id}", headers=ADMIN, timeout=10).status_code == 200
        for j in jobs:
            fake.notify(j.id)
        assert all(p.result(timeout=30).json()["notice"] for p in polls)


def test_progress_beats_reach_the_manager_and_a_pending_job_gets_409(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = running_job(fake)
    headers = job_headers(fake, job)
    body = {"step": 7, "step_seconds": 0.25}
    assert http.post(f"/v1/jobs/{job.id}/progress", json=body, headers=headers).json()["ok"]
    http.post(f"/v1/jobs/{job.id}/progress", json={"step": 8}, headers=headers)
    assert fake.beats[-2:] == [(job.id, 7, 0.25), (job.id, 8, None)]
    pending = fake.submit(SubmitRequest(queue="team-a", command=["x"]))
    late = http.post(
        f"/v1/jobs/{pending.id}/progress", json={"step": 1}, headers=job_headers(fake, pending)
    )
    assert_error(late, 409, "conflict")


def test_checkpointed_reaches_the_manager(http: httpx.Client, fake: FakeQueueManager) -> None:
    job = running_job(fake)
    headers = job_headers(fake, job)
    body = {"step": 7, "at": 5.0}
    response = http.post(f"/v1/jobs/{job.id}/checkpointed", json=body, headers=headers)
    assert response.json() == {"ok": True}
    http.post(f"/v1/jobs/{job.id}/checkpointed", json={"step": 8}, headers=headers)
    assert fake.checkpoints[-2:] == [(job.id, 7, 5.0), (job.id, 8, None)]


def test_logs_are_read_in_slices_from_an_offset(http: httpx.Client, fake: FakeQueueManager) -> None:
    job = running_job(fake)
    fake.write_log(job.id, "epoch 1\n")
    first = http.get(f"/v1/jobs/{job.id}/logs", headers=TEAM_A).json()
    assert first["text"] == "epoch 1\n" and first["next_offset"] == 8
    assert first["state"] == "running"
    fake.write_log(job.id, "epoch 2 ✓\n")
    params = {"offset": first["next_offset"]}
    second = http.get(f"/v1/jobs/{job.id}/logs", params=params, headers=TEAM_A).json()
    assert second["text"] == "epoch 2 ✓\n" and second["offset"] == 8
    assert second["next_offset"] == second["size"] == 8 + len("epoch 2 ✓\n".encode())
    params = {"offset": second["next_offset"]}
    third = http.get(f"/v1/jobs/{job.id}/logs", params=params, headers=TEAM_A).json()
    assert third["text"] == "" and third["next_offset"] == second["next_offset"]


def test_logs_of_a_job_that_never_started_are_empty_and_a_missing_attempt_is_404(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = fake.submit(SubmitRequest(queue="team-a", command=["x"]))
    empty = http.get(f"/v1/jobs/{job.id}/logs", headers=TEAM_A).json()
    assert empty["text"] == "" and empty["state"] == "pending"
    response = http.get(f"/v1/jobs/{job.id}/logs", params={"attempt": 3}, headers=TEAM_A)
    assert "attempt 3" in assert_error(response, 404)


def test_a_started_attempt_without_output_yet_reads_empty(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = running_job(fake)
    chunk = http.get(f"/v1/jobs/{job.id}/logs", params={"attempt": 1}, headers=TEAM_A).json()
    assert chunk["text"] == "" and chunk["size"] == 0 and chunk["attempt"] == 1


def test_a_log_slice_never_cuts_a_character(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes("aé€😀z".encode())  # 1 + 2 + 3 + 4 + 1 bytes
    text, offset, size = "", 0, 0
    for limit in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11):
        chunk, _, size = read_log_slice(path, 0, limit)
        assert chunk == "aé€😀z"[: len(chunk)]  # a prefix, whole characters only
    while offset < size or not text:
        chunk, offset, size = read_log_slice(path, offset, 4)
        text += chunk
    assert text == "aé€😀z"
    assert read_log_slice(tmp_path / "missing", 5, 10) == ("", 5, 0)


def test_queues_and_stats(http: httpx.Client, fake: FakeQueueManager) -> None:
    queues = http.get("/v1/queues", headers=TEAM_B).json()
    assert [q["name"] for q in queues] == ["team-a", "team-b"]
    assert set(queues[0]) == {f.name for f in dataclasses.fields(QueueView)}
    stats = http.get("/v1/stats", headers=TEAM_A).json()
    assert set(stats["queues"]) == {"team-a", "team-b"}
    assert set(stats["overall"]) == {f.name for f in dataclasses.fields(SignalsView)}
    assert stats["queues"]["team-b"]["p95_wait_s"] == 120.0


def test_signal_history_is_the_managers_samples_after_since(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    samples = http.get("/v1/signals/history", headers=TEAM_A).json()
    assert [set(s) for s in samples] == [{"at", "stats"}] * 2
    assert samples[1]["stats"]["queues"]["team-b"]["p95_wait_s"] == 120.0
    since = {"since": samples[1]["at"] - 1.0}
    assert len(http.get("/v1/signals/history", params=since, headers=TEAM_B).json()) == 1


def test_events_since_an_id(http: httpx.Client, fake: FakeQueueManager) -> None:
    job = running_job(fake)
    mine = http.get("/v1/events", params={"job_id": job.id}, headers=ADMIN).json()
    assert [e["kind"] for e in mine] == ["submitted", "admitted"]
    later = http.get("/v1/events", params={"since": mine[0]["id"], "job_id": job.id}, headers=ADMIN)
    assert [e["id"] for e in later.json()] == [mine[1]["id"]]
    assert len(http.get("/v1/events", params={"limit": 1}, headers=ADMIN).json()) == 1


def test_metrics_export_the_managers_numbers_and_the_api_latency(
    http: httpx.Client, fake: FakeQueueManager
) -> None:
    job = running_job(fake)
    http.get(f"/v1/jobs/{job.id}", headers=ADMIN)
    response = http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for line in (
        'preemptible_queue_admissions_total{queue="team-a"} 3.0',
        'preemptible_queue_preemptions_total{queue="team-b",reason="tier"} 2.0',
        'preemptible_queue_cycle_seconds{quantile="0.5"} 0.002',
        'preemptible_queue_cycle_duration_seconds_bucket{le="0.001"} 1.0',
        'preemptible_queue_cycle_duration_seconds_bucket{le="0.005"} 4.0',
        'preemptible_queue_cycle_duration_seconds_bucket{le="0.25"} 4.0',
        'preemptible_queue_cycle_duration_seconds_bucket{le="+Inf"} 5.0',
        "preemptible_queue_cycle_duration_seconds_count 5.0",
        "preemptible_queue_cycle_duration_seconds_sum 0.31",
        'preemptible_queue_wait_p95_seconds{queue="team-b",scope="queue"} 120.0',
        'preemptible_queue_utilization_ratio{queue="",scope="overall"} 0.75',
        "preemptible_queue_max_wait_least_served_seconds 120.0",
    ):
        assert line in text, line
    assert 'preemptible_queue_depth{queue="team-a"}' in text
    latency = [ln for ln in text.splitlines() if ln.startswith("preemptible_api_request_duration")]
    assert any('route="/v1/jobs/{job_id}"' in ln and 'status="200"' in ln for ln in latency)
    assert not any(job.id in ln for ln in latency)  # templates, never raw paths


def test_healthz(http: httpx.Client) -> None:
    assert http.get("/healthz").json()["status"] == "ok"


# --- malformed requests: 4xx, always the error shape -------------------------------------------

GOOD = {"queue": "team-a", "command": ["python", "x.py"]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**GOOD, "gpus": "two"}, "gpus"),
        ({**GOOD, "gpus": 1.5}, "gpus"),
        ({**GOOD, "gpus": -1}, "gpus"),
        ({**GOOD, "gpus": 1025}, "gpus"),
        ({**GOOD, "gpus": True}, "gpus"),
        ({**GOOD, "tier": "urgent"}, "tier"),
        ({"queue": "team-a"}, "command"),
        ({"command": ["x"]}, "queue"),
        ({**GOOD, "command": []}, "command"),
        ({**GOOD, "command": "python x.py"}, "command"),
        ({**GOOD, "command": ["x"] * 257}, "command"),
        ({**GOOD, "command": ["x" * 4097]}, "command"),
        ({**GOOD, "command": ["a\x00b"]}, "command"),
        ({**GOOD, "estimate_s": 0}, "estimate_s"),
        ({**GOOD, "estimate_s": -5}, "estimate_s"),
        ({**GOOD, "name": "n" * 201}, "name"),
        ({**GOOD, "env": {"1BAD": "x"}}, "env"),
        ({**GOOD, "env": {f"K{i}": "v" for i in range(129)}}, "env"),
        ({**GOOD, "gang": "yes"}, "gang"),
        ({**GOOD, "cpus": -1}, "cpus"),
        ({**GOOD, "gpu": 2}, "gpu"),
        ([GOOD], "body"),
        ("just a string", "body"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_malformed_submit_is_422_naming_the_field(
    http: httpx.Client, body: Any, field: str
) -> None:
    response = http.post("/v1/jobs", json=body, headers=ADMIN)
    assert field in assert_error(response, 422, "invalid_request")


@pytest.mark.parametrize(
    "raw",
    [b"{nope", b"", b'{"queue": "team-a", "command": ["x"], "gpus": NaN}', b'"\xe9"', b"\xff"],
    ids=["broken-json", "empty", "nan", "latin-1", "not-utf8"],
)
def test_a_body_that_is_not_json_is_422(http: httpx.Client, raw: bytes) -> None:
    headers = {**ADMIN, "content-type": "application/json"}
    assert_error(http.post("/v1/jobs", content=raw, headers=headers), 422)


def test_a_huge_body_is_413_declared_or_streamed(http: httpx.Client) -> None:
    huge = json.dumps({**GOOD, "name": "x" * (MAX_BODY_BYTES + 1)}).encode()
    headers = {**ADMIN, "content-type": "application/json"}
    assert_error(http.post("/v1/jobs", content=huge, headers=headers), 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        for i in range(0, len(huge), 8192):
            yield huge[i : i + 8192]

    assert_error(http.post("/v1/jobs", content=chunks(), headers=headers), 413)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("cost", {"save_seconds_p95": -1}),
        ("cost", {"bytes": "many"}),
        ("cost", {"restore_seconds": "Infinity"}),
        ("cost", {"save_seconds_p95": 1.5e308}),  # a minimum runtime no float holds
        ("cost", {"last_checkpoint_step": 2**53}),
        ("checkpointed", {}),
        ("checkpointed", {"step": -1}),
        ("checkpointed", {"step": "ten"}),
        ("checkpointed", {"step": 1, "extra": 2}),
        ("progress", {}),
        ("progress", {"step": -1}),
        ("progress", {"step": 1, "step_seconds": -0.5}),
        ("progress", {"step": 1, "step_seconds": "NaN"}),
    ],
)
def test_malformed_job_reports_are_422(
    http: httpx.Client, fake: FakeQueueManager, path: str, body: Any
) -> None:
    job = running_job(fake)
    response = http.post(f"/v1/jobs/{job.id}/{path}", json=body, headers=job_headers(fake, job))
    assert_error(response, 422)


@pytest.mark.parametrize(
    "query",
    [
        "/v1/jobs/{id}/notice?wait=-1",
        "/v1/jobs/{id}/notice?wait=soon",
        "/v1/jobs/{id}/notice?wait=nan",
        "/v1/events?since=-3",
        "/v1/events?since=99999999999999999999",  # beyond SQLite's integers
        "/v1/jobs/{id}/logs?offset=99999999999999999999",
        "/v1/events?limit=0",
        "/v1/jobs/{id}/logs?offset=-1",
        "/v1/jobs/{id}/logs?attempt=0",
    ],
)
def test_malformed_query_parameters_are_422_naming_them(
    http: httpx.Client, fake: FakeQueueManager, query: str
) -> None:
    job = running_job(fake)
    headers = job_headers(fake, job) if "notice" in query else ADMIN
    response = http.get(query.format(id=job.id), headers=headers)
    name = query.split("?")[1].split("=")[0]
    assert name in assert_error(response, 422)


def test_unknown_routes_and_methods_answer_in_the_error_shape(http: httpx.Client) -> None:
    assert_error(http.get("/v1/nothing", headers=ADMIN), 404, "not_found")
    response = http.patch("/v1/jobs", headers=ADMIN)
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["allow"]


# --- failures inside the server ----------------------------------------------------------------


def test_a_manager_bug_is_a_logged_500_in_the_error_shape_without_tokens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeQueueManager(make_config())
    job = running_job(fake)
    job_token = fake.job_token(job.id)
    client = TestClient(create_app(fake, tokens=TOKENS), raise_server_exceptions=False)
    caplog.set_level(logging.DEBUG)
    fake.fail_with = RuntimeError("the store went away")
    for headers in (ADMIN, TEAM_A, bearer(job_token)):
        response = client.get("/v1/stats", headers=headers)
        assert response.status_code == 500 and response.json()["error"]["code"] == "internal"
    assert "the store went away" in caplog.text
    client.get("/v1/stats", headers=bearer("wrong-token-abcdef"))
    for token in (ADMIN_TOKEN, TEAM_A_TOKEN, job_token, "wrong-token-abcdef"):
        assert token not in caplog.text


def test_a_missing_token_variable_stops_create_app() -> None:
    from preemptible.errors import ConfigError

    with pytest.raises(ConfigError, match="TEAM_A_TOKEN"):
        create_app(FakeQueueManager(make_config()), environ={})


def test_create_app_reads_the_tokens_from_the_environment() -> None:
    client = TestClient(create_app(FakeQueueManager(make_config()), environ=ENVIRON))
    assert client.get("/v1/queues", headers=TEAM_A).status_code == 200
    assert client.get("/v1/queues", headers=ADMIN).status_code == 200
    config = dataclasses.replace(make_config(), admin_token=None)
    client = TestClient(create_app(FakeQueueManager(config), environ=ENVIRON))
    assert client.get("/v1/queues", headers=ADMIN).status_code == 401  # no admin configured


def the_real_manager_fits_the_protocol(manager: QueueManager) -> QueueManagerProtocol:
    return manager  # mypy --strict checks this file: the real manager against the protocol


def test_the_real_manager_has_the_protocols_methods_and_parameters() -> None:
    for name, member in vars(QueueManagerProtocol).items():
        if name.startswith("_") or not callable(member):
            continue
        real = inspect.signature(getattr(QueueManager, name))
        assert list(real.parameters) == list(inspect.signature(member).parameters), name


def test_the_service_modules_import_no_private_names_of_one_another() -> None:
    """What api.py and dashboard_api.py share (access.py, error_responses...) is public."""
    found = []
    for path in Path(api.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("preemptible"):
                names = [a.name for a in node.names if not a.name.startswith("__")]
                private = [name for name in names if name.startswith("_")]  # not __version__
                found += [f"{path.name}: {node.module}.{name}" for name in private]
    assert found == []


# --- the answers are the views; the request bodies carry the views' fields ---------------------


def test_the_submit_body_has_the_fields_of_the_submit_request() -> None:
    fields = {f.name for f in dataclasses.fields(SubmitRequest)}
    assert set(api.SubmitBody.model_fields) == fields


def test_the_cost_body_is_the_cost_view_without_what_the_manager_observes() -> None:
    fields = {f.name for f in dataclasses.fields(CostView)} - {"observed_exit_seconds"}
    assert set(api.CostBody.model_fields) == fields


def test_the_schema_documents_the_errors_of_every_route(app: FastAPI) -> None:
    schema = app.openapi()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            if path.startswith("/v1/") or path == "/metrics":
                assert "429" in codes, (method, path)  # every caller has a rate limit
            assert "503" in codes, (method, path)  # the server may have its most connections
            if path.startswith("/v1/"):
                assert {"401", "403"} <= codes, (method, path)
                assert operation["security"] == [{"HTTPBearer": []}]
            if "{job_id}" in path:
                assert "404" in codes, (method, path)
            if method in ("post", "delete") and path.startswith("/v1/"):
                assert "422" in codes or method == "delete", (method, path)
            for code in codes - {"200", "201", "202"}:
                ref = operation["responses"][code]["content"]["application/json"]["schema"]
                assert ref == {"$ref": "#/components/schemas/ErrorAnswer"}, (method, path, code)


# --- schemathesis: the schema against the app, as admin ----------------------------------------

# Rate limits are tested in test_limits.py; here they would only cut the cases short (429).
_unlimited = dataclasses.replace(make_config().service, rate_per_s=1e6, burst=1_000_000)
_schema_fake = FakeQueueManager(dataclasses.replace(make_config(), service=_unlimited))
for _i in range(3):
    running_job(_schema_fake, ("team-a", "team-b")[_i % 2])
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_schema_fake, tokens=TOKENS))
schema.config.update(headers=ADMIN)
# Unknown query parameters are ignored, as HTTP APIs do; schemathesis would call that a failure.
schema.config.generation.update(max_examples=30, allow_extra_parameters=False)
# A schema-valid submission may still name a queue or GPU count this machine lacks (400).
schema.config.checks.positive_data_acceptance.expected_statuses = [
    "2xx", "400", "401", "403", "404", "409",
]  # fmt: skip


# A schema-violating body can also be too large to read (413) before it is found invalid.
schema.config.checks.negative_data_rejection.expected_statuses = [
    "400", "401", "403", "404", "405", "413", "422",
]  # fmt: skip


@schema.parametrize()
def test_the_api_conforms_to_its_schema(case: schemathesis.Case[Any]) -> None:
    case.call_and_validate()
