"""Discrete-event simulation in virtual time around the pure scheduling core.

Events are arrivals, natural completions, the exits of preempted jobs and the wake-ups a cycle
asks for (`CycleResult.wake_at`). After all events at one instant are applied, one cycle of the
core runs (at most one per `cycle_interval_s`), and its decisions are applied exactly as the
live service would: admit starts a run, preempt sends a notice and the victim leaves after its
save (or at once, or when the grace runs out).

Preemption is modelled for two kinds of job, so the value of checkpoint-on-notice shows:

- `periodic`: a plain script that checkpoints every `checkpoint_interval_s`; SIGTERM kills it
  at once and it loses the work since its last checkpoint.
- `aware`: the same, plus it saves on notice (the SDK's guard); when the save fits in its grace
  it loses only the save time, otherwise it is killed at the end of the grace.

Either way a restarted job pays its restore cost. Lost GPU-seconds = GPUs x (unsaved work + save
time after the notice + restore), charged at the preemption.

An elastic job (a trace's `min_gpus`) may run at fewer GPUs than it asks for: its work is
measured in seconds at its full size, and it progresses at `gpus now / gpus asked` of that rate.
A `Resize` makes it save (an aware job saves at once; a periodic one loses its work since its
last checkpoint, as for a notice) and restart at the new size, paying its restore: lost
GPU-seconds = GPUs before x save + GPUs after x restore, charged at the notice. A shrink holds
its GPUs until it has saved; a grow holds its new ones from the notice. A job evicted while it
saves for a shrink leaves when that save ends, and its restart at the smaller size (with the
restore charged for it) never happens.

With failure rates (`SimOptions.failures`, `preemptible.sim.failures`) jobs also crash and hang.
A crash frees the job's GPUs at once and loses its work since its last regular checkpoint; a
hang holds them, doing nothing, until the hang bound, then a notice and the grace (the job
cannot act on it), and loses the same. Either way the job waits its back-off out of the queue
and rejoins it to restart from that checkpoint, paying its restore, as the queue manager
restarts it (the configuration's `[restarts]`), or has failed for good. Their loss is kept
apart from preemptions' (`JobFailures.lost_gpu_s`), charged when the job leaves. A hung job
told to go before the hang is noticed cannot save either: its loss up to the notice is the
hang's, the rest of its grace and its restore the notice's.

With each node's NVLink islands (`SimOptions.node_topology`, `preemptible.sim.gpu_ids`) every
run also holds GPU ids, picked, grown, shrunk and freed in step with the core's placement; a run
whose ids span islands on some node progresses `1 + split_slowdown` times slower, and what it
spends on that for the work it keeps is lost (`JobGpus.slowdown_lost_gpu_s`).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from preemptible.errors import ConfigError, TraceFormatError
from preemptible.queue.core import (
    Admit,
    Job,
    Policy,
    Preempt,
    PreemptKind,
    QueueConfig,
    Resize,
    Resources,
    RunningJob,
    Tier,
)
from preemptible.queue.core.elastic import kept
from preemptible.queue.core.negotiation import grace_seconds
from preemptible.queue.scheduler_loop import Leaving, Shell
from preemptible.sim.failures import FailureKind, FailureModel, FailureRates, JobFailures
from preemptible.sim.gpu_ids import GpuIds, JobGpus, NodeTopology
from preemptible.sim.trace import TraceJob

_ARRIVE, _EXIT, _FINISH, _SHRUNK = 0, 1, 2, 3
_FAIL, _HUNG, _KILLED, _REJOIN = 4, 5, 6, 7
"""Failure events come last at an instant: a run that ends when it would fail has ended."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimOptions:
    """How jobs behave under preemption, how often they fail and how often the scheduler
    runs."""

    checkpoint_mode: str = "aware"
    """"aware" (saves on notice, the SDK) or "periodic" (plain periodic checkpoints only)."""
    checkpoint_interval_s: float = 1800.0
    """Period of regular checkpoints, for both modes."""
    default_checkpoint_s: float = 60.0
    """Save (and restore) cost for jobs whose trace row gives none."""
    cycle_interval_s: float = 10.0
    """Minimum virtual time between cycles (0: after every instant with events). Live
    schedulers batch too (kueue's queue heap, SLURM's sched_min_interval and 30 s backfill)."""
    preemption_retry_s: float = 120.0
    """After a victim search finds nothing, the same kind of job waits this long to retry."""
    timeline_bins: int = 240
    """Resolution of the per-queue utilisation timeline (for plots)."""
    failures: FailureRates = field(default_factory=FailureRates)
    """How often jobs crash and hang (never, by default)."""
    node_topology: NodeTopology = field(default_factory=NodeTopology)
    """Each node's NVLink islands and how jobs get GPU ids in them (none, by default: placement
    by count only)."""


