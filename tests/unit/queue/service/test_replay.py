"""A trace replayed through the queue manager gives exactly the simulator's decisions.

Both shells apply the core's decisions through `queue.scheduler_loop.Shell`; only the clock and what
a run is differ. Here the manager runs on a virtual clock with `VirtualExecutor`, whose runs behave
as the simulator's `aware` jobs do (a run lasts its restore plus its remaining work; on notice it
saves for its checkpoint cost and exits), and a driver wakes the manager at the instants the
simulator wakes its own loop. Every admission and notice (time, job, reason, grace), every run's
start and end, and every job's end must then be the same.

The trace has no runtime estimates: the simulator credits a job's saved progress against its
estimate, which a live manager cannot know.
"""

from __future__ import annotations

import dataclasses
import heapq
from pathlib import Path
from typing import Any

import pytest

from preemptible.queue.core import POLICIES, Admit, Preempt, RunningJob, parse_config
from preemptible.queue.scheduler_loop import Leaving
from preemptible.queue.service.executor import Exit, ExitKind, LaunchSpec, ProcessHandle
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.store import Store
from preemptible.queue.service.views import CostView, JobState, SubmitRequest
from preemptible.sim.engine import SimOptions, Simulator
from preemptible.sim.synth import generate
from preemptible.sim.trace import TraceJob

CONFIG = {
    "cluster": {"gpus": 16},
    "policy": {"fair_share_half_life": "1d", "aging": "1h"},
    # Short, so that the 200 jobs see both waits that end in a preemption and waits that do not.
    "preemption": {"tier_patience": "2m"},
    "queues": [
        {"name": "team-a", "weight": 2.0, "nominal": {"gpus": 8}, "borrowing_limit": {"gpus": 8}},
        {"name": "team-b", "nominal": {"gpus": 4}, "borrowing_limit": {"gpus": 8}},
        {"name": "team-c", "nominal": {"gpus": 4}, "borrowing_limit": {"gpus": 12}},
    ],
}
Decision = tuple[Any, ...]


def trace(jobs: int, seed: int) -> list[TraceJob]:
    """A synthetic trace, ids in the manager's numbering (j1, j2... in arrival order), no
    estimates."""
    raw = sorted(generate(jobs=jobs, gpus=16, load=1.3, seed=seed), key=lambda j: j.submit_s)
    return [dataclasses.replace(j, job_id=f"j{i}", estimate_s=None) for i, j in enumerate(raw, 1)]


class RecordingSimulator(Simulator):
    """The simulator, noting each decision as the manager's event log does."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.decisions: list[Decision] = []

    def started(self, admit: Admit, running: RunningJob, now: float) -> None:
        self.decisions.append(("admitted", now, admit.job_id, admit.reason))
        super().started(admit, running, now)

    def noticed(self, notice: Preempt, running: RunningJob, now: float) -> Leaving:
        self.decisions.append(("notice", now, notice.job_id, notice.reason, notice.grace_s))
        return super().noticed(notice, running, now)


@dataclasses.dataclass
class VirtualJob:
    """A trace job's progress, as the simulator keeps it."""

    trace: TraceJob
    saved_s: float = 0.0
    run_start: float = 0.0
    run_restore: float = 0.0

    @property
    def cost_s(self) -> float:
        assert self.trace.checkpoint_s is not None
        return self.trace.checkpoint_s


class VirtualExecutor:
    """Runs in virtual time: a run ends after its restore and remaining work; on notice it
    saves (its checkpoint cost) and exits, unless it would complete first."""

    def __init__(self, jobs: dict[str, VirtualJob]):
        self.jobs = jobs
        self.now = 0.0
        self.manager: QueueManager | None = None
        self.timers: list[float] = []
        """Instants at which a run ends or was due to end (the driver wakes at each)."""
        self.ends: dict[int, tuple[float, int]] = {}
        self.job_of: dict[int, str] = {}
        self.resumed: list[str] = []
        """Jobs that left with saved progress: their restore must be reported."""

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        job = self.jobs[spec.job_id]
        pid = len(self.job_of) + 1
        self.job_of[pid] = spec.job_id
        job.run_start = self.now
        job.run_restore = job.cost_s if job.saved_s > 0 else 0.0
        finish = self.now + job.run_restore + (job.trace.duration_s - job.saved_s)
        self.ends[pid] = (finish, 0)
        heapq.heappush(self.timers, finish)
        return ProcessHandle(pid=pid, start_ticks=0, status_path=str(spec.status_path))

    def poll(self, handle: ProcessHandle) -> Exit | None:
        at, code = self.ends[handle.pid]
        if self.now < at:
            return None
        return Exit(exit_code=code, signal=None, ended_at=at, how=ExitKind.EXITED)

    def terminate(self, handle: ProcessHandle) -> None:
        assert self.manager is not None
        job_id = self.job_of[handle.pid]
        job = self.jobs[job_id]
        notice = self.manager.jobs[job_id].notice
        assert notice is not None and job.cost_s <= notice.grace_s, "the save fits its grace"
        leaves = self.now + job.cost_s
        if self.ends[handle.pid][0] <= leaves:
            return  # it completes before it would have left
        job.saved_s += max(0.0, self.now - job.run_start - job.run_restore)
        self.ends[handle.pid] = (leaves, 143)
        heapq.heappush(self.timers, leaves)
        if job.saved_s > 0:
            self.resumed.append(job_id)

    def kill(self, handle: ProcessHandle) -> None:
        raise AssertionError(f"run {self.job_of[handle.pid]} was killed: it had saved in time")

    def alive(self, handle: ProcessHandle) -> bool:
        return self.ends[handle.pid][0] > self.now


