"""When to checkpoint: every N steps, every T seconds, or the Young/Daly optimum.

With a checkpoint costing ``C`` seconds of stalled training and preemptions arriving on average
every ``M`` seconds, checkpointing every ``T`` seconds wastes about ``C / T`` (saving) plus
``T / (2 M)`` (work lost since the last checkpoint, half an interval on average). The sum is
smallest at ``T = sqrt(2 C M)`` (Young 1974; Daly 2006 refines it for ``C`` close to ``M``). It
is right when preemptions are roughly memoryless and ``C << M``; with checkpoint-on-notice
(a grace period long enough to save), periodic checkpoints only guard against hard kills, and a
longer interval is fine.

``C`` is the measured p95 stall of this run's saves (the loop-blocking part: small for background
saves). ``M`` is ``PREEMPTIBLE_MTBF_SECONDS`` or the value configured; until a save has been
measured, the first checkpoint is taken after the first step. Under the queue manager, its
interval hint (the same rule, with ``M`` the preemption rate it observes in the job's queue)
replaces the computation once it has answered a cost report.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from preemptible._env_names import MTBF_ENV
from preemptible.errors import ConfigError
from preemptible.runtime.env import seconds_from_env

DEFAULT_MTBF_SECONDS = 4 * 3600.0


def young_daly_seconds(stall_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval ``sqrt(2 * C * M)`` that minimises expected waste."""
    if stall_seconds < 0 or mtbf_seconds <= 0:
        raise ConfigError(f"need C >= 0 and M > 0, got C={stall_seconds}, M={mtbf_seconds}")
    return math.sqrt(2.0 * stall_seconds * mtbf_seconds)


@dataclass(slots=True, kw_only=True)
class SaveSchedule:
    """Decides at each step boundary whether to save (``should_save``)."""

    every_steps: int | None = None
    every_seconds: float | None = None
    auto: bool = False
    mtbf_seconds: float | None = None
    hint_seconds: float | None = None
    """The queue manager's interval for ``auto`` (it knows the queue's preemption rate)."""

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_steps < 1:
            raise ConfigError(f"every_steps must be >= 1, got {self.every_steps}")
        if self.every_seconds is not None and self.every_seconds <= 0:
            raise ConfigError(f"every_seconds must be > 0, got {self.every_seconds}")
        if self.auto and self.every_seconds is not None:
            raise ConfigError(
                "interval='auto' computes the interval; do not also pass every_seconds"
            )
        if self.auto and self.mtbf_seconds is None:
            self.mtbf_seconds = self.resolved_mtbf()  # once, at start: not at every step

    def resolved_mtbf(self) -> float:
        if self.mtbf_seconds is not None:
            return self.mtbf_seconds
        value = seconds_from_env(os.environ, MTBF_ENV)
        if value is None:
            return DEFAULT_MTBF_SECONDS
        if value == 0:
            raise ConfigError(f"{MTBF_ENV} must be > 0 seconds")
        return value

    def interval_seconds(self, stall_p95: float | None) -> float | None:
        """Seconds between time-based saves (None: not time-based)."""
        if self.auto:
            if self.hint_seconds is not None:
                return self.hint_seconds
            return (
                None if stall_p95 is None else young_daly_seconds(stall_p95, self.resolved_mtbf())
            )
        return self.every_seconds

    def should_save(
        self, step: int, *, now: float, last_save_at: float, stall_p95: float | None
    ) -> bool:
        if self.every_steps is not None and (step + 1) % self.every_steps == 0:
            return True
        if self.auto and stall_p95 is None and self.hint_seconds is None:
            return True  # nothing measured yet: save once to learn C
        interval = self.interval_seconds(stall_p95)
        return interval is not None and now - last_save_at >= interval