@dataclass(slots=True)
class JobHistory:
    """What happened to one job."""

    trace: TraceJob
    saved_s: float = 0.0
    """Progress safely checkpointed, in seconds of work."""
    pending_since: float = 0.0
    wait_s: float = 0.0
    """Total time spent pending (first wait plus waits after requeues)."""
    first_start_s: float | None = None
    end_s: float | None = None
    run_start_s: float = 0.0
    run_restore_s: float = 0.0
    run_token: int = 0
    preemptions: int = 0
    """Every notice that sent it away, moves included."""
    moves: int = 0
    """Of those, notices that moved it to another node (`Preempt.restart_on`)."""
    lost_gpu_s: float = 0.0
    admitted_gpu_s: float = 0.0
    runs: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of every run, for timelines and windowed metrics."""
    lost_log: list[tuple[float, float, PreemptKind]] = field(default_factory=list)
    """(time, GPU-seconds, the rule that sent the notice) of every preemption's loss."""
    last_preempted_at: float | None = None
    run_rate: float = 1.0
    """Progress per second of this run: its GPUs over the GPUs it asks for."""
    run_slowdown: float = 1.0
    """How many times slower this run progresses for its placement: `1 + split_slowdown`
    when its GPUs span islands on some node (`preemptible.sim.gpu_ids`), else 1."""
    run_gpus: list[int] = field(default_factory=list)
    """GPUs held in each of `runs` (a resize splits a run)."""
    hold_gpus: int = 0
    """GPUs it holds now (while running)."""
    shrinks: int = 0
    grows: int = 0
    resize_lost_gpu_s: float = 0.0
    """Of `lost_gpu_s`, what its resizes cost."""
    resize_log: list[tuple[float, float, str]] = field(default_factory=list)
    """(time, GPU-seconds, "shrink" or "grow") of every resize."""
    last_resized_at: float | None = None
    runs_open_s: float = 0.0
    """Start of the part of the current run held at `hold_gpus`."""
    shrink_to: tuple[int, tuple[tuple[int, int], ...]] | None = None
    """(GPUs, placement) of a shrink sent and not yet saved."""
    failures: JobFailures | None = None
    """Its crashes and hangs (None: the run models none)."""
    gpu_ids: JobGpus | None = None
    """The GPU ids it holds and how its runs were placed (None: the run models no ids)."""


@dataclass(slots=True)
class SimResult:
    """Per-job records and the aggregates the metrics and plots need."""

    policy: str
    records: list[JobHistory]
    gpus: int
    weights: dict[str, float]
    start_s: float
    end_s: float
    sim_seconds: float
    cycles: int
    fragmentation_mean: float
    timeline_edges: list[float] = field(default_factory=list)
    timeline_gpu_s: dict[str, list[float]] = field(default_factory=dict)
    timeline_lost_gpu_s: dict[str, list[float]] = field(default_factory=dict)
    """GPU-seconds lost per queue and bin, charged at the preemption (as `lost_gpu_s`)."""
    timeline_preemptions: dict[str, list[int]] = field(default_factory=dict)
    """Preemptions (moves included) per queue and bin."""
    timeline_failure_lost_gpu_s: dict[str, list[float]] = field(default_factory=dict)
    """GPU-seconds lost to crashes and hangs per queue and bin, charged when the job left."""
    models_failures: bool = False
    """Whether jobs could crash and hang in this run (`SimOptions.failures`)."""
    island_fragmentation: float | None = None
    """Share of idle GPU-seconds in partly used NVLink islands (None: no islands modelled,
    `SimOptions.node_topology`)."""


