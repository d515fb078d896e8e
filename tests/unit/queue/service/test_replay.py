"""A trace replayed through the queue manager gives exactly the simulator's decisions.

Both shells apply the core's decisions through `queue.scheduler_loop.Shell`; only the clock and what
a run is differ. Here the manager runs on a virtual clock with `VirtualExecutor`, whose runs behave
as the simulator's `aware` jobs do (a run lasts its restore plus its remaining work; on notice it
saves for its checkpoint cost and exits), and a driver wakes the manager at the instants the
simulator wakes its own loop. Every admission and notice (time, job, reason, grace), every run's
start and end, and every job's end must then be the same.

An elastic trace (jobs with a range `min_gpus..gpus`) adds resizes: on a resize notice the run
saves for its checkpoint cost, acks (`checkpointed`) and exits; the manager launches it again at
once on its new GPUs, where it restores and then progresses at its size over its request of full
speed (progress is counted in seconds at full size), as the simulator's elastic jobs do. Every
resize notice (time, job, reason, grace, shrink or grow, new size) and every restart must then be
the same too, and every job's GPUs held over time.

The trace has no runtime estimates: the simulator credits a job's saved progress against its
estimate, which a live manager cannot know.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from preemptible.queue.core import POLICIES, Admit, Preempt, Resize, RunningJob, parse_config
from preemptible.queue.scheduler_loop import Leaving
from preemptible.queue.service.executor import Exit, ExitKind, LaunchSpec, ProcessHandle
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.store import Store
from preemptible.queue.service.views import CostView, JobState, SubmitRequest
from preemptible.sim.engine import SimOptions, Simulator
from preemptible.sim.family import draw_knobs, elastic_ranges
from preemptible.sim.synth import TeamMix, generate
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
Restart = tuple[float, str, str, int, int]
"""(when, job, "shrink" or "grow", GPUs before, GPUs after) of a run restarted by a resize."""
Held = tuple[float, float, int]
"""(from, to, GPUs) of a stretch of a job's run at one number of GPUs."""


def trace(jobs: int, seed: int) -> list[TraceJob]:
    """A synthetic trace, ids in the manager's numbering (j1, j2... in arrival order), no
    estimates."""
    raw = sorted(generate(jobs=jobs, gpus=16, load=1.3, seed=seed), key=lambda j: j.submit_s)
    return [dataclasses.replace(j, job_id=f"j{i}", estimate_s=None) for i, j in enumerate(raw, 1)]


ELASTIC_TEAMS = (
    TeamMix(name="team-a", share=0.35, lora=0.2, train=0.7, sweep=0.1),
    TeamMix(name="team-b", share=0.40, lora=0.5, train=0.4, sweep=0.1),
    TeamMix(name="team-c", share=0.25, lora=0.3, train=0.3, sweep=0.4),
)
"""More gang training than the default mix: its 8-GPU jobs are the ones that may be elastic."""


def elastic_trace(jobs: int, seed: int) -> list[TraceJob]:
    """As `trace`, with more 8-GPU jobs, 80% of them elastic down to 2 GPUs on multiples of 2
    (the family's `elastic_ranges`)."""
    raw = generate(jobs=jobs, gpus=16, load=1.3, seed=seed, teams=ELASTIC_TEAMS)
    knobs = dataclasses.replace(draw_knobs(seed), elastic_fraction=0.8, elastic_min_share=0.25)
    raw = sorted(elastic_ranges(raw, knobs), key=lambda j: j.submit_s)
    return [dataclasses.replace(j, job_id=f"j{i}", estimate_s=None) for i, j in enumerate(raw, 1)]


class RecordingSimulator(Simulator):
    """The simulator, noting each decision as the manager's event log does."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.decisions: list[Decision] = []
        self.restarts: list[Restart] = []

    def started(self, admit: Admit, running: RunningJob, now: float) -> None:
        self.decisions.append(("admitted", now, admit.job_id, admit.reason))
        super().started(admit, running, now)

    def noticed(self, notice: Preempt, running: RunningJob, now: float) -> Leaving:
        self.decisions.append(("notice", now, notice.job_id, notice.reason, notice.grace_s))
        return super().noticed(notice, running, now)

    def resized(self, resize: Resize, running: RunningJob, now: float) -> None:
        self.decisions.append(
            (
                "resize",
                now,
                resize.job_id,
                resize.reason,
                resize.grace_s,
                resize.kind,
                resize.gpus,
            )
        )
        rec = self.records[resize.job_id]
        token = rec.run_token
        super().resized(resize, running, now)
        if rec.run_token != token:  # it restarts (unless it completes before it has saved)
            before, after = running.size, resize.gpus
            self.restarts.append((rec.run_start_s, resize.job_id, resize.kind, before, after))


@dataclasses.dataclass
class VirtualJob:
    """A trace job's progress, as the simulator keeps it."""

    trace: TraceJob
    saved_s: float = 0.0
    """Progress saved, in seconds of work at its full size."""
    run_start: float = 0.0
    run_restore: float = 0.0
    run_rate: float = 1.0
    """Progress per second of the current run: its GPUs over those it asks for."""

    @property
    def cost_s(self) -> float:
        assert self.trace.checkpoint_s is not None
        return self.trace.checkpoint_s


