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

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from preemptible.queue.core.model import Job, Resources
from preemptible.queue.core.placement import NodePool, Placement
from preemptible.queue.core.resources import TOLERANCE, Amounts
from preemptible.queue.core.state import ClusterState

INFINITY = float("inf")


@dataclass(kw_only=True, slots=True)
class Reservation:
    """Capacity held for `job_id` from `start_at`; `spare` is what is left over then."""

    job_id: str
    queue: str
    start_at: float
    spare: Amounts
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


class Started(NamedTuple):
    """A job admitted earlier in the same cycle (not yet in the state)."""

    end: float
    """When it is expected to end."""
    request: Resources
    placement: Placement


def plan_reservation(
    job: Job,
    *,
    now: float,
    state: ClusterState,
    free: Amounts,
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


class Release(NamedTuple):
    """Capacity expected to come back."""

    at: float
    request: Resources
    placement: Placement
    certain: bool
    """False when the job has overrun its estimate and is only assumed to end now."""


def _releases(
    state: ClusterState, also_running: Sequence[Started], loans_due: Mapping[str, float], now: float
) -> Iterator[Release]:
    """The running jobs, this cycle's admissions and the head's loans, earliest first (on a
    tie: running jobs, then loans, then admissions)."""
    running = state.running
    loans = sorted(
        (_loan_back(state.expected_end(jid), at, now), jid) for jid, at in loans_due.items()
    )
    extra = [Release(at, running[jid].held, running[jid].placement, True) for at, jid in loans]
    extra += sorted(
        (Release(s.end, s.request, s.placement, s.end > now) for s in also_running),
        key=lambda r: r.at,
    )
    extra.sort(key=lambda r: r.at)  # stable: loans stay ahead of admissions that end with them
    ends = _ends(state, loans_due, now)
    return _merged(ends, extra) if extra else ends


def _ends(state: ClusterState, loans_due: Mapping[str, float], now: float) -> Iterator[Release]:
    """The running jobs but the head's loans, by expected end: thousands a walk, so each
    `Release` is made as the plain tuple it is (`Release(...)` adds a call to each)."""
    running, make = state.running, tuple.__new__
    for end, jid in state.ends:
        if jid not in loans_due:
            rj = running[jid]
            yield make(Release, (end, rj.held, rj.placement, end > now))


def _merged(first: Iterable[Release], extra: list[Release]) -> Iterator[Release]:
    """`first` and `extra` (each in time order) in time order, `first`'s ahead on a tie: what
    `heapq.merge` yields, without its cost per item for the few `extra` a cycle has."""
    i = 0
    for release in first:
        while i < len(extra) and extra[i].at < release.at:
            yield extra[i]
            i += 1
        yield release
    yield from extra[i:]


def _plan_counts(job: Job, *, now: float, free: Amounts, ends: Iterable[Release]) -> Reservation:
    """The reservation by counts alone: the earliest expected end after which the head fits."""
    need = job.request
    avail = free.copy()
    for release in ends:
        avail.add(release.request)
        if avail.covers(need):
            start_at = max(now, release.at)
            return Reservation(
                job_id=job.id, queue=job.queue, start_at=start_at, spare=avail.minus(need)
            )
    return Reservation(
        job_id=job.id, queue=job.queue, start_at=INFINITY, spare=Amounts(0.0, 0.0, 0.0)
    )


def _plan_nodes(
    job: Job, now: float, pool: NodePool, releases: Iterable[Release]
) -> tuple[float, dict[int, int]]:
    """When and where (by node) the head's GPUs free up, and what is spare on those nodes then.

    Walks the running jobs' expected ends (the head's loans: when they come back) in order,
    freeing their GPUs node by node, until some node has room for a job of up to one node's
    GPUs, or enough nodes are empty for a larger job (plus, best fit, one with room for its
    remainder). Those overran jobs count for the start, but their GPUs are not spare: nobody
    knows when they free up, and giving each one away as it frees would hold the head back for
    ever.
    """
    drain = _NodeDrain(pool, int(job.request.gpus))
    t = now
    need = drain.plan(range(len(drain.avail))) if drain.may_fit() else None
    if need is None and not drain.whole:
        return _plan_one_node(drain, now, releases)
    ends = iter(releases)
    pending = next(ends, None)
    while need is None and pending is not None:
        t = max(now, pending.at)
        while pending is not None and max(now, pending.at) == t:
            drain.release(pending, now=t == now)
            pending = next(ends, None)
        if drain.may_fit():
            need = drain.plan(())  # a gang plans over every node
    if need is None:
        return INFINITY, {}
    return t, {n: max(0, drain.sure[n] - g) for n, g in need.items()}


def _plan_one_node(
    drain: _NodeDrain, now: float, releases: Iterable[Release]
) -> tuple[float, dict[int, int]]:
    """`_plan_nodes` for a head of up to one node that does not fit now: the same walk with
    `_NodeDrain.release` and `plan` inline, as a fragmented cluster walks thousands of ends
    before a node has room. After the releases of each time, only the nodes they touched can
    have come to fit."""
    avail, sure, ready, gpus = drain.avail, drain.sure, drain.ready, drain.rest
    t = now
    touched: list[int] = []
    for at, _, placement, certain in releases:
        if at < now:
            at = now
        if at != t and touched:  # every release of time `t` is in: does a node fit now?
            fits = [n for n in touched if avail[n] >= gpus]
            if fits:
                break
            touched.clear()
        t = at
        for n, g in placement:
            avail[n] += g
            if certain:
                sure[n] += g
                if at == now:
                    ready[n] += g
            touched.append(n)
    fits = [n for n in touched if avail[n] >= gpus]
    if not fits:
        return INFINITY, {}
    node = min(fits, key=drain._preference)
    return t, {node: max(0, sure[node] - gpus)}


class _NodeDrain:
    """Free GPUs per node as running jobs end, for the head's node plan.

    Ties (common: jobs that overran their estimate are all "expected to end now") go to the
    node with the most GPUs that are free now or lent ahead of the head and due back now, so
    the reservation sticks to the node that drains for it.
    """

    __slots__ = ("avail", "counts", "per", "ready", "rest", "sure", "whole")

    def __init__(self, pool: NodePool, gpus: int):
        self.per = per = pool.gpus_per_node
        self.avail = list(pool.free)
        """Free per node once the releases so far are done."""
        self.sure = list(pool.free)
        """The same, without jobs that overran their estimate."""
        self.ready = list(pool.free)
        """Free now, plus loans due back now: the tie-break."""
        self.whole, self.rest = (0, gpus) if gpus <= per else divmod(gpus, per)
        # For a gang, count empty nodes and partly used nodes with room for the remainder, so
        # that the nodes are scanned only once the gang fits (not at every end).
        self.counts = [0, 0, 0]
        for n in range(len(self.avail) if self.whole else 0):
            self.counts[self._kind(n)] += 1

    def _kind(self, n: int) -> int:
        """2: empty; 1: room for the remainder; 0: neither."""
        free = self.avail[n]
        return 2 if free == self.per else 1 if self.rest and free >= self.rest else 0

    def _preference(self, n: int) -> tuple[int, int]:
        return (-self.ready[n], n)

    def release(self, release: Release, *, now: bool) -> None:
        """Free `release`'s GPUs (`now`: it comes back now)."""
        avail, counts, per, rest = self.avail, self.counts, self.per, self.rest
        for n, g in release.placement:
            if self.whole:  # `_kind` before and after, inline: thousands of ends a walk
                free = avail[n]
                counts[2 if free == per else 1 if rest and free >= rest else 0] -= 1
                free += g
                counts[2 if free == per else 1 if rest and free >= rest else 0] += 1
            avail[n] += g
            if release.certain:
                self.sure[n] += g
                if now:
                    self.ready[n] += g

    def may_fit(self) -> bool:
        """Whether a plan is worth looking for: always for a single-node head; for a gang, once
        enough nodes are empty (plus one with room for its remainder)."""
        if not self.whole:
            return True
        empty, room = self.counts[2], self.counts[1]
        return empty >= self.whole and (not self.rest or empty > self.whole or room > 0)

    def plan(self, touched: Iterable[int]) -> dict[int, int] | None:
        """Node -> GPUs for the head, or None; a single-node head looks only at `touched`."""
        avail, per, rest = self.avail, self.per, self.rest
        if not self.whole:
            fits = [n for n in touched if avail[n] >= rest]
            return {min(fits, key=self._preference): rest} if fits else None
        empty = [n for n in range(len(avail)) if avail[n] == per]
        chosen = dict.fromkeys(sorted(empty, key=self._preference)[: self.whole], per)
        if rest:  # the remainder goes best fit, as `NodePool.find` will place it
            room = [n for n in range(len(avail)) if n not in chosen and avail[n] >= rest]
            chosen[min(room, key=lambda n: (avail[n], -self.ready[n], n))] = rest
        return chosen


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
    req = job.request
    spare = reservation.spare
    if not reservation.node_spare:
        if not spare.covers(req):
            return False
        spare.add(req, -1)
        return True
    # GPUs are judged by node (a job on another node leaves the head's GPUs alone); CPUs and
    # memory are one pool.
    if req.cpus > spare.cpus + TOLERANCE or req.memory_gb > spare.memory_gb + TOLERANCE:
        return False
    nodes = reservation.node_spare
    if any(g > nodes[n] for n, g in placement if n in nodes):
        return False
    reservation.consume(placement)
    spare.cpus -= req.cpus
    spare.memory_gb -= req.memory_gb
    return True