class Simulator:
    """Replays a trace through one policy. One instance per run."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        config: QueueConfig,
        policy: Policy,
        options: SimOptions | None = None,
        *,
        progress: Callable[[int, int], None] | None = None,
    ):
        if config.gpus_auto:
            raise TraceFormatError('the simulator needs a number for cluster.gpus, not "auto"')
        known = {q.name for q in config.queues}
        unknown = sorted({j.queue for j in jobs} - known)
        if unknown:
            raise TraceFormatError(
                f"the trace uses queue {unknown[0]!r} which the configuration does not define "
                f"(queues: {', '.join(sorted(known)) or 'none'}); add a [[queues]] entry"
            )
        cl = config.cluster
        for j in jobs:
            smallest = j.min_gpus if j.min_gpus is not None else j.gpus
            too_big = smallest > cl.gpus or (cl.cpus and j.cpus > cl.cpus)
            if too_big or (cl.memory_gb and j.memory_gb > cl.memory_gb):
                raise TraceFormatError(
                    f"job {j.job_id!r} asks for more than the whole cluster "
                    f"({j.gpus} GPUs of {cl.gpus}); enlarge the cluster or drop the job"
                )
        if options is None:
            options = SimOptions()
        if options.checkpoint_mode not in ("aware", "periodic"):
            raise ConfigError(
                f"SimOptions.checkpoint_mode must be 'aware' or 'periodic', "
                f"not {options.checkpoint_mode!r}"
            )
        self.jobs = jobs
        self.config = config
        self.policy = policy
        self.options = options
        self.progress = progress
        self.shell = Shell(config, policy, preemption_retry_s=options.preemption_retry_s)
        self.state = self.shell.state
        self.tracker = self.shell.tracker
        self.records: dict[str, JobHistory] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.elastic = any(j.min_gpus is not None for j in jobs)
        """Whether any job is elastic: then cycles run also while nothing is pending, when a
        shrunk job might grow on idle GPUs."""
        self.failure_model = (
            FailureModel(options.failures, config.restarts) if options.failures.on else None
        )
        if options.node_topology.on:
            options.node_topology.check(config.cluster)
        self.gpu_ids: GpuIds | None = None
        """Free GPU ids per node, when islands are modelled (made at the trace's start)."""

    # --- event plumbing ----------------------------------------------------------------------

    def _push(self, at: float, kind: int, job_id: str, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, kind, self._seq, job_id, token))

    def run(self) -> SimResult:
        """Simulate until every job has completed."""
        wall = time.perf_counter()
        for tj in self.jobs:
            self.records[tj.job_id] = JobHistory(trace=tj)
            self._push(tj.submit_s, _ARRIVE, tj.job_id)
        start = min((tj.submit_s for tj in self.jobs), default=0.0)
        self.tracker.advance(start)
        layout = self.options.node_topology
        if layout.on:
            nodes = self.config.cluster.nodes or 0
            self.gpu_ids = GpuIds(nodes, layout, start_s=start)
        total = len(self.jobs)
        done = cycles = 0
        frag_sum = 0.0
        last_cycle = -float("inf")
        events = self.events
        interval = self.options.cycle_interval_s
        report_every = max(1, total // 200)
        while events:
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, _, job_id, token = heapq.heappop(events)
                if kind == _ARRIVE:
                    self._arrive(job_id, now)
                elif kind == _FINISH:
                    if self._finish(job_id, now, token):
                        done += 1
                        if self.progress and done % report_every == 0:
                            self.progress(done, total)
                elif kind == _SHRUNK:
                    self._shrunk(job_id, now, token)
                elif kind >= _FAIL:
                    if self._failure_event(kind, job_id, now, token):
                        done += 1
                else:
                    self._exit(job_id, now, token)
            if not self.state.pending and not (self.elastic and self._may_grow()):
                continue
            nxt = last_cycle + interval
            if interval and now < nxt:
                if not events or events[0][0] > nxt:
                    self._push(nxt, _EXIT, "", -1)  # a tick: wakes the loop for the next cycle
                continue
            last_cycle = now
            cycles += 1
            self._rank_victims()
            # A job within its nominal quota may be owed capacity that this very cycle gave to
            # a borrower: run again at once so that it can reclaim (the nominal guarantee).
            results = self.shell.cycles(now, self)
            for result in results:
                frag_sum += result.fragmentation
            cycles += len(results) - 1
            wake_at = results[-1].wake_at
            if wake_at is not None and (not events or events[0][0] > wake_at):
                self._push(wake_at, _EXIT, "", -1)  # a job waits to reclaim until then
        if self.progress:
            self.progress(total, total)
        end = max((r.end_s or 0.0) for r in self.records.values()) if self.records else 0.0
        outcome = SimResult(
            policy=self.policy.name,
            records=list(self.records.values()),
            gpus=self.config.cluster.gpus,
            weights={q.name: q.weight for q in self.config.queues},
            start_s=start,
            end_s=end,
            sim_seconds=time.perf_counter() - wall,
            cycles=cycles,
            fragmentation_mean=frag_sum / cycles if cycles else 0.0,
            models_failures=self.failure_model is not None,
            island_fragmentation=None if self.gpu_ids is None else self.gpu_ids.fragmentation(end),
        )
        _timeline(outcome, self.options.timeline_bins)
        return outcome

    def _may_grow(self) -> bool:
        state = self.state
        if state.used.gpus >= state.cluster.gpus:
            return False
        return any(rj.gpus is not None and not rj.terminating for rj in state.running.values())

    # --- events ------------------------------------------------------------------------------

    def _checkpoint_s(self, rec: JobHistory) -> float:
        """The job's save (and restore) time."""
        tj = rec.trace
        return tj.checkpoint_s if tj.checkpoint_s is not None else self.options.default_checkpoint_s

    def _core_job(self, rec: JobHistory) -> Job:
        tj = rec.trace
        ckpt = self._checkpoint_s(rec)
        estimate = None
        if tj.estimate_s is not None:
            estimate = max(60.0, tj.estimate_s - rec.saved_s)
        return Job(
            id=tj.job_id,
            queue=tj.queue,
            request=Resources(gpus=tj.gpus, cpus=tj.cpus, memory_gb=tj.memory_gb),
            tier=Tier(tj.tier),
            submitted_at=tj.submit_s,
            estimate_s=estimate,
            save_s=ckpt,
            restore_s=ckpt if rec.saved_s > 0 else 0.0,
            checkpoint_interval_s=self.options.checkpoint_interval_s,
            checkpoint_on_notice=self.options.checkpoint_mode == "aware",
            last_preempted_at=rec.last_preempted_at,
            preemptions=rec.preemptions,
            min_gpus=tj.min_gpus,
            gpus_multiple=tj.gpus_multiple,
            last_resized_at=rec.last_resized_at,
        )

    def _arrive(self, job_id: str, now: float) -> None:
        rec = self.records[job_id]
        if self.failure_model is not None:
            rec.failures = self.failure_model.new_job(job_id)
        if self.gpu_ids is not None:
            rec.gpu_ids = JobGpus()
        rec.pending_since = now
        self.state.submit(self._core_job(rec))

    def _finish(self, job_id: str, now: float, token: int) -> bool:
        rec = self.records[job_id]
        if token != rec.run_token or rec.end_s is not None or job_id not in self.state.running:
            return False
        self._release(rec, now)
        self._keep_work(rec, now, rec.trace.duration_s)
        rec.saved_s = rec.trace.duration_s
        rec.end_s = now
        return True

    def _exit(self, job_id: str, now: float, token: int) -> None:
        if token < 0:
            return
        rec = self.records[job_id]
        if token != rec.run_token or job_id not in self.state.running:
            return
        self._release(rec, now)
        rec.pending_since = now
        self.state.submit(self._core_job(rec))

    def _release(self, rec: JobHistory, now: float) -> None:
        self.shell.release(rec.trace.job_id, now)
        rec.shrink_to = None
        self._hold(rec, now, 0)
        if self.gpu_ids is not None and rec.gpu_ids is not None:
            self.gpu_ids.release(rec.gpu_ids, now)

    def _hold(self, rec: JobHistory, now: float, gpus: int) -> None:
        """From `now` the job holds `gpus` GPUs: close the part of its run held so far."""
        start = rec.runs_open_s
        rec.admitted_gpu_s += rec.hold_gpus * (now - start)
        if rec.gpu_ids is not None and rec.gpu_ids.split:
            rec.gpu_ids.split_gpu_s += rec.hold_gpus * (now - start)
        rec.runs.append((start, now))
        rec.run_gpus.append(rec.hold_gpus)
        rec.runs_open_s = now
        rec.hold_gpus = gpus

    # --- cycle -------------------------------------------------------------------------------

    # --- what a run does (`shell.Runs`) ----------------------------------------------------

    def started(self, admit: Admit, running: RunningJob, now: float) -> None:
        """A run starts: it ends after its restore and its remaining work."""
        job = running.job
        rec = self.records[job.id]
        rec.wait_s += now - rec.pending_since
        if rec.first_start_s is None:
            rec.first_start_s = now
        rec.run_start_s = rec.runs_open_s = now
        rec.run_restore_s = job.restore_s
        rec.hold_gpus = running.size
        rec.run_rate = running.size / job.request.gpus if job.request.gpus else 1.0
        if self.gpu_ids is not None and rec.gpu_ids is not None:
            self.gpu_ids.place(rec.gpu_ids, running.placement, now)
            rec.run_slowdown = self._slowdown(rec.gpu_ids.split)
        rec.run_token += 1
        self._push(self._finish_at(rec), _FINISH, job.id, rec.run_token)
        if rec.failures is not None:
            rec.failures.attempt_saved_s = rec.saved_s
            self._arm(rec, now, running.size)

    def _finish_at(self, rec: JobHistory) -> float:
        """When the current run completes, if nothing interrupts it (a hung run never does)."""
        if _hung_at(rec) is not None:
            return float("inf")
        remaining = rec.trace.duration_s - rec.saved_s
        if rec.run_slowdown != 1.0:
            remaining *= rec.run_slowdown
        if rec.run_rate != 1.0:
            remaining /= rec.run_rate
        return rec.run_start_s + rec.run_restore_s + remaining

    def _progress_at(self, rec: JobHistory, t: float) -> float:
        worked = max(0.0, t - rec.run_start_s - rec.run_restore_s)
        if rec.run_slowdown != 1.0:
            worked /= rec.run_slowdown
        return rec.saved_s + (worked if rec.run_rate == 1.0 else rec.run_rate * worked)

    def _checkpointed_at(self, rec: JobHistory, t: float) -> tuple[float, float]:
        """(progress saved, time from which work is unsaved) by regular checkpoints up to t.

        Without a checkpoint in this run that time is the end of its restore, not its start:
        the restore was charged at the preemption before, with the lost work. A hung run
        checkpoints nothing after its step stood still.
        """
        t = _until_hang(rec, t)
        interval = self.options.checkpoint_interval_s
        worked = max(0.0, t - rec.run_start_s - rec.run_restore_s)
        k = int(worked // interval) if interval else 0
        done = k * interval if rec.run_rate == 1.0 else rec.run_rate * k * interval
        if rec.run_slowdown != 1.0:
            done /= rec.run_slowdown
        progress = min(rec.saved_s + done, rec.trace.duration_s)
        return progress, rec.run_start_s + rec.run_restore_s + k * interval

    def noticed(self, notice: Preempt, running: RunningJob, now: float) -> Leaving:
        """A notice: the job saves and leaves, or is killed at the end of its grace; what it
        loses is charged now."""
        job = running.job
        rec = self.records[job.id]
        self._disarm(rec, now)
        if rec.shrink_to is not None:
            return self._noticed_while_shrinking(notice, running, now)
        gpus = max(running.size, 1)
        finish_at = self._finish_at(rec)
        save = job.save_s
        if self._saves_within(rec, save, notice.grace_s):
            exit_at = now + save
            new_saved = self._progress_at(rec, now)
            lost = gpus * save  # the save now
        else:
            exit_at = now if self.options.checkpoint_mode == "periodic" else now + notice.grace_s
            new_saved, saved_at = self._checkpointed_at(rec, now)
            lost = gpus * (exit_at - saved_at) - self._end_hang(rec, now, gpus)
        if new_saved > 0:
            lost += gpus * save  # the restore at its next start (`_core_job`: none from zero)
        if finish_at <= exit_at:
            # It completes before it would have left: no work lost, no preemption counted.
            return Leaving(at=finish_at, preempted=False)
        if notice.restart_on:
            rec.moves += 1
        rec.preemptions += 1
        rec.last_preempted_at = now
        rec.lost_gpu_s += lost
        rec.lost_log.append((now, lost, notice.kind))
        self._keep_work(rec, now, new_saved)
        rec.saved_s = new_saved
        rec.run_token += 1
        self._push(exit_at, _EXIT, job.id, rec.run_token)
        return Leaving(at=exit_at)

    def _noticed_while_shrinking(self, notice: Preempt, running: RunningJob, now: float) -> Leaving:
        """A notice to a job whose shrink is saving: it leaves when that save ends instead of
        restarting smaller. The shrink's restart is cancelled, and the restore charged for it
        with it; what it loses now is the restore of all it held at its next start."""
        job = running.job
        rec = self.records[job.id]
        assert rec.shrink_to is not None
        gpus_after, _ = rec.shrink_to
        rec.shrink_to = None
        exit_at = rec.run_start_s  # the shrink's restart
        refund = gpus_after * rec.run_restore_s
        at, resize_lost, kind = rec.resize_log[-1]
        rec.resize_log[-1] = (at, resize_lost - refund, kind)
        rec.resize_lost_gpu_s -= refund
        lost = max(running.size, 1) * job.save_s if rec.saved_s > 0 else 0.0
        rec.lost_gpu_s += lost - refund
        if notice.restart_on:
            rec.moves += 1
        rec.preemptions += 1
        rec.last_preempted_at = now
        rec.lost_log.append((now, lost, notice.kind))
        rec.run_token += 1
        self._push(exit_at, _EXIT, job.id, rec.run_token)
        return Leaving(at=exit_at)

    def resized(self, resize: Resize, running: RunningJob, now: float) -> None:
        """A resize: the job saves (within its grace, or loses its unsaved work as for a
        notice) and restarts at the new size, paying its restore."""
        job = running.job
        rec = self.records[job.id]
        self._disarm(rec, now)
        finish_at = self._finish_at(rec)
        save = job.save_s
        if self._saves_within(rec, save, resize.grace_s):
            restart_at = now + save
            new_saved = self._progress_at(rec, now)
            unsaved = running.size * save
        else:
            restart_at = now if self.options.checkpoint_mode == "periodic" else now + resize.grace_s
            new_saved, saved_at = self._checkpointed_at(rec, now)
            unsaved = running.size * (restart_at - saved_at)
            unsaved -= self._end_hang(rec, now, running.size)
        if resize.kind == "grow":
            self._hold(rec, now, resize.gpus)  # the shell gave it the GPUs at once
            self._resize_ids(rec, now)
        if finish_at <= restart_at:
            return  # it completes first: its finish stands, nothing is lost
        restore = save if new_saved > 0 else 0.0
        lost = unsaved + resize.gpus * restore
        rec.lost_gpu_s += lost
        rec.resize_lost_gpu_s += lost
        rec.resize_log.append((now, lost, resize.kind))
        rec.last_resized_at = now
        if resize.kind == "grow":
            rec.grows += 1
        else:
            rec.shrinks += 1
        self._keep_work(rec, now, new_saved)
        rec.saved_s = new_saved
        rec.run_start_s = restart_at
        rec.run_restore_s = restore
        rec.run_rate = resize.gpus / job.request.gpus
        rec.run_slowdown = self._slowdown_after(rec, resize, running)
        rec.run_token += 1
        self._push(self._finish_at(rec), _FINISH, job.id, rec.run_token)
        if resize.kind == "shrink":
            rec.shrink_to = (resize.gpus, resize.placement)
            self._push(restart_at, _SHRUNK, job.id, rec.run_token)
        self._arm(rec, restart_at, resize.gpus)

    def _saves_within(self, rec: JobHistory, save_s: float, grace_s: float) -> bool:
        """Whether the job saves on a notice with this grace: an aware job whose save fits,
        unless it is hung (its step boundary never comes)."""
        aware = self.options.checkpoint_mode == "aware"
        return aware and save_s <= grace_s and _hung_at(rec) is None

    def _shrunk(self, job_id: str, now: float, token: int) -> None:
        """A shrunk job has saved: the GPUs it gave up are free."""
        rec = self.records[job_id]
        if token != rec.run_token or rec.shrink_to is None or job_id not in self.state.running:
            return
        gpus, placement = rec.shrink_to
        rec.shrink_to = None
        self.shell.shrunk(job_id, gpus, now, placement or None)
        self._hold(rec, now, gpus)
        self._resize_ids(rec, now)
        rec.last_resized_at = now  # as the core's state has it: a shrink from its restart

    # --- GPU ids and islands (`preemptible.sim.gpu_ids`) -------------------------------------

    def _slowdown(self, split: bool) -> float:
        """How many times slower a run progresses, split over islands or not."""
        factor = self.options.node_topology.split_slowdown
        return 1.0 + factor if split and factor else 1.0

    def _resize_ids(self, rec: JobHistory, now: float) -> None:
        """Its ids follow the placement the core's state now gives it (a grow sent, a shrink
        saved; none when it was told to go meanwhile)."""
        if self.gpu_ids is None or rec.gpu_ids is None:
            return
        placement = self.state.running[rec.trace.job_id].placement
        self.gpu_ids.resize(rec.gpu_ids, placement, now)

    def _slowdown_after(self, rec: JobHistory, resize: Resize, running: RunningJob) -> float:
        """The restart's slowdown: on the ids a grow took at its notice, or on those a shrink
        will keep (it holds all until it has saved)."""
        if self.gpu_ids is None or rec.gpu_ids is None:
            return 1.0
        if resize.kind == "grow":
            return self._slowdown(rec.gpu_ids.split)
        after = resize.placement or kept(running, resize.gpus)
        return self._slowdown(self.gpu_ids.kept_split(rec.gpu_ids, after))

    def _keep_work(self, rec: JobHistory, now: float, saved_s: float) -> None:
        """Progress up to `saved_s` is kept: what a split run spent beyond it on its slowdown
        is lost (its GPUs x the work x the slowdown less 1: work is measured at full size)."""
        if rec.run_slowdown == 1.0 or rec.gpu_ids is None:
            return
        lost = rec.trace.gpus * max(0.0, saved_s - rec.saved_s) * (rec.run_slowdown - 1.0)
        rec.gpu_ids.slowdown_lost_gpu_s += lost
        rec.gpu_ids.slowdown_log.append((now, lost))

    def _rank_victims(self) -> None:
        """Before a cycle, as the queue manager does: among victims that lose as much, one whose
        going frees a whole island goes first (`ClusterState.victim_rank`). Only jobs on nodes
        whose free ids changed are ranked again; with the lowest ids nothing is ranked."""
        ids = self.gpu_ids
        if ids is None or not ids.dirty or not ids.placer.known:
            return
        ranks = self.state.victim_rank
        for node in ids.dirty:
            for job_id in self.state.node_jobs[node]:
                held = self.records[job_id].gpu_ids
                if held is not None:
                    ranks[job_id] = 0 if ids.frees_an_island(held) else 1
        for job_id in [j for j in ranks if j not in self.state.running]:
            del ranks[job_id]
        ids.dirty.clear()

    # --- crashes and hangs (`preemptible.sim.failures`) ---------------------------------------

    def _arm(self, rec: JobHistory, since: float, gpus: int) -> None:
        """The run may fail from `since` on `gpus` GPUs: schedule its next failure."""
        if self.failure_model is None or rec.failures is None:
            return
        at = self.failure_model.arm(rec.failures, since, gpus)
        if at is not None:
            self._push(at, _FAIL, rec.trace.job_id, rec.failures.token)

    def _disarm(self, rec: JobHistory, now: float) -> None:
        """The run is told to go or resize: its scheduled failure is off."""
        if self.failure_model is not None and rec.failures is not None:
            self.failure_model.disarm(rec.failures, now)

    def _failure_event(self, kind: int, job_id: str, now: float, token: int) -> bool:
        """A failure strikes, a hang is noticed or killed, or a back-off ends. True when the
        job has failed for good: it is done, its remaining work never runs."""
        rec = self.records[job_id]
        model, failures = self.failure_model, rec.failures
        assert model is not None and failures is not None
        if kind == _REJOIN:
            self.state.submit(self._core_job(rec))
            return False
        running = self.state.running.get(job_id)
        if token != failures.token or running is None:
            return False  # stale: the run left, or was told to go or resize
        if kind == _KILLED:
            return self._fail_run(rec, now, FailureKind.HANG)
        if kind == _HUNG:
            grace = grace_seconds(running.job.save_s, self.config.preemption)
            self.state.mark_terminating(job_id, expected_end=now + grace)
            self._push(now + grace, _KILLED, job_id, failures.token)
            return False
        if model.strike(failures, now) is FailureKind.CRASH:
            return self._fail_run(rec, now, FailureKind.CRASH)
        rec.run_token += 1  # a hung run never finishes
        self._push(now + model.hang_bound_s, _HUNG, job_id, failures.token)
        return False

    def _fail_run(self, rec: JobHistory, now: float, kind: FailureKind) -> bool:
        """The run crashed, or was killed hung: it loses its work since its last checkpoint
        and frees its GPUs; then it waits its back-off and rejoins its queue, or has failed for
        good (True)."""
        model, failures = self.failure_model, rec.failures
        assert model is not None and failures is not None
        gpus = rec.hold_gpus
        new_saved, saved_at = self._checkpointed_at(rec, now)
        lost = gpus * max(0.0, now - saved_at)
        failures.hung_at = None
        rec.run_token += 1
        self._release(rec, now)
        self._keep_work(rec, now, new_saved)
        rec.saved_s = new_saved
        limit = self.config.restart_limit(rec.trace.queue)
        verdict = model.verdict(failures, limit, progressed=new_saved > failures.attempt_saved_s)
        if verdict.gave_up is None:
            if new_saved > 0:
                lost += gpus * self._checkpoint_s(rec)  # the restore at its restart
            rec.pending_since = now  # the back-off counts as waiting, as in the queue manager
            self._push(now + verdict.backoff_s, _REJOIN, rec.trace.job_id)
        else:
            failures.gave_up = verdict.gave_up
            rec.end_s = now
        _charge_failure(failures, now, lost, kind)
        return verdict.gave_up is not None

    def _end_hang(self, rec: JobHistory, now: float, gpus: int) -> float:
        """A hung job told to go or resize before the hang was noticed: charge the hang what
        is lost up to now (from the last checkpoint), and return it."""
        failures = rec.failures
        if failures is None or failures.hung_at is None:
            return 0.0
        _, saved_at = self._checkpointed_at(rec, now)
        lost = gpus * max(0.0, now - saved_at)
        failures.hung_at = None
        _charge_failure(failures, now, lost, FailureKind.HANG)
        return lost


def _hung_at(rec: JobHistory) -> float | None:
    """When the job's current run hung (None: it is not hung)."""
    return None if rec.failures is None else rec.failures.hung_at


def _until_hang(rec: JobHistory, t: float) -> float:
    """`t`, or the moment the run hung if that came first: a hung run makes no progress."""
    hung = _hung_at(rec)
    return t if hung is None else min(t, hung)


def _charge_failure(failures: JobFailures, now: float, lost: float, kind: FailureKind) -> None:
    failures.lost_gpu_s += lost
    failures.log.append((now, lost, kind))


def _timeline(result: SimResult, bins: int) -> None:
    """GPU-seconds held, GPU-seconds lost and preemptions per queue in equal time bins (for
    the utilisation, share, goodput and preemption plots)."""
    span = max(result.end_s - result.start_s, 1.0)
    width = span / bins
    result.timeline_edges = [result.start_s + i * width for i in range(bins + 1)]
    lost: dict[str, list[float]] = {}
    preemptions: dict[str, list[int]] = {}
    for rec in result.records:
        for at, amount, _ in rec.lost_log:
            i = min(int((at - result.start_s) / width), bins - 1)
            lost.setdefault(rec.trace.queue, [0.0] * bins)[i] += amount
            preemptions.setdefault(rec.trace.queue, [0] * bins)[i] += 1
    result.timeline_lost_gpu_s = lost
    result.timeline_preemptions = preemptions
    failed: dict[str, list[float]] = {}
    for rec in result.records:
        for at, amount, _ in rec.failures.log if rec.failures is not None else ():
            i = min(int((at - result.start_s) / width), bins - 1)
            failed.setdefault(rec.trace.queue, [0.0] * bins)[i] += amount
    result.timeline_failure_lost_gpu_s = failed
    series: dict[str, list[float]] = {}
    for rec in result.records:
        for (start, end), g in zip(rec.runs, rec.run_gpus, strict=True):
            row = series.setdefault(rec.trace.queue, [0.0] * bins)
            i = int((start - result.start_s) / width)
            while start < end and i < bins:
                edge = result.start_s + (i + 1) * width
                seg_end = min(end, edge)
                row[i] += g * (seg_end - start)
                start = seg_end
                i += 1
    result.timeline_gpu_s = series
