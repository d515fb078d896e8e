"""The scheduler's state between cycles, kept incrementally, and the snapshot a cycle reads.

Rebuilding per-queue totals, node occupancy and the pending order from scratch each cycle costs
O(jobs) and dominated a naive simulator. `ClusterState` keeps them up to date as jobs are
submitted, started and finished, so a cycle costs what it examines. It is plain data with methods
(no I/O, no clock), shared by the live service and the simulator; a cycle only reads it through
a `Snapshot` and never mutates it.

Pending jobs are grouped by (queue, tier, request shape), each group in submit order. Every
ordering criterion is the same for a whole group except age, and age only grows with waiting,
so the oldest job of a group always comes first: a cycle merges the group heads instead of
sorting all pending jobs, and a group whose head cannot fit is skipped as a whole.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from preemptible.errors import ConfigError
from preemptible.queue.core import elastic
from preemptible.queue.core.model import (
    Cluster,
    Job,
    Queue,
    Resources,
    RunningJob,
    SearchKey,
    Tier,
)
from preemptible.queue.core.placement import NodePool, Placement
from preemptible.queue.core.resources import Amounts
from preemptible.queue.core.victim_index import VictimIndex

GroupKey = tuple[str, int, int, float, float]
"""(queue, tier rank, gpus, cpus, memory) of a pending group (`group_key`)."""


def group_key(job: Job) -> GroupKey:
    """(queue, tier rank, gpus, cpus, memory): jobs with the same key differ only in age."""
    r = job.request
    return (job.queue, job.tier.rank, r.gpus, r.cpus, r.memory_gb)


class PendingGroup:
    """Pending jobs of one group, in (submitted_at, id) order."""

    __slots__ = ("jobs", "keys")

    def __init__(self) -> None:
        self.keys: list[tuple[float, str]] = []
        self.jobs: list[Job] = []

    def add(self, job: Job) -> None:
        key = (job.submitted_at, job.id)
        i = bisect.bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.jobs.insert(i, job)

    def remove(self, job: Job) -> None:
        i = bisect.bisect_left(self.keys, (job.submitted_at, job.id))
        if i < len(self.keys) and self.jobs[i].id == job.id:
            del self.keys[i]
            del self.jobs[i]


class ClusterState:
    """Everything a cycle needs, maintained incrementally by the shell (service or simulator)."""

    def __init__(self, cluster: Cluster, queues: Iterable[Queue]):
        self.cluster = cluster
        self.queues: dict[str, Queue] = {q.name: q for q in queues}
        self.pending: dict[str, Job] = {}
        self.groups: dict[GroupKey, PendingGroup] = {}
        self.running: dict[str, RunningJob] = {}
        self.running_by_queue: dict[str, dict[str, RunningJob]] = {n: {} for n in self.queues}
        """The same running jobs, per queue (preemption scans only eligible queues)."""
        self.staying: dict[str, tuple[dict[str, RunningJob], ...]] = {
            n: tuple({} for _ in Tier) for n in self.queues
        }
        """Per queue and tier rank, its running jobs not told to go: those a victim search may
        take, kept between cycles (a search for a tier visits the tiers below it alone)."""
        self.alloc: dict[str, Amounts] = {name: Amounts() for name in self.queues}
        """Per queue: GPUs, CPUs, memory held (terminating jobs included)."""
        self.used = Amounts()
        """Held by all running jobs together."""
        self.leaving: dict[str, Amounts] = {name: Amounts() for name in self.queues}
        """Per queue: the part of `alloc` held by jobs that were told to go. What a queue
        borrows is judged without it, or a queue whose borrowed job is already leaving would
        still look like a borrower and lose work within its nominal quota."""
        self.tier_gpus: list[int] = [0, 0, 0, 0]
        """GPUs held by non-terminating running jobs, per tier rank."""
        self.loans: dict[str, set[str]] = {}
        """Reserved job id -> ids of the non-terminating running jobs on loan to it (`loan_for`)."""
        self.pool: NodePool | None = (
            NodePool(cluster.nodes, cluster.gpus_per_node)
            if cluster.nodes and cluster.gpus_per_node
            else None
        )
        self.node_jobs: list[set[str]] = [set() for _ in range(cluster.nodes or 0)]
        self.node_leaving: dict[int, int] = {}
        """Per node with any: GPUs there held by jobs that were told to go (free soon)."""
        self.ends: list[tuple[float, str]] = []
        """(expected end, job id) of running jobs, sorted, for reservations."""
        self._end_of: dict[str, float] = {}
        self.recent_preemptions: dict[str, deque[float]] = {n: deque() for n in self.queues}
        """Per victim queue, times of preemptions (the shell may trim entries older than 1 h)."""
        self.nominated: dict[str, float] = {}
        """Preemptor job id -> when its victims were told to go (oldest first)."""
        self.nominated_nodes: dict[str, Placement] = {}
        """Preemptor job id -> the node GPUs its victims are freeing for it (with nodes)."""
        self.moving: set[str] = set()
        """Nominated jobs that are moving (`Preempt.restart_on`): held from notice to restart."""
        self.preemption_backoff: dict[SearchKey, float] = {}
        """No victim search for this kind of job before this time (a recent one failed)."""
        self.shrinking: dict[str, tuple[int, Resources, Placement]] = {}
        """Running job id -> (size after, what it gives up, on which nodes) of a shrink sent
        and not yet completed (`begin_shrink`)."""
        self.victim_rank: dict[str, int] = {}
        """Running job id -> 0 when its going would free a whole NVLink island, else 1: among
        victims that lose as much, the first go first (set by the shell before each cycle,
        `topology.py`; empty: all alike)."""
        self.victim_index = VictimIndex()
        """Running job id -> what pricing it as a victim needs that stays the same while it
        runs, kept between cycles (`victim_index.py`)."""

    # --- pending ------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Add a pending job (new or requeued)."""
        if job.queue not in self.queues:
            raise ConfigError(
                f"job {job.id!r} names queue {job.queue!r}, which is not configured "
                f"(queues: {', '.join(self.queues) or 'none'})"
            )
        self.pending[job.id] = job
        key = group_key(job)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = PendingGroup()
        group.add(job)

    def withdraw(self, job_id: str) -> Job:
        """Remove a pending job (admitted or cancelled) and return it."""
        job = self.pending.pop(job_id)
        key = group_key(job)
        group = self.groups[key]
        group.remove(job)
        if not group.jobs:
            del self.groups[key]
        self.nominated.pop(job_id, None)
        self.nominated_nodes.pop(job_id, None)
        self.moving.discard(job_id)
        self._end_loans(job_id)
        return job

    def _end_loans(self, job_id: str) -> None:
        """The job the loans were made to has started (or left): they become ordinary work,
        so that it cannot take them back as loans should it be preempted and requeued."""
        for loan_id in self.loans.pop(job_id, ()):
            running = self.running[loan_id]
            self._put_running(dataclasses.replace(running, loan_for=None))

    def refresh(self, job: Job) -> None:
        """Replace a pending or running job's record by `job`, the same job with new facts
        (its measured cost, its last checkpoint): queue, tier and request must not change."""
        pending = self.pending.get(job.id)
        if pending is not None:
            group = self.groups[group_key(pending)]
            i = bisect.bisect_left(group.keys, (pending.submitted_at, pending.id))
            if group_key(job) != group_key(pending) or job.submitted_at != pending.submitted_at:
                raise ConfigError(f"job {job.id!r}: refresh may not move it to another group")
            group.jobs[i] = job
            self.pending[job.id] = job
            return
        running = self.running[job.id]
        if group_key(job) != group_key(running.job):
            raise ConfigError(f"job {job.id!r}: refresh may not change its queue, tier or request")
        self._put_running(dataclasses.replace(running, job=job))

    def checkpointed(self, job_id: str, at: float) -> None:
        """A running job reported a committed checkpoint at `at`: less work is at stake."""
        running = self.running[job_id]
        self._put_running(dataclasses.replace(running, last_checkpoint_at=at))

    def _put_running(self, running: RunningJob) -> None:
        """Record `running`, new or in place of the same job's record, in each view of them."""
        job = running.job
        self.running[job.id] = running
        self.running_by_queue[job.queue][job.id] = running
        staying = self.staying[job.queue][job.tier.rank]
        if running.terminating:
            staying.pop(job.id, None)
        else:
            staying[job.id] = running

    # --- running ------------------------------------------------------------------------------

    def start(self, running: RunningJob, *, expected_end: float) -> None:
        """Record that a job holds resources from now on."""
        job = running.job
        self._put_running(running)
        r = running.held
        self.alloc[job.queue].add(r)
        self.used.add(r)
        if not running.terminating:
            self.tier_gpus[job.tier.rank] += r.gpus
            if running.loan_for is not None:
                self.loans.setdefault(running.loan_for, set()).add(job.id)
        else:
            self._leave(job.queue, r, +1)
            self._leave_nodes(running.placement, +1)
        if self.pool is not None:
            self.pool.take(running.placement)
            for node, _ in running.placement:
                self.node_jobs[node].add(job.id)
        bisect.insort(self.ends, (expected_end, job.id))
        self._end_of[job.id] = expected_end

    @property
    def terminating_gpus(self) -> float:
        """GPUs held by jobs that were told to go and have not exited yet."""
        return sum(left.gpus for left in self.leaving.values())

    def expected_end(self, job_id: str) -> float:
        """When a running job is expected to release its resources."""
        return self._end_of[job_id]

    def mark_terminating(self, job_id: str, *, expected_end: float) -> None:
        """A preemption notice was sent: still holds resources, no longer a preemption candidate."""
        running = self.running[job_id]
        if running.terminating:
            return
        self._end_shrink(job_id)
        self._put_running(dataclasses.replace(running, terminating=True))
        self.tier_gpus[running.job.tier.rank] -= running.size
        if running.loan_for is not None:
            self._unlend(running.loan_for, job_id)
        self._leave(running.job.queue, running.held, +1)
        self._leave_nodes(running.placement, +1)
        self._move_end(job_id, expected_end)

    def finish(self, job_id: str) -> RunningJob:
        """Release a running job's resources (completed, preempted or failed)."""
        self._end_shrink(job_id)
        running = self.running.pop(job_id)
        job = running.job
        del self.running_by_queue[job.queue][job_id]
        self.staying[job.queue][job.tier.rank].pop(job_id, None)
        self.victim_index.drop(job_id)
        r = running.held
        self.alloc[job.queue].add(r, -1)
        self.used.add(r, -1)
        if not running.terminating:
            self.tier_gpus[job.tier.rank] -= r.gpus
            if running.loan_for is not None:
                self._unlend(running.loan_for, job_id)
        else:
            self._leave(job.queue, r, -1)
            self._leave_nodes(running.placement, -1)
        if self.pool is not None:
            self.pool.give(running.placement)
            for node, _ in running.placement:
                self.node_jobs[node].discard(job_id)
        end = self._end_of.pop(job_id)
        i = bisect.bisect_left(self.ends, (end, job_id))
        del self.ends[i]
        return running

    def _unlend(self, to: str, job_id: str) -> None:
        lent = self.loans.get(to)
        if lent is not None:
            lent.discard(job_id)
            if not lent:
                del self.loans[to]

    def _leave(self, queue: str, amount: Resources, sign: int) -> None:
        self.leaving[queue].add(amount, sign)

    # --- elastic jobs -------------------------------------------------------------------------

    def begin_shrink(self, job_id: str, gpus: int, *, at: float) -> None:
        """A shrink was sent (`Resize`): until the job has saved it holds all its GPUs, but
        what it gives up counts as leaving (as a victim's GPUs do) and is no longer a
        candidate; `finish_resize` completes it."""
        running = self.running[job_id]
        if running.terminating or job_id in self.shrinking:
            return
        job = dataclasses.replace(running.job, last_resized_at=at)
        self._put_running(dataclasses.replace(running, job=job))
        gone = running.held - job.at_size(gpus)
        self.shrinking[job_id] = (gpus, gone, elastic.released(running, gpus))
        self.tier_gpus[job.tier.rank] -= gone.gpus
        self._leave(job.queue, gone, +1)
        self._leave_nodes(self.shrinking[job_id][2], +1)

    def _end_shrink(self, job_id: str) -> None:
        """Undo `begin_shrink`'s bookkeeping (the shrink completed, or the job left first)."""
        entry = self.shrinking.pop(job_id, None)
        if entry is None:
            return
        _, gone, nodes = entry
        running = self.running[job_id]
        self.tier_gpus[running.job.tier.rank] += gone.gpus
        self._leave(running.job.queue, gone, -1)
        self._leave_nodes(nodes, -1)

    def finish_resize(
        self, job_id: str, gpus: int, *, at: float, placement: Placement | None = None
    ) -> RunningJob:
        """The job now holds `gpus` GPUs (on `placement` with nodes): a shrink has saved, or a
        grow was sent (it holds its new GPUs from then). Its progress was saved `at`."""
        self._end_shrink(job_id)
        running = self.running[job_id]
        if running.terminating:
            return running
        job = dataclasses.replace(running.job, last_resized_at=at)
        if placement is None:
            placement = elastic.kept(running, gpus) if gpus < running.size else running.placement
        resized = dataclasses.replace(
            running,
            job=job,
            gpus=None if gpus == job.request.gpus else gpus,
            placement=placement,
            last_checkpoint_at=at,
        )
        before, after = running.held, resized.held
        self.alloc[job.queue].add(before, -1)
        self.alloc[job.queue].add(after)
        self.used.add(before, -1)
        self.used.add(after)
        self.tier_gpus[job.tier.rank] += after.gpus - before.gpus
        if self.pool is not None:
            self.pool.give(running.placement)
            self.pool.take(placement)
            for node, _ in running.placement:
                self.node_jobs[node].discard(job_id)
            for node, _ in placement:
                self.node_jobs[node].add(job_id)
        self._put_running(resized)
        return resized

    def _leave_nodes(self, placement: Placement, sign: int) -> None:
        leaving = self.node_leaving
        for node, gpus in placement:
            if not gpus:
                continue
            count = leaving.get(node, 0) + sign * gpus
            if count:
                leaving[node] = count
            else:
                del leaving[node]

    def _move_end(self, job_id: str, end: float) -> None:
        old = self._end_of[job_id]
        i = bisect.bisect_left(self.ends, (old, job_id))
        del self.ends[i]
        bisect.insort(self.ends, (end, job_id))
        self._end_of[job_id] = end

    def record_preemption(
        self, queue: str, at: float, *, preemptor: str, nodes: Placement = ()
    ) -> None:
        """Count a preemption against the victim's queue and remember the preemptor's nomination
        (with the node GPUs its victims free for it, `Preempt.for_nodes`)."""
        log = self.recent_preemptions.setdefault(queue, deque())
        log.append(at)
        while log and log[0] < at - 3600.0:
            log.popleft()
        self.nominate(preemptor, at, nodes=nodes)

    def nominate(
        self, job_id: str, at: float, *, nodes: Placement = (), moving: bool = False
    ) -> None:
        """`job_id` gets the capacity freed for it (on `nodes`) before anyone else; `moving`:
        it is itself a moved job, held for from its notice until it restarts."""
        self.nominated.pop(job_id, None)
        self.nominated[job_id] = at
        if nodes:
            self.nominated_nodes[job_id] = nodes
        if moving:
            self.moving.add(job_id)

    def expire_nominations(self, before: float) -> None:
        """Forget nominations made before `before` (their victims have long exited)."""
        nominated = self.nominated
        while nominated:
            job_id, at = next(iter(nominated.items()))
            if at >= before:
                break
            del nominated[job_id]
            self.nominated_nodes.pop(job_id, None)
            self.moving.discard(job_id)

    def note_failed_preemptions(self, keys: Iterable[SearchKey], until: float) -> None:
        """Back off victim searches for these kinds of job until `until`."""
        for key in keys:
            self.preemption_backoff[key] = until


