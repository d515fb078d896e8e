"""Which committed checkpoints to delete: a pure function, so the rule is easy to test."""

from __future__ import annotations

from collections.abc import Sequence


def steps_to_delete(
    steps: Sequence[int],
    *,
    keep: int | None,
    keep_every: int | None,
    saved: int | None = None,
) -> list[int]:
    """Steps to delete from the committed ``steps`` after the save of step ``saved``.

    Keeps the newest ``keep`` (all when None) and every step that is a multiple of
    ``keep_every``. The newest step is always kept, whatever the arguments, and so is ``saved``
    even when newer steps exist: a run that restored an older checkpoint, past corrupt newer
    ones, must not lose each save it makes to them (`docs/internals/corrupt-step-replaced.md`).
    """
    ordered = sorted(set(steps))
    if keep is None or not ordered:
        return []
    protected = set(ordered[-max(keep, 1) :])
    if keep_every:
        protected.update(s for s in ordered if s % keep_every == 0)
    if saved is not None:
        protected.add(saved)
    return [s for s in ordered if s not in protected]
