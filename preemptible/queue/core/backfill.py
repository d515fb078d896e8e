"""EASY backfill: one reservation for the blocked head job; others may start if they don't delay it.

The reservation's start is the earliest time at which, by the running jobs' expected ends, the
head would fit (counting GPUs, CPUs and memory; node placement at that future time is not
predicted). A later job may start now when it is expected to end before that time, or when it
fits in the capacity that will be left over at that time beyond what the head needs. Jobs
without an estimate are assumed to run for `default_estimate_s`, as SLURM assumes a partition's
time limit; a job that overruns its estimate is expected to end now.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from preemptible.queue.core.model import Job
from preemptible.queue.core.state import ClusterState

INFINITY = float("inf")


@dataclass(kw_only=True, slots=True)
class Reservation:
    """Capacity held for `job_id` from `start_at`; `spare` is what is left over then."""

    job_id: str
    start_at: float
    spare: list[float]
    borrowing: bool = False
    """The head would run on borrowed capacity: it cannot hold back work within nominal quota."""


def plan_reservation(
    job: Job,
    *,
    now: float,
    state: ClusterState,
    free: Sequence[float],
    also_running: Iterable[tuple[float, Sequence[float]]] = (),
) -> Reservation:
    """When `job` could start by the expected ends of running jobs, and what is spare then.

    Args:
        also_running: (expected end, request) of jobs admitted earlier in this cycle.
    """
    need = job.request.as_tuple()
    avail = list(free)
    extra = sorted(also_running, key=lambda e: e[0])
    k = 0
    for end, jid in state.ends:
        while k < len(extra) and extra[k][0] <= end:
            _add(avail, extra[k][1])
            k += 1
            if _fits(avail, need):
                return _done(job, max(now, extra[k - 1][0]), avail, need)
        _add(avail, state.running[jid].job.request.as_tuple())
        if _fits(avail, need):
            return _done(job, max(now, end), avail, need)
    while k < len(extra):
        _add(avail, extra[k][1])
        k += 1
        if _fits(avail, need):
            return _done(job, max(now, extra[k - 1][0]), avail, need)
    return Reservation(job_id=job.id, start_at=INFINITY, spare=[0.0, 0.0, 0.0])


def may_backfill(
    job: Job, reservation: Reservation, *, now: float, default_estimate_s: float
) -> bool:
    """Whether starting `job` now keeps the reservation; takes from `spare` when it must."""
    if now + job.expected_runtime_s(default_estimate_s) <= reservation.start_at:
        return True
    req = job.request.as_tuple()
    if _fits(reservation.spare, req):
        for i in range(3):
            reservation.spare[i] -= req[i]
        return True
    return False


def _add(avail: list[float], req: Sequence[float]) -> None:
    for i in range(3):
        avail[i] += req[i]


def _fits(avail: Sequence[float], need: Sequence[float]) -> bool:
    return all(avail[i] + 1e-9 >= need[i] for i in range(3))


def _done(job: Job, start_at: float, avail: list[float], need: Sequence[float]) -> Reservation:
    return Reservation(
        job_id=job.id, start_at=start_at, spare=[avail[i] - need[i] for i in range(3)]
    )
