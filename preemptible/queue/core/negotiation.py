"""What the queue manager grants a job in return for its measured checkpoint cost.

`docs/maintainers/design.md`, queue manager (contract):

    grace_seconds       = clamp(safety * save_p95 + margin, grace_min, grace_max)
    min_runtime_seconds = max(min_runtime, multiple * (save_p95 + restore))
    interval hint       = sqrt(2 * C * M)   (Young/Daly; C = save cost, M = mean time between
                                             preemptions observed in the job's queue)

A claimed cost is checked against what the manager observed (SIGTERM to exit,
`effective_save_s`): a claim known to be inflated buys nothing, and one known to be too small
gets the grace the job really needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from preemptible.queue.core.config import PreemptionSettings


@dataclass(frozen=True, kw_only=True, slots=True)
class Negotiated:
    """The answer to a job's cost report."""

    grace_s: float
    """Seconds between the preemption notice and the hard kill."""
    min_runtime_s: float
    """The job is not preempted before it has run this long."""
    checkpoint_interval_hint_s: float | None
    """Suggested checkpoint period; None while no preemption has been observed in the queue."""


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


def grace_seconds(save_p95_s: float, settings: PreemptionSettings) -> float:
    """clamp(safety * save_p95 + margin, grace_min, grace_max)."""
    raw = settings.grace_safety * max(0.0, save_p95_s) + settings.grace_margin_s
    return min(settings.grace_max_s, max(settings.grace_min_s, raw))


def min_runtime_seconds(save_p95_s: float, restore_s: float, settings: PreemptionSettings) -> float:
    """max(min_runtime, multiple * (save_p95 + restore))."""
    cost = max(0.0, save_p95_s) + max(0.0, restore_s)
    return max(settings.min_runtime_s, settings.min_runtime_multiple * cost)


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
    """Grace, minimum runtime and checkpoint interval hint for a job's reported cost."""
    save = effective_save_s(save_p95_s, observed_exit_s)
    return Negotiated(
        grace_s=grace_seconds(save, settings),
        min_runtime_s=min_runtime_seconds(save, restore_s, settings),
        checkpoint_interval_hint_s=interval_hint_seconds(save, mean_time_between_preemptions_s),
    )
