"""What saves and restores really cost: the numbers a scheduler negotiates grace periods from."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from preemptible._percentile import nearest_rank

_WINDOW = 100


@dataclass(frozen=True, slots=True)
class Summary:
    """last / mean / p95 of the most recent samples of one quantity (0.0 when there are none)."""

    last: float = 0.0
    mean: float = 0.0
    p95: float = 0.0
    count: int = 0

    @classmethod
    def of(cls, samples: list[float]) -> Summary:
        if not samples:
            return cls()
        p95 = nearest_rank(samples, 0.95)
        return cls(samples[-1], sum(samples) / len(samples), p95, len(samples))


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCost:
    """A snapshot of measured checkpoint costs.

    ``stall`` is the time the training loop was blocked by a save, known as soon as the save
    returns; ``persist`` the time until the checkpoint was durable; ``save`` is ``persist``
    under the name the cost file uses (`docs/maintainers/design.md`).
    """

    save: Summary
    stall: Summary
    persist: Summary
    restore: Summary
    bytes: int
    last_checkpoint_step: int | None
    last_checkpoint_time: float | None

    def to_json(self, updated_at: float) -> dict[str, Any]:
        """The cost-file fields of `docs/maintainers/design.md` (plus a few more)."""
        return {
            "save_seconds_p95": self.save.p95,
            "save_seconds_mean": self.save.mean,
            "save_seconds_last": self.save.last,
            "stall_seconds_p95": self.stall.p95,
            "stall_seconds_mean": self.stall.mean,
            "restore_seconds": self.restore.last,
            "bytes": self.bytes,
            "last_checkpoint_step": self.last_checkpoint_step,
            "last_checkpoint_time": self.last_checkpoint_time,
            "samples": self.save.count,
            "updated_at": updated_at,
        }


class CostTracker:
    """Records saves and restores as they happen and summarises them as a `CheckpointCost`.

    Every `Checkpointer` keeps one; an adapter that spreads one run over several checkpointers
    (`preemptible.accelerate`) keeps its own so that the run has one cost. Thread-safe:
    background saves record from their own thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stall: deque[float] = deque(maxlen=_WINDOW)
        self._persist: deque[float] = deque(maxlen=_WINDOW)
        self._restore: deque[float] = deque(maxlen=_WINDOW)
        self._bytes = 0
        self._last_step: int | None = None
        self._last_time: float | None = None

    def record_stall(self, seconds: float) -> None:
        """How long a save blocked the loop; recorded when it returns, not when it is durable,
        so that a schedule that needs it (interval="auto") has it at the next step."""
        with self._lock:
            self._stall.append(seconds)

    def record_save(self, *, step: int, persist_seconds: float, nbytes: int, at: float) -> None:
        """A save became durable ``persist_seconds`` after it started."""
        with self._lock:
            self._persist.append(persist_seconds)
            self._bytes = nbytes
            self._last_step, self._last_time = step, at

    def record_restore(self, seconds: float) -> None:
        with self._lock:
            self._restore.append(seconds)

    def snapshot(self) -> CheckpointCost:
        with self._lock:
            persist = Summary.of(list(self._persist))
            return CheckpointCost(
                save=persist,
                stall=Summary.of(list(self._stall)),
                persist=persist,
                restore=Summary.of(list(self._restore)),
                bytes=self._bytes,
                last_checkpoint_step=self._last_step,
                last_checkpoint_time=self._last_time,
            )