@dataclass(frozen=True, kw_only=True, slots=True)
class Snapshot:
    """What one cycle sees: the state plus the decayed fair-share usage at this moment."""

    state: ClusterState
    """The incremental state; read-only for the cycle."""
    usage: Mapping[str, float] = field(default_factory=dict)
    """Decayed time-average dominant share per queue (see `fair_share.UsageTracker`)."""


def build_snapshot(
    cluster: Cluster,
    queues: Iterable[Queue],
    *,
    pending: Iterable[Job] = (),
    running: Iterable[RunningJob] = (),
    usage: Mapping[str, float] | None = None,
    recent_preemptions: Mapping[str, Iterable[float]] | None = None,
    nominated: Mapping[str, float] | None = None,
    nominated_nodes: Mapping[str, Placement] | None = None,
    moving: Iterable[str] = (),
    default_estimate_s: float = 4 * 3600.0,
) -> Snapshot:
    """A snapshot from plain lists (for tests, tools and the service's first load).

    Running jobs without a placement on a node cluster are placed best-fit here, so that a
    caller who only knows counts still gets a consistent picture.
    """
    state = ClusterState(cluster, queues)
    for job in pending:
        state.submit(job)
    for rj in running:
        if state.pool is not None and not rj.placement and rj.size:
            where = state.pool.find(rj.size)
            if where is None:
                raise ConfigError(
                    f"running job {rj.job.id!r} ({rj.size} GPUs) does not fit on "
                    "the nodes beside the others; give its placement or fewer running jobs"
                )
            rj = dataclasses.replace(rj, placement=where)
        state.start(rj, expected_end=rj.started_at + rj.job.expected_runtime_s(default_estimate_s))
    for name, times in (recent_preemptions or {}).items():
        state.recent_preemptions[name] = deque(sorted(times))
    state.nominated.update(nominated or {})
    state.nominated_nodes.update(nominated_nodes or {})
    state.moving.update(moving)
    return Snapshot(state=state, usage=dict(usage or {}))
