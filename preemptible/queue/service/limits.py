"""What one caller may take of the server: a token bucket per caller, and a count of its waits.

The HTTP side is shared by every team, every dashboard and every running job; without limits one
client in a loop takes the CPU, the threads and the manager's lock from all the others (eight
clients listing jobs took another team's submission from 5 ms to 4.6 s). Each caller (a
`Principal`: the admin, a queue's token, a job's token) has a bucket of `burst` requests that
refills at `rate` a second; a request that finds its bucket empty is answered 429 with
`Retry-After`, the seconds until it would pass, and costs nothing more. A request that turns out
to be expensive (a page of a listing) is charged for what it returned, after it answered: the
bucket may go below zero, and the caller then waits longer. Separately, `WaitSlots` counts what a
caller has waiting (notice long-polls) and refuses beyond a bound.

Rejected alternative: one limit for the whole server, which a single client in a loop would use
up for everyone; the point is that a caller can only slow itself down.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from preemptible.errors import QueueError

MAX_BUCKETS = 10_000
"""Buckets kept at most; past it, the full ones (callers idle long enough) are dropped."""


class RateLimitedError(QueueError):
    """A caller asked for more than its share (HTTP 429); `retry_after_s` says when to ask again."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        """The `Retry-After` header: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per key: `burst` at once, `rate_per_s` a second on average. Thread-safe."""

    def __init__(
        self, rate_per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a rate limit needs a positive rate and a burst of at least 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._buckets: dict[Hashable, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: Hashable, cost: float = 1.0) -> float:
        """Take `cost` from `key`'s bucket if it holds that much: 0.0; else take nothing and
        return the seconds until it would hold it."""
        with self._lock:
            bucket = self._refilled(key)
            if bucket.tokens >= cost - 1e-9:  # what a refill's rounding leaves short
                bucket.tokens -= cost
                return 0.0
            return (cost - bucket.tokens) / self.rate_per_s

    def charge(self, key: Hashable, cost: float) -> None:
        """Take `cost` more from `key`'s bucket, below zero if need be (work already done)."""
        if cost <= 0:
            return
        with self._lock:
            self._refilled(key).tokens -= cost

    def _refilled(self, key: Hashable) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget_idle(now)
            bucket = self._buckets[key] = _Bucket(tokens=float(self.burst), updated=now)
        else:
            refill = (now - bucket.updated) * self.rate_per_s
            bucket.tokens = min(float(self.burst), bucket.tokens + refill)
            bucket.updated = now
        return bucket

    def _forget_idle(self, now: float) -> None:
        """Drop the buckets that are full by now: a new one for the same key starts full too."""
        full_after = self.burst / self.rate_per_s
        idle = [k for k, b in self._buckets.items() if now - b.updated >= full_after]
        for key in idle:
            del self._buckets[key]


class WaitSlots:
    """At most `per_key` waits (long-polls) of one key at a time. Thread-safe."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._held: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def acquire(self, key: Hashable) -> bool:
        """Take a slot of `key`'s: False, and nothing taken, when all of them are in use."""
        with self._lock:
            held = self._held.get(key, 0)
            if held >= self.per_key:
                return False
            self._held[key] = held + 1
            return True

    def release(self, key: Hashable) -> None:
        with self._lock:
            held = self._held.get(key, 0) - 1
            if held > 0:
                self._held[key] = held
            else:
                self._held.pop(key, None)

    def held(self, key: Hashable) -> int:
        with self._lock:
            return self._held.get(key, 0)
