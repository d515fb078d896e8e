"""Admission within nominal quota, and borrowing of idle capacity up to a limit.

Kueue's model: each queue owns a nominal quota that is guaranteed; capacity nobody uses can be
borrowed up to the queue's borrowing limit, and borrowed work is reclaimable. A resource missing
from a quota is not limited by it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from preemptible.queue.core.model import Queue

Amounts = Sequence[float]


class QuotaVerdict(enum.Enum):
    """Where a request would leave its queue."""

    WITHIN_NOMINAL = "within nominal"
    BORROWING = "borrowing"
    OVER_LIMIT = "over limit"


def check_quota(queue: Queue, alloc: Amounts, request: Amounts) -> QuotaVerdict:
    """Whether `request` on top of `alloc` stays within nominal, borrows, or exceeds the limit."""
    nominal = queue.nominal.as_tuple()
    limit = queue.borrowing_limit.as_tuple()
    borrowing = False
    for i in range(3):
        after = alloc[i] + request[i]
        if after <= nominal[i] + 1e-9:
            continue
        if after > nominal[i] + limit[i] + 1e-9:
            return QuotaVerdict.OVER_LIMIT
        borrowing = True
    return QuotaVerdict.BORROWING if borrowing else QuotaVerdict.WITHIN_NOMINAL


def is_borrowing(queue: Queue, alloc: Amounts, leaving: Amounts = (0, 0, 0)) -> bool:
    """True when the queue holds more than its nominal quota of some resource (not counting
    what its jobs told to go, `leaving`, still hold)."""
    nominal = queue.nominal.as_tuple()
    return any(alloc[i] - leaving[i] > nominal[i] + 1e-9 for i in range(3))


def borrowed(queue: Queue, alloc: Amounts, leaving: Amounts = (0, 0, 0)) -> tuple[float, ...]:
    """Per resource, how much the queue holds beyond its nominal quota (0 where it does not),
    not counting what its jobs told to go still hold."""
    nominal = queue.nominal.as_tuple()
    return tuple(max(0.0, alloc[i] - leaving[i] - nominal[i]) for i in range(3))


def describe_limit(queue: Queue) -> str:
    """'4 GPUs nominal + 4 borrowable', for reasons shown to people."""
    n = queue.nominal.gpus
    b = queue.borrowing_limit.gpus
    borrow = "unlimited borrowing" if b == float("inf") else f"{b:g} borrowable"
    nominal = "no nominal quota" if n == float("inf") else f"{n:g} GPUs nominal"
    return f"{nominal} + {borrow}"
