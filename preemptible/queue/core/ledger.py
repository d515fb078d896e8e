"""One cycle's count of capacity: free, held per queue, leaving per queue, and free per node.

A cycle decides many things in a row, and each decision changes what the next one sees: an
admission takes capacity, a preemptor holds what its victims will free, a victim's GPUs start to
leave. The ledger starts as a copy of the state's totals and takes those changes; the state
itself changes only when the shell applies the decisions.
"""

from __future__ import annotations

from preemptible.queue.core.model import Job, Resources, RunningJob
from preemptible.queue.core.placement import NodePool, Placement
from preemptible.queue.core.resources import INF, TOLERANCE, Amounts
from preemptible.queue.core.state import ClusterState


class Ledger:
    """Capacity as the decisions of one cycle so far leave it."""

    __slots__ = ("alloc", "free", "leaving", "pool")

    def __init__(self, state: ClusterState):
        cl, used = state.cluster, state.used
        self.free = Amounts(
            cl.gpus - used.gpus,
            (cl.cpus - used.cpus) if cl.cpus else INF,
            (cl.memory_gb - used.memory_gb) if cl.memory_gb else INF,
        )
        """Free now, by count; a resource the cluster does not schedule is infinite."""
        self.alloc = {name: a.copy() for name, a in state.alloc.items()}
        """Per queue: what it holds, this cycle's admissions included."""
        self.leaving = {name: a.copy() for name, a in state.leaving.items()}
        """Per queue: held by jobs told to go, before this cycle or by it."""
        self.pool: NodePool | None = state.pool.copy() if state.pool is not None else None
        """Free GPUs per node (None for a flat pool)."""

    def fits_by_count(self, request: Resources) -> bool:
        """Whether `request` fits in what is free now, GPUs, CPUs and memory, wherever it is."""
        free = self.free
        return not (
            request.gpus > free.gpus
            or request.cpus > free.cpus + TOLERANCE
            or request.memory_gb > free.memory_gb + TOLERANCE
        )

    def place(self, request: Resources, *, on: Placement | None = None) -> Placement | None:
        """Where `request` fits now: best fit, or `on` (a moved job's new place) while it is
        free; () on a flat pool; None when it does not fit."""
        if not self.fits_by_count(request):
            return None
        if self.pool is None:
            return ()
        if on and all(self.pool.free[n] >= g for n, g in on):
            return on
        return self.pool.find(int(request.gpus))

    def admit(self, job: Job, placement: Placement, amount: Resources | None = None) -> None:
        """`job` starts on `placement` with `amount` (its request unless it is elastic and
        starts smaller): that is no longer free and its queue holds it."""
        held = job.request if amount is None else amount
        self.free.add(held, -1)
        self.alloc[job.queue].add(held)
        if self.pool is not None:
            self.pool.take(placement)

    def hold(self, request: Resources) -> None:
        """Hold what is free now of `request`, by count, for a job that waits for it."""
        free = self.free
        free.gpus -= _available(free.gpus, request.gpus)
        free.cpus -= _available(free.cpus, request.cpus)
        free.memory_gb -= _available(free.memory_gb, request.memory_gb)

    def hold_free_on(self, nodes: Placement) -> Placement:
        """Take from the pool what is free now of `nodes`; returns what was taken."""
        if self.pool is None:
            return ()
        held = tuple((n, h) for n, g in nodes if (h := min(g, self.pool.free[n])) > 0)
        self.pool.take(held)
        return held

    def leave(self, running: RunningJob, amount: Resources | None = None) -> None:
        """`running` was told to go (or to give up `amount`, a shrink): that counts as leaving
        its queue."""
        self.leaving[running.job.queue].add(running.held if amount is None else amount)

    def grow(self, running: RunningJob, extra: Resources, on: Placement) -> None:
        """`running` grows by `extra`, on the node GPUs `on`: they are no longer free."""
        self.free.add(extra, -1)
        self.alloc[running.job.queue].add(extra)
        if self.pool is not None:
            self.pool.take(on)


def _available(free: float, asked: float) -> float:
    """How much of `asked` a hold takes from `free`: all of it up to what is free (nothing of
    a resource the cluster does not schedule)."""
    return 0 if free == INF else min(max(free, 0), asked)
