"""The four signals over the last day: one sample a minute, kept in the state file.

The dashboard draws each signal's trend from these samples. A sample is the whole `StatsView`
at that moment (each signal over its own window, docs/maintainers/design.md §5), so a trend shows
how the signals moved, not a re-computation over shorter windows. One a minute for a day is at most
1,441 samples: small enough to keep in memory for reads and in SQLite so that a restart keeps
the trend. Rejected alternative: recomputing past values from the job records on request,
which costs a pass over every job per point and cannot say what a window looked like before
jobs finished.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from preemptible.queue.service.store import Store
from preemptible.queue.service.views import SignalsView, StatsView

log = logging.getLogger("preemptible.queue")

SAMPLE_EVERY_S = 60.0
"""How often the signals are sampled."""
KEEP_S = 86400.0
"""How far back samples are kept: the dashboard's trend covers the last day."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SignalSample:
    """The four signals as `GET /v1/stats` said them at `at`."""

    at: float
    stats: StatsView


class SignalHistory:
    """Samples of the signals, oldest first, the last `keep_s`; the caller serialises access
    (the manager calls it under its lock)."""

    def __init__(
        self, store: Store, *, every_s: float = SAMPLE_EVERY_S, keep_s: float = KEEP_S
    ) -> None:
        self.store = store
        self.every_s = every_s
        self.keep_s = keep_s
        self._samples: deque[SignalSample] = deque()
        self._next_at = 0.0

    def load(self, now: float) -> None:
        """Read back what the state file kept (after a restart)."""
        for at, doc in self.store.signal_samples(since=now - self.keep_s):
            stats = stats_from_doc(doc)
            if stats is not None:
                self._samples.append(SignalSample(at=at, stats=stats))
        if self._samples:
            self._next_at = self._samples[-1].at + self.every_s

    def maybe_sample(self, now: float, compute: Callable[[], StatsView]) -> bool:
        """Take a sample if one is due; True if taken."""
        if now < self._next_at:
            return False
        self._next_at = now + self.every_s
        stats = compute()
        self.store.add_signal_sample(now, dataclasses.asdict(stats), keep_after=now - self.keep_s)
        self._samples.append(SignalSample(at=now, stats=stats))
        while self._samples and self._samples[0].at < now - self.keep_s:
            self._samples.popleft()
        return True

    def since(self, at: float) -> list[SignalSample]:
        """The samples taken after `at`, oldest first."""
        return [s for s in self._samples if s.at > at]


def stats_from_doc(doc: dict[str, Any]) -> StatsView | None:
    """A stored sample as a view; None for one this version cannot read (it is skipped)."""
    try:
        return StatsView(
            window_s=float(doc["window_s"]),
            overall=_signals(doc["overall"]),
            queues={name: _signals(s) for name, s in doc["queues"].items()},
            max_wait_least_served_s=float(doc["max_wait_least_served_s"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        log.warning("a stored sample of the signals was skipped: %s", exc)
        return None


def _signals(doc: dict[str, Any]) -> SignalsView:
    names = {f.name for f in dataclasses.fields(SignalsView)}
    return SignalsView(**{k: v for k, v in doc.items() if k in names})
