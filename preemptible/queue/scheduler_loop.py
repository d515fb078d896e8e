"""What the two shells around the core share: the state, the usage, the cycle, its decisions.

The simulator (`preemptible.sim`) and the queue manager (`preemptible.queue.service`) keep the
state the same way and apply the core's decisions through this one class: admit, notice, hold,
requeue, moves, nominees, resizes of elastic jobs. Only the clock and what a run is differ:
virtual time and trace durations in the simulator, real time and process groups in the service.
Each shell says what a run does through `Runs` (and `ResizingRuns` to run elastic jobs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from preemptible.errors import ConfigError
from preemptible.queue.core import (
    ClusterState,
    CycleResult,
    Job,
    Policy,
    Preempt,
    QueueConfig,
    RunningJob,
    Snapshot,
    UsageTracker,
    dominant_share,
    schedule,
)
from preemptible.queue.core.model import Admit, Resize, Resources
from preemptible.queue.core.placement import Placement


@dataclass(frozen=True, slots=True)
class Leaving:
    """What a notice leads to: the job is expected to have left (and freed its GPUs) `at`."""

    at: float
    preempted: bool = True
    """False when the job completes before it would have left: nothing is lost and no
    preemption is counted against it (the simulator knows; a live job never does)."""


class Runs(Protocol):
    """What a shell does beyond the state: start a run, and tell a run to go."""

    def started(self, admit: Admit, running: RunningJob, now: float) -> None:
        """`running` was admitted at `now` by `admit`: start it (a process, or its end)."""

    def noticed(self, notice: Preempt, running: RunningJob, now: float) -> Leaving:
        """`running` was told to go by `notice`: send it, and say when it will have left."""


@runtime_checkable
class ResizingRuns(Runs, Protocol):
    """A shell that can resize elastic jobs (`Resize`): only such a shell may run elastic jobs."""

    def resized(self, resize: Resize, running: RunningJob, now: float) -> None:
        """`running` was told to resize. A grow holds its new GPUs already; a shrink holds all
        its GPUs until it has saved, when the shell calls `Shell.shrunk`."""


class Shell:
    """The state between cycles, the decayed usage, and one cycle applied to both."""

    def __init__(self, config: QueueConfig, policy: Policy, *, preemption_retry_s: float = 120.0):
        self.config = config
        self.policy = policy
        self.preemption_retry_s = preemption_retry_s
        """After a victim search finds nothing, the same kind of job waits this long to retry."""
        self.state = ClusterState(config.cluster, config.queues)
        self.tracker = UsageTracker(
            [q.name for q in config.queues], config.policy.fair_share_half_life_s
        )

    def submit(self, job: Job) -> None:
        """A job is pending: new, or requeued after it left."""
        self.state.submit(job)

    def release(self, job_id: str, now: float) -> RunningJob:
        """A running job has left (completed, failed, preempted): its resources are free."""
        running = self.state.finish(job_id)
        self.tracker.advance(now)
        self.tracker.add(running.job.queue, -self._share(running.held))
        return running

    def cycles(self, now: float, runs: Runs, *, at_most: int = 3) -> list[CycleResult]:
        """Run a cycle, and again at once (up to `at_most` in all) while the core asks for it.

        A job within its nominal quota may be owed capacity that this very cycle gave to a
        borrower: the next cycle lets it reclaim (the nominal guarantee).
        """
        results = []
        for _ in range(at_most):
            result = self.cycle(now, runs)
            results.append(result)
            if not result.rerun or not self.state.pending:
                break
        return results

    def cycle(self, now: float, runs: Runs) -> CycleResult:
        """One cycle of the core at `now`, its decisions applied to the state and to `runs`."""
        self.tracker.advance(now)
        snapshot = Snapshot(state=self.state, usage=self.tracker.averages())
        result = schedule(snapshot, now, self.policy, self.config)
        if result.failed_preemptions:
            self.state.note_failed_preemptions(
                result.failed_preemptions, now + self.preemption_retry_s
            )
        if self.state.nominated:
            self.state.expire_nominations(now - self.config.preemption.nomination_window_s)
        for admit in result.admit:
            self._admit(admit, now, runs)
        for notice in result.preempt:
            self._notice(notice, now, runs)
        for resize in result.resize:
            self._resize(resize, now, runs)
        return result

    def _resize(self, resize: Resize, now: float, runs: Runs) -> None:
        if not isinstance(runs, ResizingRuns):
            raise ConfigError(
                f"the core resized elastic job {resize.job_id!r}, but this shell cannot resize "
                "jobs; submit it without min_gpus or run a policy with elastic off"
            )
        running = self.state.running[resize.job_id]
        if resize.kind == "grow":
            self._resized(resize.job_id, resize.gpus, now, resize.placement or None)
        else:
            self.state.begin_shrink(resize.job_id, resize.gpus, at=now)
            if resize.for_job is not None:
                self.state.nominate(resize.for_job, now, nodes=resize.for_nodes)
        runs.resized(resize, running, now)

    def shrunk(
        self, job_id: str, gpus: int, now: float, placement: Placement | None = None
    ) -> RunningJob:
        """A shrunk job has saved: it holds `gpus` GPUs (on `placement`) from now on, and what
        it gave up is free (for the job it was shrunk for, first)."""
        return self._resized(job_id, gpus, now, placement)

    def _resized(
        self, job_id: str, gpus: int, now: float, placement: Placement | None
    ) -> RunningJob:
        before = self.state.running[job_id].held
        after = self.state.finish_resize(job_id, gpus, at=now, placement=placement)
        self.tracker.advance(now)
        self.tracker.add(after.job.queue, self._share(after.held) - self._share(before))
        return after

    def _admit(self, admit: Admit, now: float, runs: Runs) -> None:
        job = self.state.withdraw(admit.job_id)
        running = RunningJob(
            job=job,
            started_at=now,
            placement=admit.placement,
            loan_for=admit.loan_for,
            gpus=admit.gpus if admit.gpus != job.request.gpus else None,
        )
        expected = now + job.expected_runtime_s(self.config.policy.default_estimate_s)
        self.state.start(running, expected_end=expected)
        self.tracker.advance(now)
        self.tracker.add(job.queue, self._share(running.held))
        runs.started(admit, running, now)

    def _notice(self, notice: Preempt, now: float, runs: Runs) -> None:
        job_id = notice.job_id
        running = self.state.running[job_id]
        leaving = runs.noticed(notice, running, now)
        self.state.record_preemption(
            running.job.queue, now, preemptor=notice.for_job, nodes=notice.for_nodes
        )
        if leaving.preempted and notice.restart_on:
            # A move: the job restarts on the GPUs held for it, first among the nominees.
            self.state.nominate(job_id, now, nodes=notice.restart_on, moving=True)
        self.state.mark_terminating(job_id, expected_end=leaving.at)

    def restore_usage(self, runs: Iterable[tuple[Job, float, float | None]], now: float) -> None:
        """Rebuild the decayed usage after a restart from the runs on record: (job, start,
        end, or None for a run that had not ended). Call it before `adopt`, which counts no
        usage: the open runs here already hold theirs."""
        changes: list[tuple[float, float, str]] = []
        for job, start, end in runs:
            share = self._share(job.request)
            changes.append((start, share, job.queue))
            if end is not None:
                changes.append((end, -share, job.queue))
        for at, share, queue in sorted(changes):  # at one instant, releases first
            self.tracker.advance(at)
            self.tracker.add(queue, share)
        self.tracker.advance(now)

    def adopt(self, running: RunningJob, now: float) -> None:
        """A job found running (the manager restarted while it ran) holds its resources again;
        `running.terminating` when it had been told to go. Its usage is `restore_usage`'s."""
        expected = now + running.job.expected_runtime_s(self.config.policy.default_estimate_s)
        self.state.start(running, expected_end=expected)

    def _share(self, r: Resources) -> float:
        return dominant_share(r.gpus, r.cpus, r.memory_gb, self.config.cluster)
