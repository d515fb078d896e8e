"""An in-memory queue manager for the HTTP layer's tests, and a live server to run it behind.

`FakeQueueManager` has the methods `http_edge.QueueManagerProtocol` names and raises the same errors
as `manager.QueueManager`; it schedules nothing. Tests move jobs along by hand (`start`,
`notify`, `finish`) and read what the API passed on (`cost_reports`, `checkpoints`,
`notice_waits`). `InertExecutor` stands in for the real manager's executor: it launches
nothing, and a run lasts until it is told to go. `live_server` runs an app under uvicorn on a
free loopback port in a thread, so the tests speak real HTTP.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from preemptible.errors import JobNotFoundError, JobStateError, RequestError
from preemptible.queue.core import QueueConfig, negotiate, parse_config_text
from preemptible.queue.service.connections import ConnectionLimits
from preemptible.queue.service.executor import Exit, ExitKind, LaunchSpec, ProcessHandle
from preemptible.queue.service.history import SignalSample
from preemptible.queue.service.metrics import DurationHistogram
from preemptible.queue.service.server import uvicorn_config
from preemptible.queue.service.views import (
    CostView,
    EventView,
    JobState,
    JobView,
    NegotiationView,
    NoticeView,
    Principal,
    QueueView,
    SignalsView,
    StatsView,
    SubmitRequest,
    TokenOwner,
    WhyView,
    finite_or_none,
)
from tests.polling import wait_until

CONFIG_TEXT = """
[cluster]
gpus = 8
cpus = 64
memory_gb = 512
[[queues]]
name = "team-a"
nominal = { gpus = 4 }
token = "env:TEAM_A_TOKEN"
[[queues]]
name = "team-b"
nominal = { gpus = 4 }
token = "env:TEAM_B_TOKEN"
[service]
admin_token = "env:PREEMPTIBLE_ADMIN_TOKEN"
"""

ADMIN_TOKEN = "admin-" + "0123456789abcdef" * 2
TEAM_A_TOKEN = "team-a-" + "a1b2c3d4e5f60718" * 2
TEAM_B_TOKEN = "team-b-" + "f0e1d2c3b4a59687" * 2
ENVIRON = {
    "TEAM_A_TOKEN": TEAM_A_TOKEN,
    "TEAM_B_TOKEN": TEAM_B_TOKEN,
    "PREEMPTIBLE_ADMIN_TOKEN": ADMIN_TOKEN,
}


def make_config() -> QueueConfig:
    """Two queues of 4 GPUs on an 8-GPU machine; tokens from the variables of `ENVIRON`."""
    return parse_config_text(CONFIG_TEXT)


@dataclasses.dataclass
class _Job:
    view: JobView
    token: str
    notice: NoticeView | None = None


class FakeQueueManager:
    """The manager's surface over dicts, guarded by one condition variable."""

    def __init__(self, config: QueueConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self._logs = tempfile.TemporaryDirectory(prefix="fake-manager-logs-")
        self.log_dir = Path(self._logs.name)
        self._changed = threading.Condition()
        self._jobs: dict[str, _Job] = {}
        self._by_token: dict[str, str] = {}
        self._events: list[EventView] = []
        self._seq = 0
        self.submissions: list[SubmitRequest] = []
        self.cycles = DurationHistogram()
        for seconds in (0.002, 0.001, 0.004, 0.003, 0.3):
            self.cycles.observe(seconds)
        self.cost_reports: list[tuple[str, CostView]] = []
        self.checkpoints: list[tuple[str, int, float | None]] = []
        self.beats: list[tuple[str, int, float | None]] = []
        self.notice_waits: list[tuple[str, float]] = []
        self.fail_with: Exception | None = None
        """Raised by every call while set: a manager bug, as the API sees it."""
        self.gate: threading.Event | None = None
        """While set, `queues` waits for it to open (a slow request), counting who waits."""
        self.at_gate = 0

    # --- the manager's surface -----------------------------------------------------------------

    def submit(self, req: SubmitRequest, *, by: Principal | None = None) -> JobView:
        self._maybe_fail()
        queues = {q.name for q in self.config.queues}
        if req.queue not in queues:
            raise RequestError(f"no queue named {req.queue!r}; queues: {', '.join(sorted(queues))}")
        if not req.command or not req.command[0]:
            raise RequestError("command is empty: give the program and its arguments")
        if req.gpus > self.config.cluster.gpus:
            raise RequestError(
                f"asks for {req.gpus} GPUs but the machine has {self.config.cluster.gpus}"
            )
        with self._changed:
            self.submissions.append(req)
            self._seq += 1
            job_id = f"j{self._seq}"
            view = JobView(
                id=job_id,
                name=req.name or os.path.basename(req.command[0]),
                queue=req.queue,
                tier=req.tier,
                gpus=req.gpus,
                cpus=req.cpus,
                memory_gb=req.memory_gb,
                state=JobState.PENDING,
                reason="submitted",
                submitted_at=self.clock(),
                started_at=None,
                finished_at=None,
                attempts=0,
                exit_code=None,
                grace_s=30.0,
                min_runtime_s=300.0,
                cost=CostView(),
                command=list(req.command),
            )
            token = secrets.token_urlsafe(24)
            self._jobs[job_id] = _Job(view=view, token=token)
            self._by_token[token] = job_id
            self._event("submitted", view, "submitted", {"gpus": req.gpus}, by=by)
            return view

    def list_jobs(
        self,
        *,
        queue: str | None = None,
        state: JobState | None = None,
        after: str | None = None,
        limit: int | None = None,
        array: str | None = None,
    ) -> list[JobView]:
        self._maybe_fail()
        with self._changed:
            jobs = list(self._jobs)  # submission order
            if after is not None:
                if after not in self._jobs:
                    raise RequestError(f"after: no job {after!r} to list after; give a job's id")
                jobs = jobs[jobs.index(after) + 1 :]
            found = [
                self._jobs[job_id].view
                for job_id in jobs
                if (queue is None or self._jobs[job_id].view.queue == queue)
                and (state is None or self._jobs[job_id].view.state == state)
                and (array is None or self._jobs[job_id].view.array_id == array)
            ]
            return found if limit is None else found[:limit]

    def get_job(self, job_id: str) -> JobView:
        self._maybe_fail()
        with self._changed:
            return self._get(job_id).view

    def job_queue(self, job_id: str) -> str:
        self._maybe_fail()
        with self._changed:
            return self._get(job_id).view.queue

    def cancel(self, job_id: str, *, by: Principal | None = None) -> JobView:
        self._maybe_fail()
        with self._changed:
            job = self._get(job_id)
            if job.view.state.finished:
                raise JobStateError(f"job {job_id} has already {job.view.state}")
            self._set(job, state=JobState.CANCELLED, finished_at=self.clock(), reason="cancelled")
            self._event("cancelled", job.view, "cancelled by request", by=by)
            return job.view

    def hold(self, job_id: str, *, by: Principal | None = None) -> JobView:
        self._maybe_fail()
        with self._changed:
            job = self._get(job_id)
            if job.view.state is not JobState.PENDING:
                raise JobStateError(f"job {job_id} is {job.view.state}: only a pending job")
            self._set(job, held=True, reason="held: release it to schedule it")
            self._event("held", job.view, "held until released", by=by)
            return job.view

    def release(self, job_id: str, *, by: Principal | None = None) -> JobView:
        self._maybe_fail()
        with self._changed:
            job = self._get(job_id)
            if not job.view.held:
                raise JobStateError(f"job {job_id} is not held ({job.view.state})")
            self._set(job, held=False, reason="pending: released")
            self._event("released", job.view, "released", by=by)
            return job.view

    def set_tier(self, job_id: str, tier: str, *, by: Principal | None = None) -> JobView:
        self._maybe_fail()
        with self._changed:
            job = self._get(job_id)
            if job.view.state is not JobState.PENDING:
                raise JobStateError(f"job {job_id} is {job.view.state}: only a pending job")
            self._set(job, tier=tier)
            self._event("priority", job.view, f"tier {tier}", by=by)
            return job.view

    def why(self, job_id: str) -> WhyView:
        self._maybe_fail()
        with self._changed:
            view = self._get(job_id).view
            history = [e for e in reversed(self._events) if e.job_id == job_id]
            # the caps are the core's, as the real manager's are
            terms = negotiate(
                view.cost.save_seconds_p95 or 0.0,
                view.cost.restore_seconds or 0.0,
                self.config.preemption,
            )
            return WhyView(
                id=job_id,
                state=view.state,
                reason=view.reason,
                history=history,
                clamped=[c.reason for c in terms.clamped],
            )

    def report_cost(
        self, job_id: str, cost: CostView, *, by: Principal | None = None
    ) -> NegotiationView:
        self._maybe_fail()
        with self._changed:
            job = self._get(job_id)
            if job.view.state.finished:
                raise JobStateError(f"job {job_id} has {job.view.state}; it reports nothing more")
            self.cost_reports.append((job_id, cost))
            grace = min(600.0, max(30.0, 1.5 * (cost.save_seconds_p95 or 0.0) + 10.0))
            self._set(job, cost=cost, grace_s=grace)
            self._event("negotiated", job.view, f"grace {grace:g} s", {"grace_s": grace}, by=by)
            return NegotiationView(
                grace_s=grace, min_runtime_s=300.0, checkpoint_interval_hint_s=None
            )

    def wait_notice(self, job_id: str, wait_s: float) -> NoticeView | None:
        self._maybe_fail()
        deadline = time.monotonic() + wait_s
        with self._changed:
            self.notice_waits.append((job_id, wait_s))
            while True:
                notice = self._get(job_id).notice
                left = deadline - time.monotonic()
                if notice is not None or left <= 0:
                    return notice
                self._changed.wait(timeout=left)

    def checkpointed(
        self, job_id: str, *, step: int, at: float | None, by: Principal | None = None
    ) -> None:
        self._maybe_fail()
        with self._changed:
            job = self._get(job_id)
            if job.view.state not in (JobState.RUNNING, JobState.PREEMPTING):
                raise JobStateError(f"job {job_id} is {job.view.state}, not running")
            self.checkpoints.append((job_id, step, at))
            self._event("checkpointed", job.view, "saved", {"step": step}, by=by)

    def progress(
        self,
        job_id: str,
        *,
        step: int,
        step_s: float | None,
        checkpoint: tuple[int, float] | None = None,
    ) -> None:
        self._maybe_fail()
        with self._changed:
            job = self._get(job_id)
            if job.view.state not in (JobState.RUNNING, JobState.PREEMPTING):
                raise JobStateError(f"job {job_id} is {job.view.state}, not running")
            self.beats.append((job_id, step, step_s))

    def queues(self) -> list[QueueView]:
        self._maybe_fail()
        gate = self.gate
        if gate is not None:
            with self._changed:
                self.at_gate += 1
                self._changed.notify_all()
            gate.wait(timeout=30)
        with self._changed:
            views = []
            for q in self.config.queues:
                jobs = [j.view for j in self._jobs.values() if j.view.queue == q.name]
                running = [j for j in jobs if j.state in (JobState.RUNNING, JobState.PREEMPTING)]
                views.append(
                    QueueView(
                        name=q.name,
                        weight=q.weight,
                        nominal_gpus=finite_or_none(q.nominal.gpus),
                        borrowing_limit_gpus=finite_or_none(q.borrowing_limit.gpus),
                        used_gpus=float(sum(j.gpus for j in running)),
                        borrowed_gpus=0.0,
                        pending=sum(1 for j in jobs if j.state is JobState.PENDING),
                        running=len(running),
                        fair_share=1.0,
                    )
                )
            return views

    def stats(self) -> StatsView:
        self._maybe_fail()
        names = [q.name for q in self.config.queues]
        return StatsView(
            window_s=86400.0,
            overall=_signals(jobs=len(self._jobs)),
            queues={name: _signals(p95_wait_s=60.0 * (i + 1)) for i, name in enumerate(names)},
            max_wait_least_served_s=120.0,
        )

    def events(
        self,
        *,
        since: int = 0,
        queue: str | None = None,
        job_id: str | None = None,
        limit: int = 1000,
    ) -> list[EventView]:
        self._maybe_fail()
        with self._changed:
            found = [
                e
                for e in self._events
                if e.id > since
                and (queue is None or e.queue == queue)
                and (job_id is None or e.job_id == job_id)
            ]
            return found[:limit]

    def log_path(self, job_id: str, attempt: int | None = None) -> Path:
        self._maybe_fail()
        with self._changed:
            attempts = self._get(job_id).view.attempts
        k = attempts if attempt is None else attempt
        if k < 1 or k > attempts:
            raise JobNotFoundError(f"job {job_id} has no attempt {k} (it has {attempts})")
        return self.log_dir / f"{job_id}.{k}.log"

    def signal_history(self, since: float) -> list[SignalSample]:
        """Two samples of `stats()`, a minute apart and the last now; those after `since`."""
        self._maybe_fail()
        now = self.clock()
        return [SignalSample(at=at, stats=self.stats()) for at in (now - 60.0, now) if at > since]

    def job_for_token(self, token: str) -> TokenOwner | None:
        self._maybe_fail()
        with self._changed:
            job_id = self._by_token.get(token)
            if job_id is None:
                return None
            return TokenOwner(job_id=job_id, state=self._jobs[job_id].view.state)

    def metrics_snapshot(self) -> dict[str, Any]:
        self._maybe_fail()
        with self._changed:
            depth = {q.name: 0 for q in self.config.queues}
            for j in self._jobs.values():
                if j.view.state is JobState.PENDING:
                    depth[j.view.queue] += 1
        return {
            "queue_depth": depth,
            "admissions": {"team-a": 3, "team-b": 1},
            "preemptions": {("team-b", "tier"): 2, ("team-b", "reclaim"): 1},
            "cycle_seconds": [0.002, 0.001, 0.004, 0.003],
            "cycle_histogram": self.cycles.snapshot(),
            "signals": self.stats(),
        }

    # --- moving jobs along, for tests ----------------------------------------------------------

    def job_token(self, job_id: str) -> str:
        with self._changed:
            return self._get(job_id).token

    def start(self, job_id: str, gpu_ids: list[int] | None = None) -> JobView:
        with self._changed:
            job = self._get(job_id)
            now = self.clock()
            self._set(
                job,
                state=JobState.RUNNING,
                started_at=now,
                attempts=job.view.attempts + 1,
                gpu_ids=list(gpu_ids or []),
                reason="admitted within nominal quota",
            )
            self._event("admitted", job.view, "admitted within nominal quota")
            return job.view

    def notify(
        self, job_id: str, *, reason: str = "preempted by a high job", grace_s: float = 60.0
    ) -> None:
        with self._changed:
            job = self._get(job_id)
            job.notice = NoticeView(reason=reason, grace_s=grace_s, deadline=self.clock() + grace_s)
            self._set(job, state=JobState.PREEMPTING, reason=reason)
            self._event("notice", job.view, reason, {"grace_s": grace_s})
            self._changed.notify_all()

    def finish(self, job_id: str, exit_code: int = 0) -> JobView:
        with self._changed:
            job = self._get(job_id)
            state = JobState.COMPLETED if exit_code == 0 else JobState.FAILED
            self._set(job, state=state, exit_code=exit_code, finished_at=self.clock(), gpu_ids=[])
            self._event(state.value, job.view, f"exited with {exit_code}")
            return job.view

    def write_log(self, job_id: str, data: str | bytes, *, attempt: int | None = None) -> Path:
        """Append to the attempt's log (the latest by default)."""
        path = self.log_path(job_id, attempt)
        with path.open("ab") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        return path

    def wait_for_pollers(self, n: int, timeout_s: float = 10.0) -> None:
        """Block until `n` notice long-polls have begun (in all)."""
        wait_until(
            lambda: len(self.notice_waits) >= n,
            f"{n} notice long-polls",
            timeout=timeout_s,
            describe=lambda: f"{len(self.notice_waits)} of {n} pollers arrived",
        )

    # --- helpers -------------------------------------------------------------------------------

    def _maybe_fail(self) -> None:
        if self.fail_with is not None:
            raise self.fail_with

    def _get(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        return job

    def _set(self, job: _Job, **changes: Any) -> None:
        job.view = dataclasses.replace(job.view, **changes)

    def _event(
        self,
        kind: str,
        view: JobView,
        reason: str,
        data: Mapping[str, Any] | None = None,
        *,
        by: Principal | None = None,
    ) -> None:
        self._events.append(
            EventView(
                id=len(self._events) + 1,
                at=self.clock(),
                kind=kind,
                job_id=view.id,
                queue=view.queue,
                reason=reason,
                data=dict(data or {}),
                by=by,
            )
        )


def _signals(**values: Any) -> SignalsView:
    base: dict[str, Any] = {
        "p95_wait_s": 30.0,
        "max_wait_s": 90.0,
        "utilization": 0.75,
        "goodput": 0.7,
        "preemptions": 2,
        "preemptions_per_hour": 0.5,
        "lost_gpu_s": 120.0,
        "lost_gpu_s_per_preemption": 60.0,
        "jobs": 4,
    }
    return SignalsView(**(base | values))


class InertExecutor:
    """Launches nothing; a run lasts until it is terminated or killed."""

    def __init__(self) -> None:
        self._pids = itertools.count(10_000_000)
        self._gone: set[int] = set()
        self._lock = threading.Lock()

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        return ProcessHandle(pid=next(self._pids), start_ticks=0, status_path=str(spec.status_path))

    def poll(self, handle: ProcessHandle) -> Exit | None:
        with self._lock:
            if handle.pid not in self._gone:
                return None
        return Exit(exit_code=143, signal=None, ended_at=None, how=ExitKind.EXITED)

    def terminate(self, handle: ProcessHandle) -> None:
        with self._lock:
            self._gone.add(handle.pid)

    kill = terminate

    def alive(self, handle: ProcessHandle) -> bool:
        with self._lock:
            return handle.pid not in self._gone


class _ThreadServer(uvicorn.Server):
    """uvicorn that says when it is listening; run it in a thread (no signal handlers)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


@contextmanager
def live_server(app: FastAPI, limits: ConnectionLimits | None = None) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 and a free port; yields the base URL. With `limits`, as `queue
    serve` does (`server.uvicorn_config`): connections counted, refused and closed when idle."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options: dict[str, Any] = {"lifespan": "off", "timeout_graceful_shutdown": 1}
    if limits is None:
        config = uvicorn.Config(app, log_level="warning", **options)
    else:
        config = uvicorn_config(app, limits, host="127.0.0.1", port=port, **options)
    server = _ThreadServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    if not server.ready.wait(timeout=20):
        server.should_exit = True
        raise RuntimeError("the test server did not start within 20 s")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