class VirtualExecutor:
    """Runs in virtual time: a run ends after its restore and remaining work (at its size's
    rate); on notice it saves (its checkpoint cost) and exits, unless it would complete first.
    On a resize notice it also acks (`checkpointed`) when it has saved, just before it exits."""

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
        self.acks: list[tuple[float, str]] = []
        """(when, job) of the saves that resize notices asked for: the driver acks them."""

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        job = self.jobs[spec.job_id]
        pid = len(self.job_of) + 1
        self.job_of[pid] = spec.job_id
        job.run_start = self.now
        job.run_restore = job.cost_s if job.saved_s > 0 else 0.0
        job.run_rate = len(spec.gpu_ids) / job.trace.gpus
        remaining = job.trace.duration_s - job.saved_s
        if job.run_rate != 1.0:  # the simulator's arithmetic, to the last bit
            remaining /= job.run_rate
        finish = self.now + job.run_restore + remaining
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
        worked = max(0.0, self.now - job.run_start - job.run_restore)
        job.saved_s += worked if job.run_rate == 1.0 else job.run_rate * worked
        self.ends[handle.pid] = (leaves, 143)
        heapq.heappush(self.timers, leaves)
        if notice.kind == "resize":
            # It restarts at once: the simulator keeps the job's terms as they were at its
            # admission until it is requeued, so its restore is not reported here.
            self.acks.append((leaves, job_id))
        elif job.saved_s > 0:
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
        for at, job_id in [a for a in executor.acks if a[0] == now]:
            executor.acks.remove((at, job_id))
            manager.checkpointed(job_id, step=1, at=now)  # saved on its resize notice
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
    decisions = [_decision(e) for e in manager.events(limit=1_000_000)]
    return manager, [d for d in decisions if d is not None]


def _decision(e: Any) -> Decision | None:
    """An event of the manager's log as `RecordingSimulator` notes the decision (None: not
    one): an admission, a notice, or a notice to resize."""
    if e.kind == "admitted":
        return (e.kind, e.at, e.job_id, e.reason)
    if e.kind == "notice" and "resize" in e.data:
        return (
            "resize",
            e.at,
            e.job_id,
            e.reason,
            e.data["grace_s"],
            e.data["resize"],
            e.data["to"],
        )
    if e.kind == "notice":
        return (e.kind, e.at, e.job_id, e.reason, e.data["grace_s"])
    return None


def restarts(manager: QueueManager) -> list[Restart]:
    """The manager's restarts of resized jobs, from its log."""
    return [
        (e.at, e.job_id, e.data["resize"], e.data["from"], e.data["to"])
        for e in manager.events(limit=1_000_000)
        if e.kind == "resized"
    ]


def held(
    runs: list[list[float]], grows: list[tuple[float, int]], restarted: set[float]
) -> list[Held]:
    """A job's GPUs over time from its runs on the manager's record ([start, end, GPUs] of each
    attempt): a grow holds its new GPUs from its notice (`grows`: when), which the simulator
    records as a new stretch, while its attempt goes on at its old size until its restart
    (`restarted`: when), which the simulator does not record."""
    out: list[Held] = []
    for start, end, gpus in runs:
        begin = start
        size = int(gpus)
        if out and out[-1][1] == start and start in restarted and out[-1][2] == size:
            begin, _, _ = out.pop()  # the restart after a grow: one stretch at the new size
        for at, to in sorted(g for g in grows if start < g[0] < end):
            out.append((begin, at, size))
            begin, size = at, to
        out.append((begin, end, size))
    return out


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
            min_gpus=job.min_gpus,
            gpus_multiple=job.gpus_multiple,
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


@pytest.mark.parametrize(
    "seed",
    [
        9,
        12,
        16,
        17,  # a shrunk job preempted and requeued: both shells time its next resize alike
    ],
)
def test_an_elastic_trace_is_resized_by_the_manager_as_by_the_simulator(
    tmp_path: Path, seed: int
) -> None:
    jobs = elastic_trace(200, seed)
    elastic = [j for j in jobs if j.min_gpus is not None]
    assert len(elastic) >= 10, "a good share of the trace is elastic"
    sim = RecordingSimulator(
        jobs,
        parse_config(CONFIG),
        POLICIES["preemptible"],
        SimOptions(checkpoint_mode="aware", cycle_interval_s=0.0),
    )
    result = sim.run()
    manager, decisions = replay(jobs, tmp_path)

    resizes = [d for d in sim.decisions if d[0] == "resize"]
    shrinks = sum(r.shrinks for r in result.records)
    grows = sum(r.grows for r in result.records)
    assert shrinks > 0, "the trace must exercise shrinks"
    assert grows > 0, "the trace must exercise grows"
    assert decisions == sim.decisions
    assert sum(manager.runs.resize_counts.values()) == len(resizes)
    mine = restarts(manager)  # those at one instant in the manager's order of polling
    assert sorted(mine) == sorted(sim.restarts)
    assert Counter(r[2] for r in mine) == {"shrink": shrinks, "grow": grows}
    for rec in result.records:
        job_id = rec.trace.job_id
        record = manager.jobs[job_id]
        assert record.state == JobState.COMPLETED.value
        assert record.finished_at == rec.end_s
        grown = [(d[1], d[6]) for d in resizes if d[2] == job_id and d[5] == "grow"]
        restarted = {r[0] for r in sim.restarts if r[1] == job_id and r[2] == "grow"}
        expected = [(a, b, g) for (a, b), g in zip(rec.runs, rec.run_gpus, strict=True)]
        assert held(record.runs, grown, restarted) == expected, job_id
