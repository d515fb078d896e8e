"""The job's link to the queue manager, against a real HTTP server that misbehaves on demand.

The server is `http.server` on a loopback port: each test says what it answers (the manager's
real shapes, garbage, errors, silence), and the link must never raise, never slow the caller,
log a failure once, and keep its last good terms.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from preemptible import Checkpointer, Context
from preemptible.checkpoint.stats import CostTracker
from preemptible.runtime import queue_link
from preemptible.runtime.queue_link import NoticeKind, QueueLink, QueueNotice, Terms
from tests.polling import wait_until

TOKEN = "job-secret-token"
TERMS = {"grace_s": 40.0, "min_runtime_s": 300.0, "checkpoint_interval_hint_s": 900.0}
Answer = Callable[[str, str, Any], tuple[int, bytes]]


class Manager:
    """What the fake manager answers, and what it was asked."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any, str]] = []
        self.answer: Answer = lambda method, path, body: (200, json.dumps(TERMS).encode())
        self.notice: dict[str, Any] | None = None
        self.notice_set = threading.Event()
        self.stall = threading.Event()  # set: the server never answers until cleared


@pytest.fixture
def manager() -> Iterator[tuple[Manager, str]]:
    state = Manager()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            state.requests.append((method, self.path, body, self.headers["Authorization"]))
            while state.stall.is_set():
                time.sleep(0.02)
            if self.path.split("?")[0].endswith("/notice"):
                state.notice_set.wait(timeout=1.0)
                status, payload = 200, json.dumps({"notice": state.notice}).encode()
            else:
                status, payload = state.answer(method, self.path, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    state.stall.clear()
    state.notice_set.set()
    server.shutdown()
    server.server_close()


def cost(save_s: float = 2.0, step: int = 10):
    tracker = CostTracker()
    tracker.record_stall(0.1)
    tracker.record_save(step=step, persist_seconds=save_s, nbytes=1000, at=time.time())
    return tracker.snapshot()


def link_to(url: str, **options: Any) -> QueueLink:
    options.setdefault("min_interval_s", 0.0)
    return QueueLink(url, "j7", TOKEN, **options)


def test_without_the_managers_variables_there_is_no_link(caplog) -> None:
    assert QueueLink.from_env({}) is None
    with caplog.at_level(logging.WARNING, "preemptible"):
        assert QueueLink.from_env({"PREEMPTIBLE_QUEUE_URL": "http://127.0.0.1:1"}) is None
    assert "PREEMPTIBLE_JOB_ID and PREEMPTIBLE_TOKEN" in caplog.text
    env = {
        "PREEMPTIBLE_QUEUE_URL": "http://127.0.0.1:1",
        "PREEMPTIBLE_JOB_ID": "j1",
        "PREEMPTIBLE_TOKEN": "t",
    }
    link = QueueLink.from_env(env)
    assert link is not None and link.job_id == "j1"
    link.close()


def test_a_report_is_answered_with_terms_and_carries_the_measured_cost(manager) -> None:
    state, url = manager
    got: list[Terms] = []
    link = link_to(url)
    link.start(on_notice=lambda n: None, on_terms=got.append)
    link.report(cost(save_s=2.5, step=12))
    wait_until(lambda: got, "the terms", timeout=10)
    assert got[0] == Terms(grace_s=40.0, min_runtime_s=300.0, interval_hint_s=900.0)
    assert link.terms == got[0]
    method, path, body, auth = next(r for r in state.requests if r[1].endswith("/cost"))
    assert (method, path, auth) == ("POST", "/v1/jobs/j7/cost", f"Bearer {TOKEN}")
    assert body["save_seconds_p95"] == 2.5 and body["last_checkpoint_step"] == 12
    link.close()


def test_reports_are_rate_limited_and_the_newest_one_is_sent(manager) -> None:
    state, url = manager
    link = link_to(url, min_interval_s=0.5)
    link.start(on_notice=lambda n: None)
    for step in range(1, 6):
        link.report(cost(step=step))
    wait_until(lambda: link.terms, "the terms", timeout=10)
    time.sleep(0.8)
    steps = [r[2]["last_checkpoint_step"] for r in state.requests if r[1].endswith("/cost")]
    assert steps[-1] == 5 and len(steps) <= 2  # the first report, perhaps, then the newest
    link.close()


def test_a_notice_reaches_the_job_with_its_deadline(manager) -> None:
    state, url = manager
    notices: list[QueueNotice] = []
    link = link_to(url)
    link.start(on_notice=notices.append)
    time.sleep(0.1)
    assert notices == []
    state.notice = {"reason": "reclaimed for j9", "grace_s": 30.0, "deadline": 1234.5}
    state.notice_set.set()
    wait_until(lambda: notices, "the notice", timeout=10)
    assert notices == [QueueNotice(reason="reclaimed for j9", grace_s=30.0, deadline=1234.5)]
    path = next(r[1] for r in state.requests if "/notice" in r[1])
    assert path.startswith("/v1/jobs/j7/notice?wait=")
    link.close()


def test_a_resize_notice_reaches_the_job_with_its_size_and_a_grace_from_its_deadline(
    manager,
) -> None:
    state, url = manager
    notices: list[QueueNotice] = []
    link = link_to(url)
    link.start(on_notice=notices.append)
    deadline = time.time() + 45
    state.notice = {"kind": "resize", "gpus": 2, "deadline": deadline}
    state.notice_set.set()
    wait_until(lambda: notices, "the notice", timeout=10)
    (notice,) = notices
    assert (notice.kind, notice.gpus, notice.deadline) == (NoticeKind.RESIZE, 2, deadline)
    assert notice.reason == "resize to 2 GPUs" and 40 < notice.grace_s <= 45
    link.close()


@pytest.mark.parametrize(
    "notice",
    [
        {"kind": "migrate", "node": "n3", "deadline": 1234.5},
        {"kind": "resize", "gpus": 0, "deadline": 1234.5},
        {"kind": "resize", "gpus": "2", "deadline": 1234.5},
        {"kind": "resize", "deadline": 1234.5},
    ],
    ids=["unknown-kind", "zero-gpus", "gpus-as-text", "no-gpus"],
)
def test_a_notice_the_sdk_cannot_act_on_exactly_is_a_preemption_warned_once(
    manager, caplog, notice, monkeypatch
) -> None:
    monkeypatch.setattr(queue_link, "_warned_kinds", set())
    state, url = manager
    notices: list[QueueNotice] = []
    with caplog.at_level(logging.WARNING, "preemptible"):
        for _ in range(2):  # two attempts of the job in one process: one warning
            link = link_to(url)
            link.start(on_notice=notices.append)
            state.notice = notice
            state.notice_set.set()
            wait_until(lambda: notices, "the notice", timeout=10)
            link.close()
    assert all(n.kind is NoticeKind.PREEMPT and n.gpus is None for n in notices)
    assert notices[0].deadline == 1234.5 and "handled as a preemption" in notices[0].reason
    warned = [r for r in caplog.records if "handling it as a preemption" in r.getMessage()]
    assert len(warned) == 1, caplog.text


def test_the_ack_posts_the_committed_step(manager) -> None:
    state, url = manager
    link = link_to(url)
    assert link.ack(41, at=99.0) is True
    assert state.requests[-1][:3] == ("POST", "/v1/jobs/j7/checkpointed", {"step": 41, "at": 99.0})
    link.close()


def test_the_ack_of_a_resize_says_so_and_names_the_size(manager) -> None:
    state, url = manager
    link = link_to(url)
    assert link.ack(41, at=99.0, resize_to=2) is True
    body = {"step": 41, "at": 99.0, "kind": "resize", "gpus": 2}
    assert state.requests[-1][:3] == ("POST", "/v1/jobs/j7/checkpointed", body)
    link.close()


@pytest.mark.parametrize(
    "answer",
    [
        lambda m, p, b: (500, b'{"error": {"code": "internal", "message": "boom"}}'),
        lambda m, p, b: (200, b"<html>not json</html>"),
        lambda m, p, b: (200, b'{"grace_s": "long"}'),
        lambda m, p, b: (200, b"[1, 2, 3]"),
        lambda m, p, b: (200, b'{"grace_s": -5, "min_runtime_s": 1}'),
    ],
    ids=["500", "html", "wrong-type", "not-an-object", "negative"],
)
def test_garbage_keeps_the_last_terms_and_is_logged_once(manager, caplog, answer) -> None:
    state, url = manager
    link = link_to(url)
    link.start(on_notice=lambda n: None)
    link.report(cost())
    good = wait_until(lambda: link.terms, "the terms", timeout=10)
    state.answer = answer
    with caplog.at_level(logging.INFO, "preemptible"):
        for _ in range(3):
            link.report(cost())
            time.sleep(0.05)
        wait_until(
            lambda: sum(r[1].endswith("/cost") for r in state.requests) >= 2,
            "a second report",
            timeout=10,
        )
        time.sleep(0.2)
        assert link.terms == good
        warnings = [r for r in caplog.records if "cost report failed" in r.getMessage()]
        assert len(warnings) == 1
        state.answer = lambda m, p, b: (200, json.dumps({**TERMS, "grace_s": 77.0}).encode())
        wait_until(
            lambda: link.terms and link.terms.grace_s == 77.0,
            "the new terms, after the back-off",
            timeout=15,
        )
    assert "works again" in caplog.text
    assert TOKEN not in caplog.text
    link.close()


def test_a_silent_manager_never_slows_the_caller(manager) -> None:
    state, url = manager
    state.stall.set()
    link = link_to(url, timeout_s=0.5)
    link.start(on_notice=lambda n: None)
    started = time.perf_counter()
    for _ in range(100):
        link.report(cost())
    assert time.perf_counter() - started < 0.1  # queued, never sent on the caller's thread
    started = time.perf_counter()
    assert link.ack(3) is False  # the one synchronous call: bounded by its timeout
    assert time.perf_counter() - started < 2.0
    started = time.perf_counter()
    link.close()
    assert time.perf_counter() - started < 2.0


def test_a_manager_that_is_down_is_survived(caplog) -> None:
    link = link_to("http://127.0.0.1:9")  # nothing listens on the discard port
    notices: list[QueueNotice] = []
    with caplog.at_level(logging.WARNING, "preemptible"):
        link.start(on_notice=notices.append)
        link.report(cost())
        assert link.ack(1) is False
        wait_until(lambda: "notice watch failed" in caplog.text, "the warning", timeout=10)
    assert link.terms is None and notices == []
    link.close()


# --- the link inside a training loop (Context) -------------------------------------------------


def train_with(
    link: QueueLink,
    root,
    *,
    total: int,
    notice_at: Callable[[Context, int], None] | None = None,
    **options: Any,
) -> tuple[Context, list[int]]:
    """A small loop under `Context`; `notice_at(ctx, step)` runs inside each step."""
    seen: list[int] = []
    ctx = Context(root, queue_link=link, **options)
    model = torch.nn.Linear(3, 1)
    ctx.register(model=model)
    try:
        for step in ctx.steps(total):
            seen.append(step)
            if notice_at is not None:
                notice_at(ctx, step)
            time.sleep(0.01)
    finally:
        ctx.close()
    return ctx, seen


def test_a_managers_notice_stops_the_loop_saves_and_acks_the_step(manager, tmp_path) -> None:
    state, url = manager
    deadline = time.time() + 30  # sooner than the 40 s grace of the terms a cost report gets

    def notice_at(ctx: Context, step: int) -> None:
        if step == 2:
            state.notice = {"reason": "reclaimed", "grace_s": 30.0, "deadline": deadline}
            state.notice_set.set()
            # The watcher's poll returns with it.
            wait_until(lambda: ctx.guard.requested, "the guard's request", timeout=10)
            assert ctx.guard.deadline == deadline
            assert ctx.guard.reason == "queue manager: reclaimed"

    with pytest.raises(SystemExit) as exit_:
        train_with(link_to(url), tmp_path, total=100, every_steps=1, notice_at=notice_at)
    assert exit_.value.code == 143
    saved = Checkpointer(tmp_path).latest().step
    assert saved == 2  # the boundary of the step in which the notice came
    acks = [r for r in state.requests if r[1].endswith("/checkpointed")]
    assert [r[2]["step"] for r in acks] == [saved]


def test_a_resize_notice_stops_the_loop_saves_acks_the_resize_and_tells_the_loop(
    manager, tmp_path, caplog
) -> None:
    state, url = manager
    sizes: list[int | None] = []
    contexts: list[Context] = []

    def notice_at(ctx: Context, step: int) -> None:
        sizes.append(ctx.resize_to)
        contexts.append(ctx)
        if step == 3:
            state.notice = {"kind": "resize", "gpus": 6, "deadline": time.time() + 60}
            state.notice_set.set()
            wait_until(lambda: ctx.guard.requested, "the guard's request", timeout=10)

    with caplog.at_level(logging.INFO, "preemptible"), pytest.raises(SystemExit) as exit_:
        train_with(link_to(url), tmp_path, total=100, every_steps=50, notice_at=notice_at)
    assert exit_.value.code == 143
    assert sizes == [None] * 4 and contexts[0].resize_to == 6  # known at the stop
    assert Checkpointer(tmp_path).latest().step == 3
    (ack,) = [r[2] for r in state.requests if r[1].endswith("/checkpointed")]
    assert {k: ack[k] for k in ("step", "kind", "gpus")} == {"step": 3, "kind": "resize", "gpus": 6}
    assert "resize to 6 GPUs: saving at step 3" in caplog.text
    assert "resizing to 6 GPUs: checkpointed step 3" in caplog.text


def test_terms_become_the_guards_grace_and_the_auto_interval(manager, tmp_path) -> None:
    state, url = manager
    ctx, seen = train_with(link_to(url), tmp_path, total=30, interval="auto", async_save=False)
    assert seen == list(range(30))
    wait_until(lambda: ctx.terms is not None, "the terms", timeout=10)
    assert ctx.guard.grace_seconds == 40.0 and ctx.guard.grace_source == "queue manager"
    assert ctx.schedule.hint_seconds == 900.0  # 15 min: no more saves after the first
    reports = [r[2] for r in state.requests if r[1].endswith("/cost")]
    assert reports and all(r["save_seconds_p95"] > 0 for r in reports)  # only measured costs
    assert [i.step for i in Checkpointer(tmp_path).list()][-1] == 29


def test_the_step_beat_reports_moving_steps_their_slowest_and_the_checkpoint(manager) -> None:
    state, url = manager
    link = link_to(url, beat_s=0.1)
    link.start(on_notice=lambda n: None)

    def beats() -> list[dict[str, Any]]:
        return [r[2] for r in state.requests if r[1] == "/v1/jobs/j7/progress"]

    link.progress(0)
    time.sleep(0.05)
    link.progress(1)  # a step of about 50 ms
    link.report(cost(step=1))
    wait_until(lambda: beats(), "a beat", timeout=10)
    first = beats()[0]
    assert first["step"] == 1 and 0.04 < first["step_seconds"] < 1.0
    assert first["checkpoint_step"] == 1 and first["checkpoint_time"] > 0
    time.sleep(0.4)  # the step stands still: nothing more is sent
    assert len(beats()) == 1
    link.progress(2)
    wait_until(lambda: len(beats()) == 2, "the next beat", timeout=10)
    assert beats()[1]["step"] == 2
    link.close()


def test_the_beat_interval_comes_from_the_manager_and_bad_values_fall_back() -> None:
    env = {
        "PREEMPTIBLE_QUEUE_URL": "http://127.0.0.1:1",
        "PREEMPTIBLE_JOB_ID": "j1",
        "PREEMPTIBLE_TOKEN": "t",
    }
    for raw, expected in (("2.5", 2.5), ("", 10.0), ("soon", 10.0), ("-1", 10.0), ("inf", 10.0)):
        link = QueueLink.from_env({**env, "PREEMPTIBLE_BEAT_SECONDS": raw})
        assert link is not None and link.beat_s == expected, raw
        link.close()


def test_a_context_beats_its_steps_to_the_manager(manager, tmp_path) -> None:
    state, url = manager
    train_with(link_to(url, beat_s=0.05), tmp_path, total=30, every_steps=1000)
    steps = [r[2]["step"] for r in state.requests if r[1] == "/v1/jobs/j7/progress"]
    assert steps and steps == sorted(set(steps)) and steps[-1] <= 29, steps