def replay(jobs: list[TraceJob], state_dir: Path) -> tuple[QueueManager, list[Decision]]:
    """The trace through a manager on a virtual clock; its admissions and notices."""
    config = parse_config(CONFIG)
    virtual = {j.job_id: VirtualJob(j) for j in jobs}
    executor = VirtualExecutor(virtual)
    manager = QueueManager(
        config,
        Store(state_dir),
        executor,  # type: ignore[arg-type]
        state_dir=state_dir,
        policy=POLICIES["preemptible"],
        clock=lambda: executor.now,
        cycle_every_s=0.0,
    )
    executor.manager = manager
    arrivals = list(reversed(jobs))
    ticks: list[float] = []
    while arrivals or executor.timers or ticks:
        now = min(_heads(arrivals, executor.timers, ticks))
        executor.now = now
        for heap in (executor.timers, ticks):
            while heap and heap[0] == now:
                heapq.heappop(heap)
        while arrivals and arrivals[-1].submit_s == now:
            _submit(manager, arrivals.pop())
        before = manager.cycles_run
        manager.step()
        for job_id in executor.resumed:  # the restore it will pay, as the simulator assumes
            cost = virtual[job_id].cost_s
            manager.report_cost(job_id, CostView(save_seconds_p95=cost, restore_seconds=cost))
        executor.resumed.clear()
        wake = manager.wake_at
        if manager.cycles_run > before and wake is not None:
            heads = list(_heads(arrivals, executor.timers, ticks))
            if not heads or min(heads) > wake:
                heapq.heappush(ticks, wake)
    decisions = [
        (e.kind, e.at, e.job_id, e.reason, *([e.data["grace_s"]] if e.kind == "notice" else []))
        for e in manager.events(limit=1_000_000)
        if e.kind in ("admitted", "notice")
    ]
    return manager, decisions


def _heads(arrivals: list[TraceJob], timers: list[float], ticks: list[float]) -> list[float]:
    heads = [arrivals[-1].submit_s] if arrivals else []
    return heads + timers[:1] + ticks[:1]


def _submit(manager: QueueManager, job: TraceJob) -> None:
    view = manager.submit(
        SubmitRequest(
            queue=job.queue,
            gpus=job.gpus,
            cpus=job.cpus,
            memory_gb=job.memory_gb,
            tier=job.tier,
            command=["virtual"],
        )
    )
    assert view.id == job.job_id, "the trace's ids are the manager's numbering"
    assert job.checkpoint_s is not None
    manager.report_cost(job.job_id, CostView(save_seconds_p95=job.checkpoint_s))


@pytest.mark.parametrize("seed", [3, 7, 11])
def test_replay_through_the_manager_makes_the_simulators_decisions(
    tmp_path: Path, seed: int
) -> None:
    jobs = trace(200, seed)
    sim = RecordingSimulator(
        jobs,
        parse_config(CONFIG),
        POLICIES["preemptible"],
        SimOptions(checkpoint_mode="aware", cycle_interval_s=0.0),
    )
    result = sim.run()
    manager, decisions = replay(jobs, tmp_path)

    notices = [d for d in sim.decisions if d[0] == "notice"]
    assert len(notices) >= 5, "the trace must exercise preemption"
    assert decisions == sim.decisions
    assert manager.metrics_snapshot()["cycle_histogram"].count == manager.cycles_run > 0
    for rec in result.records:
        mine = manager.jobs[rec.trace.job_id]
        assert mine.state == JobState.COMPLETED.value
        assert [tuple(r[:2]) for r in mine.runs] == rec.runs
        assert mine.finished_at == rec.end_s
