"""What the queue manager grants a job in return for its measured checkpoint cost.

`docs/maintainers/design.md`, queue manager (contract):

    grace_seconds       = clamp(safety * save_p95 + margin, grace_min, grace_max)
    min_runtime_seconds = max(min_runtime, multiple * (save_p95 + restore))
    interval hint       = sqrt(2 * C * M)   (Young/Daly; C = save cost, M = mean time between
                                             preemptions observed in the job's queue)

A claimed cost is checked against what the manager observed (SIGTERM to exit,
`effective_save_s`): a claim known to be inflated buys nothing, and one known to be too small
gets the grace the job really needed. A claim the manager cannot check (a restore, a save never
yet seen) counts for at most the queue's caps: `max_claimed_save`, `max_claimed_restore`, and
the minimum runtime they buy at most `min_runtime_max` (docs/internals/bounded-claims.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from preemptible.queue.core import reasons
from preemptible.queue.core.config import PreemptionSettings

ClaimName = Literal["save", "restore", "minimum runtime"]
"""What a cap bounded: a claimed cost, or the minimum runtime the counted costs buy."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Clamped:
    """A figure the negotiation counted as less than the job's claim made it."""

    claim: ClaimName
    """The claimed save or restore, or the minimum runtime they would buy."""
    claimed_s: float
    """The figure before the cap (a save claim as checked against the observed exit)."""
    counted_s: float
    """The figure the negotiation counted."""
    setting: str
    """The `[preemption]` key that capped it."""

    @property
    def reason(self) -> str:
        """E.g. "claimed restore 604800 s, counted as 1800 s (max_claimed_restore)"."""
        return reasons.clamped(self.claim, self.claimed_s, self.counted_s, self.setting)


@dataclass(frozen=True, kw_only=True, slots=True)
class Negotiated:
    """The answer to a job's cost report."""

    grace_s: float
    """Seconds between the preemption notice and the hard kill."""
    min_runtime_s: float
    """The job is not preempted before it has run this long."""
    checkpoint_interval_hint_s: float | None
    """Suggested checkpoint period; None while no preemption has been observed in the queue."""
    clamped: tuple[Clamped, ...] = ()
    """The claims counted as less than claimed (empty when no cap bound)."""


def effective_save_s(
    claimed_s: float, observed_exit_s: float | None, *, slack: float = 1.5
) -> float:
    """The save cost to negotiate with: the claim, checked against the exit the manager saw.

    The grace must cover what a job really takes from SIGTERM to exit (the step in flight, the
    save, the exit). A job seen to take longer than it claims gets what it took: one that
    reported 5 s and took 60 s is a 60 s job next time. A claim above `slack` times what was
    seen is cut to that: one that claims 300 s but exited 20 s after SIGTERM is a 30 s job.
    """
    claimed_s = max(0.0, claimed_s)
    if observed_exit_s is None:
        return claimed_s
    observed = max(0.0, observed_exit_s)
    return max(observed, min(claimed_s, slack * observed))


def counted_save_s(save_p95_s: float, settings: PreemptionSettings) -> float:
    """The save cost the terms are computed from: the claim, at most `max_claimed_save`."""
    return min(max(0.0, save_p95_s), settings.claimed_save_cap_s)


def counted_restore_s(restore_s: float, settings: PreemptionSettings) -> float:
    """The restore cost the terms are computed from: the claim, at most `max_claimed_restore`."""
    return min(max(0.0, restore_s), settings.claimed_restore_cap_s)


def grace_seconds(save_p95_s: float, settings: PreemptionSettings) -> float:
    """clamp(safety * counted save + margin, grace_min, grace_max)."""
    raw = settings.grace_safety * counted_save_s(save_p95_s, settings) + settings.grace_margin_s
    return min(settings.grace_max_s, max(settings.grace_min_s, raw))


def _earned_runtime_s(save_p95_s: float, restore_s: float, settings: PreemptionSettings) -> float:
    """max(min_runtime, multiple * (counted save + counted restore)), before `min_runtime_max`."""
    cost = counted_save_s(save_p95_s, settings) + counted_restore_s(restore_s, settings)
    return max(settings.min_runtime_s, settings.min_runtime_multiple * cost)


def min_runtime_seconds(save_p95_s: float, restore_s: float, settings: PreemptionSettings) -> float:
    """min(max(min_runtime, multiple * (counted save + counted restore)), min_runtime_max)."""
    return min(_earned_runtime_s(save_p95_s, restore_s, settings), settings.min_runtime_cap_s)


def clamped_claims(
    save_p95_s: float, restore_s: float, settings: PreemptionSettings
) -> tuple[Clamped, ...]:
    """The caps that bound this claim, each with what was claimed and what was counted."""
    save, restore = max(0.0, save_p95_s), max(0.0, restore_s)
    earned = _earned_runtime_s(save, restore, settings)
    bounds: tuple[tuple[ClaimName, float, float, str], ...] = (  # claim, value, cap, setting
        ("save", save, settings.claimed_save_cap_s, "max_claimed_save"),
        ("restore", restore, settings.claimed_restore_cap_s, "max_claimed_restore"),
        ("minimum runtime", earned, settings.min_runtime_cap_s, "min_runtime_max"),
    )
    return tuple(
        Clamped(claim=claim, claimed_s=value, counted_s=cap, setting=setting)
        for claim, value, cap, setting in bounds
        if value > cap
    )


def interval_hint_seconds(
    save_p95_s: float, mean_time_between_preemptions_s: float | None
) -> float | None:
    """Young/Daly optimum sqrt(2 * C * M); None without an observed M or with a zero cost."""
    if not mean_time_between_preemptions_s or save_p95_s <= 0:
        return None
    return math.sqrt(2.0 * save_p95_s * mean_time_between_preemptions_s)


def negotiate(
    save_p95_s: float,
    restore_s: float,
    settings: PreemptionSettings,
    *,
    mean_time_between_preemptions_s: float | None = None,
    observed_exit_s: float | None = None,
) -> Negotiated:
    """Grace, minimum runtime and checkpoint interval hint for a job's reported cost, and the
    caps that bound it. The hint is the job's own business: it follows the uncapped save."""
    save = effective_save_s(save_p95_s, observed_exit_s)
    return Negotiated(
        grace_s=grace_seconds(save, settings),
        min_runtime_s=min_runtime_seconds(save, restore_s, settings),
        checkpoint_interval_hint_s=interval_hint_seconds(save, mean_time_between_preemptions_s),
        clamped=clamped_claims(save, restore_s, settings),
    )
