"""EASY backfill: one reservation for the blocked head job; others may start if they don't delay it.

The reservation's start is the earliest time at which, by the running jobs' expected ends, the
head would fit (counting GPUs, CPUs and memory). When the cluster is described as nodes, the
reservation also names the nodes the head will start on, because counting GPUs is not enough:
a 2-GPU job "fits" in two free GPUs on two nodes, and 1-GPU jobs backfilling every GPU that frees
up would hold it back forever. A later job may start now when it is expected to end before the
reservation's start, or when it fits in what will be left over then beyond what the head needs
(with nodes: it lands on another node, or on a reserved node's GPUs the head will not need).
Jobs without an estimate are assumed to run for `default_estimate_s`, as SLURM assumes a
partition's time limit; a job that overruns its estimate is expected to end now. A job on loan
to the head that the head may take back frees its GPUs when it may, or at its expected end if
that comes first. Capacity a nominated job is waiting for is held by count and, with nodes, on
the nodes its victims are freeing, as far as it is free already; what its victims still hold
counts as freed at their exit, so the spare on those nodes may be too generous until it starts.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from preemptible.queue.core.model import Job
from preemptible.queue.core.placement import NodePool, Placement
from preemptible.queue.core.state import ClusterState

INFINITY = float("inf")


@dataclass(kw_only=True, slots=True)
class Reservation:
    """Capacity held for `job_id` from `start_at`; `spare` is what is left over then."""

    job_id: str
    queue: str
    start_at: float
    spare: list[float]
    borrowing: bool = False
    """The head would run on borrowed capacity: it cannot hold back other queues' work within
    their nominal quota (its own queue's work still waits its turn)."""
    node_spare: dict[int, int] = field(default_factory=dict)
    """With nodes: the nodes the head is expected to start on -> GPUs free there at `start_at`
    beyond the head's need. Empty without nodes (then `spare` counts GPUs too)."""

    def consume(self, placement: Placement) -> None:
        """GPUs taken now on the held nodes are no longer spare there (never below none)."""
        for n, g in placement:
            if n in self.node_spare:
                self.node_spare[n] = max(0, self.node_spare[n] - g)


Started = tuple[float, Sequence[float], Placement]
"""(expected end, request, placement) of a job admitted earlier in the same cycle."""


def plan_reservation(
    job: Job,
    *,
    now: float,
    state: ClusterState,
    free: Sequence[float],
    pool: NodePool | None = None,
    also_running: Sequence[Started] = (),
    loans_due: Mapping[str, float] | None = None,
) -> Reservation:
    """When `job` could start by the expected ends of running jobs, and what is spare then.

    Args:
        free: what is free now (GPUs, CPUs, memory), after this cycle's admissions.
        pool: free GPUs per node after this cycle's admissions, when the cluster has nodes.
        also_running: jobs admitted earlier in this cycle (not yet in `state`).
        loans_due: running job id -> when `job` may take it back (`preemption.loans_due`).
    """
    due = loans_due or {}
    res = _plan_counts(job, now=now, free=free, ends=_releases(state, also_running, due, now))
    if pool is None or job.request.gpus <= 0 or res.start_at == INFINITY:
        return res
    start_at, node_spare = _plan_nodes(job, now, pool, _releases(state, also_running, due, now))
    res.start_at = max(res.start_at, start_at)
    res.node_spare = node_spare
    return res


Release = tuple[float, Sequence[float], Placement, bool]
"""(expected time, request, placement, certain) of capacity coming back; not certain: the job has
overrun its estimate and is only assumed to end now."""


def _releases(
    state: ClusterState, also_running: Sequence[Started], loans_due: Mapping[str, float], now: float
) -> Iterator[Release]:
    """The running jobs, this cycle's admissions and the head's loans, earliest first."""
    running = state.running
    loans = sorted(
        (_loan_back(state.expected_end(jid), at, now), jid) for jid, at in loans_due.items()
    )
    return heapq.merge(
        (
            (end, running[jid].job.request.as_tuple(), running[jid].placement, end > now)
            for end, jid in state.ends
            if jid not in loans_due
        ),
        (
            (at, running[jid].job.request.as_tuple(), running[jid].placement, True)
            for at, jid in loans
        ),
        sorted(
            ((end, req, where, end > now) for end, req, where in also_running), key=lambda e: e[0]
        ),
        key=lambda e: e[0],
    )


def _plan_counts(
    job: Job, *, now: float, free: Sequence[float], ends: Iterable[Release]
) -> Reservation:
    """The reservation by counts alone: the earliest expected end after which the head fits."""
    need = job.request.as_tuple()
    avail = list(free)
    for end, request, _, _ in ends:
        _add(avail, request)
        if _fits(avail, need):
            return _done(job, max(now, end), avail, need)
    return Reservation(job_id=job.id, queue=job.queue, start_at=INFINITY, spare=[0.0, 0.0, 0.0])


def _plan_nodes(
    job: Job, now: float, pool: NodePool, releases: Iterable[Release]
) -> tuple[float, dict[int, int]]:
    """When and where (by node) the head's GPUs free up, and what is spare on those nodes then.

    Walks the running jobs' expected ends (the head's loans: when they come back) in order,
    freeing their GPUs node by node, until some node has room for a job of up to one node's
    GPUs, or enough nodes are empty for a larger job (plus, best fit, one with room for its
    remainder). Ties (common: jobs that overran their estimate are all "expected to end now")
    go to the node with the most GPUs that are free now or lent ahead of the head and due back
    now, so the reservation sticks to the node that drains for it. Those overran jobs count for
    the start, but their GPUs are not spare: nobody knows when they free up, and giving each one
    away as it frees would hold the head back for ever.
    """
    per = pool.gpus_per_node
    free_now = pool.free
    avail = list(free_now)
    sure = list(free_now)
    ready = list(free_now)  # plus loans due back now: the tie-break
    gpus = int(job.request.gpus)
    whole, rest = (0, gpus) if gpus <= per else divmod(gpus, per)
    ends = iter(releases)

    def preference(n: int) -> tuple[int, int]:
        return (-ready[n], n)

    def plan(touched: Iterable[int]) -> dict[int, int] | None:
        if not whole:
            fits = [n for n in touched if avail[n] >= rest]
            return {min(fits, key=preference): rest} if fits else None
        empty = [n for n in range(len(avail)) if avail[n] == per]
        chosen = dict.fromkeys(sorted(empty, key=preference)[:whole], per)
        if rest:  # the remainder goes best fit, as `NodePool.find` will place it
            room = [n for n in range(len(avail)) if n not in chosen and avail[n] >= rest]
            chosen[min(room, key=lambda n: (avail[n], -ready[n], n))] = rest
        return chosen

    # For a gang, count empty nodes and partly used nodes with room for the remainder, so that
    # the nodes are scanned only once the gang fits (not at every end: O(nodes x ends)).
    def kind(n: int) -> int:
        return 2 if avail[n] == per else 1 if rest and avail[n] >= rest else 0

    counts = [0, 0, 0]
    for n in range(len(avail) if whole else 0):
        counts[kind(n)] += 1

    def gang_fits() -> bool:
        empty, room = counts[2], counts[1]
        return empty >= whole and (not rest or empty > whole or room > 0)

    t = now
    need = plan(range(len(avail))) if not whole or gang_fits() else None
    pending = next(ends, None)
    while need is None and pending is not None:
        t = max(now, pending[0])
        touched = set()
        while pending is not None and max(now, pending[0]) == t:
            _, _, placement, certain = pending
            for n, g in placement:
                if whole:
                    counts[kind(n)] -= 1
                avail[n] += g
                if whole:
                    counts[kind(n)] += 1
                if certain:
                    sure[n] += g
                    if t == now:
                        ready[n] += g
                touched.add(n)
            pending = next(ends, None)
        if not whole or gang_fits():
            need = plan(touched)
    if need is None:
        return INFINITY, {}
    return t, {n: max(0, sure[n] - g) for n, g in need.items()}


def _loan_back(end: float, due: float, now: float) -> float:
    """When a loan the head may take back frees its GPUs: at its expected end or when it is due
    back, whichever comes first; if it has overrun its estimate, when it is due back."""
    return min(end, due) if end > now else due


def may_backfill(
    job: Job,
    placement: Placement,
    reservation: Reservation,
    *,
    now: float,
    default_estimate_s: float,
) -> bool:
    """Whether starting `job` now on `placement` keeps the reservation; takes from the spare
    capacity when it must."""
    if now + job.expected_runtime_s(default_estimate_s) <= reservation.start_at:
        return True
    req = job.request.as_tuple()
    spare = reservation.spare
    nodes = reservation.node_spare
    if not nodes:
        if not _fits(spare, req):
            return False
        for i in range(3):
            spare[i] -= req[i]
        return True
    # GPUs are judged by node (a job on another node leaves the head's GPUs alone); CPUs and
    # memory are one pool.
    if any(req[i] > spare[i] + 1e-9 for i in (1, 2)):
        return False
    if any(g > nodes[n] for n, g in placement if n in nodes):
        return False
    reservation.consume(placement)
    for i in (1, 2):
        spare[i] -= req[i]
    return True


def _add(avail: list[float], req: Sequence[float]) -> None:
    for i in range(3):
        avail[i] += req[i]


def _fits(avail: Sequence[float], need: Sequence[float]) -> bool:
    return all(avail[i] + 1e-9 >= need[i] for i in range(3))


def _done(job: Job, start_at: float, avail: list[float], need: Sequence[float]) -> Reservation:
    return Reservation(
        job_id=job.id,
        queue=job.queue,
        start_at=start_at,
        spare=[avail[i] - need[i] for i in range(3)],
    )
