"""The last save fits the deadline: what a job saves on a notice, chosen from measured costs.

A notice with a deadline leaves a job `left` seconds. With two tiers (`Checkpointer(remote,
local=...)`) a save first commits locally (`local_save_s`, what the job needs before it can
exit safely on this node) and then uploads (`upload_s`, what another node needs to resume):

1. ``DURABLE``: both fit: commit locally, wait for the upload, exit.
2. ``LOCAL``: only the local commit fits: commit locally, let the upload run for what is left,
   exit before the deadline. This node's next attempt resumes from the local copy (and uploads
   it); another node resumes from the remote tier's newest.
3. ``NONE``: not even the local commit fits: exit at once on the last committed checkpoint. A
   save that cannot finish gains nothing and holds the GPUs until the kill; the commit protocol
   already makes a cut-off save invisible, so this is about time, not about a torn checkpoint.

With one tier, `local_save_s` is the whole save and there is no upload: ``DURABLE`` or ``NONE``.
A deadline unknown, or a save never measured, means "save as fast as possible" (``DURABLE``):
without numbers there is nothing to choose from, and a save is what the notice asks for.

The estimates are p95s of the job's own measurements, the numbers its grace was negotiated
from. Nothing is kept back for the exit: once a save has committed, a kill during the exit loses
nothing, and an upload cut off by the kill is invisible on the remote tier (its commit is last).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class LastSave(enum.StrEnum):
    """What the last save does (module docstring)."""

    DURABLE = "durable"
    LOCAL = "local"
    NONE = "none"


LAST_SAVE_ORDER = (LastSave.NONE, LastSave.LOCAL, LastSave.DURABLE)
"""From the most cautious choice to the least: ranks agree on the first any of them chose."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LastSavePlan:
    """The choice, and the numbers it was made from, for the one line the job logs."""

    choice: LastSave
    left_s: float | None
    """Seconds to the deadline when the choice was made; None when no deadline is known."""
    local_save_s: float | None
    """Expected seconds to commit (locally, with two tiers); None when never measured."""
    upload_s: float | None
    """Expected seconds to upload to the remote tier; None with one tier or never measured."""
    two_tiers: bool

    @property
    def upload_budget_s(self) -> float | None:
        """How long to wait for the upload after the local commit: until the deadline; None: as
        long as it takes (no deadline known)."""
        if self.choice is LastSave.NONE or self.left_s is None:
            return None
        return max(0.0, self.left_s - (self.local_save_s or 0.0))

    def describe(self) -> str:
        """One line: the choice and the numbers."""
        left = "no deadline known" if self.left_s is None else f"{self.left_s:.1f} s left"
        costs = [
            f"{'local save' if self.two_tiers else 'save'} {_seconds(self.local_save_s)}",
            *([f"upload {_seconds(self.upload_s)}"] if self.two_tiers else []),
        ]
        measured = f"{left}, {', '.join(costs)}"
        if self.choice is LastSave.NONE:
            return f"last save: none, exiting on the last checkpoint ({measured}: it cannot finish)"
        if self.choice is LastSave.LOCAL:
            return (
                f"last save: local, then the upload for up to {self.upload_budget_s:.1f} s "
                f"({measured})"
            )
        target = "durable" if self.two_tiers else "save"
        known = self.left_s is not None and self.local_save_s is not None
        return f"last save: {target} ({measured}{'' if known else '; as fast as possible'})"


def plan_last_save(
    left_s: float | None,
    *,
    local_save_s: float | None,
    upload_s: float | None = None,
    two_tiers: bool = False,
) -> LastSavePlan:
    """Choose the last save for `left_s` seconds to the deadline (module docstring)."""

    def plan(choice: LastSave) -> LastSavePlan:
        return LastSavePlan(
            choice=choice,
            left_s=left_s,
            local_save_s=local_save_s,
            upload_s=upload_s,
            two_tiers=two_tiers,
        )

    if left_s is None or local_save_s is None:
        return plan(LastSave.DURABLE)
    if local_save_s > left_s:
        return plan(LastSave.NONE)
    if not two_tiers or upload_s is None or local_save_s + upload_s <= left_s:
        return plan(LastSave.DURABLE)  # an upload never measured: try for durable
    return plan(LastSave.LOCAL)


def _seconds(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.2f} s"
