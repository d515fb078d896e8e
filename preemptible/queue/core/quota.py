"""Admission within nominal quota, and borrowing of idle capacity up to a limit.

Kueue's model: each queue owns a nominal quota that is guaranteed; capacity nobody uses can be
borrowed up to the queue's borrowing limit, and borrowed work is reclaimable. A resource missing
from a quota is not limited by it.
"""

from __future__ import annotations

import enum

from preemptible.queue.core.model import Queue
from preemptible.queue.core.resources import TOLERANCE, ZERO, Amounts, HasAmounts, values


class QuotaVerdict(enum.Enum):
    """Where a request would leave its queue."""

    WITHIN_NOMINAL = "within nominal"
    BORROWING = "borrowing"
    OVER_LIMIT = "over limit"


def check_quota(queue: Queue, alloc: HasAmounts, request: HasAmounts) -> QuotaVerdict:
    """Whether `request` on top of `alloc` stays within nominal, borrows, or exceeds the limit."""
    nominal, limit = queue.nominal, queue.borrowing_limit
    worst = max(
        _level(alloc.gpus + request.gpus, nominal.gpus, limit.gpus),
        _level(alloc.cpus + request.cpus, nominal.cpus, limit.cpus),
        _level(alloc.memory_gb + request.memory_gb, nominal.memory_gb, limit.memory_gb),
    )
    return _VERDICTS[worst]


_VERDICTS = (QuotaVerdict.WITHIN_NOMINAL, QuotaVerdict.BORROWING, QuotaVerdict.OVER_LIMIT)


def _level(after: float, nominal: float, limit: float) -> int:
    """One resource's verdict as an index of `_VERDICTS` (the worst resource decides)."""
    if after <= nominal + TOLERANCE:
        return 0
    return 2 if after > nominal + limit + TOLERANCE else 1


def is_borrowing(queue: Queue, alloc: HasAmounts, leaving: HasAmounts = ZERO) -> bool:
    """True when the queue holds more than its nominal quota of some resource (not counting
    what its jobs told to go, `leaving`, still hold)."""
    return any(
        held - left > nominal + TOLERANCE
        for held, left, nominal in zip(
            values(alloc), values(leaving), values(queue.nominal), strict=True
        )
    )


def borrowed(queue: Queue, alloc: HasAmounts, leaving: HasAmounts = ZERO) -> Amounts:
    """Per resource, how much the queue holds beyond its nominal quota (0 where it does not),
    not counting what its jobs told to go still hold."""
    return Amounts(
        *(
            max(0.0, held - left - nominal)
            for held, left, nominal in zip(
                values(alloc), values(leaving), values(queue.nominal), strict=True
            )
        )
    )


def beyond_limit(queue: Queue, alloc: HasAmounts, leaving: HasAmounts = ZERO) -> Amounts:
    """Per resource, how much the queue holds beyond its nominal quota plus its borrowing limit
    (`Policy.beyond_limit`), not counting what its jobs told to go still hold."""
    return Amounts(
        *(
            max(0.0, held - left - nominal - limit)
            for held, left, nominal, limit in zip(
                values(alloc),
                values(leaving),
                values(queue.nominal),
                values(queue.borrowing_limit),
                strict=True,
            )
        )
    )


def gpus(n: float) -> str:
    """'1 GPU', '4 GPUs', '0.5 GPUs'."""
    return f"{n:g} GPU" if n == 1 else f"{n:g} GPUs"


def describe_limit(queue: Queue) -> str:
    """'4 GPUs nominal + 4 borrowable', for reasons shown to people."""
    n = queue.nominal.gpus
    b = queue.borrowing_limit.gpus
    borrow = "unlimited borrowing" if b == float("inf") else f"{b:g} borrowable"
    nominal = "no nominal quota" if n == float("inf") else f"{gpus(n)} nominal"
    return f"{nominal} + {borrow}"
