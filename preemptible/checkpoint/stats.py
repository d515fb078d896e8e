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
    upload: Summary = Summary()
    """Two tiers: copying a locally committed checkpoint to the remote, until its commit."""
    durable: Summary = Summary()
    """Two tiers: from the start of a save until it is committed remotely (queueing included);
    ``save`` and ``persist`` then measure the local commit."""
    restore_local: Summary = Summary()
    """Two tiers: restores served by the local tier."""
    restore_remote: Summary = Summary()
    """Two tiers: restores served by the remote tier."""
    last_durable_step: int | None = None
    """Two tiers: the newest step this process made durable remotely."""
    last_durable_time: float | None = None

    def to_json(self, updated_at: float) -> dict[str, Any]:
        """The cost-file fields of `docs/maintainers/design.md` (plus a few more).

        The two-tier fields are null where nothing was measured (one tier, or no upload yet),
        so that a reader tells "not measured" from "0 s".
        """
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
            "upload_seconds_p95": _measured(self.upload, self.upload.p95),
            "upload_seconds_mean": _measured(self.upload, self.upload.mean),
            "upload_seconds_last": _measured(self.upload, self.upload.last),
            "durable_seconds_p95": _measured(self.durable, self.durable.p95),
            "durable_seconds_mean": _measured(self.durable, self.durable.mean),
            "durable_seconds_last": _measured(self.durable, self.durable.last),
            "upload_samples": self.upload.count,
            "durable_samples": self.durable.count,
            "restore_local_seconds": _measured(self.restore_local, self.restore_local.last),
            "restore_remote_seconds": _measured(self.restore_remote, self.restore_remote.last),
            "last_durable_step": self.last_durable_step,
            "last_durable_time": self.last_durable_time,
        }


def _measured(summary: Summary, value: float) -> float | None:
    return value if summary.count else None


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
        self._upload: deque[float] = deque(maxlen=_WINDOW)
        self._durable: deque[float] = deque(maxlen=_WINDOW)
        self._restore_by_tier: dict[str, deque[float]] = {
            "local": deque(maxlen=_WINDOW),
            "remote": deque(maxlen=_WINDOW),
        }
        self._bytes = 0
        self._last_step: int | None = None
        self._last_time: float | None = None
        self._durable_step: int | None = None
        self._durable_time: float | None = None

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

    def record_restore(self, seconds: float, tier: str | None = None) -> None:
        """A restore took ``seconds``; ``tier`` ("local" or "remote") says which tier of a
        two-tier checkpointer served it."""
        with self._lock:
            self._restore.append(seconds)
            if tier is not None:
                self._restore_by_tier[tier].append(seconds)

    def record_upload(
        self, *, step: int, upload_seconds: float, durable_seconds: float | None, at: float
    ) -> None:
        """Two tiers: step ``step`` became durable remotely; the upload itself took
        ``upload_seconds``, ``durable_seconds`` after its save started (None: saved by an
        earlier process, uploaded by this one)."""
        with self._lock:
            self._upload.append(upload_seconds)
            if durable_seconds is not None:
                self._durable.append(durable_seconds)
            if self._durable_step is None or step >= self._durable_step:
                self._durable_step, self._durable_time = step, at

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
                upload=Summary.of(list(self._upload)),
                durable=Summary.of(list(self._durable)),
                restore_local=Summary.of(list(self._restore_by_tier["local"])),
                restore_remote=Summary.of(list(self._restore_by_tier["remote"])),
                last_durable_step=self._durable_step,
                last_durable_time=self._durable_time,
            )
