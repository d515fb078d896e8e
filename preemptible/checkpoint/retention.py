"""Which committed checkpoints to delete: a pure function, so the rule is easy to test."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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


def local_steps_to_delete(
    steps: Sequence[int],
    *,
    local_keep: int,
    durable_step: int | None,
    protected: Iterable[int] = (),
) -> list[int]:
    """Steps to delete from the local tier of a two-tier checkpointer.

    A local step goes once a newer step is durable remotely (the local copy is then only a
    cache of something older than what survives the node), or when it falls out of the newest
    ``local_keep`` (an older step that is not durable yet would be skipped by the uploader,
    which always takes the newest). Never deleted: the newest local step, and ``protected``
    (the step being uploaded, the one waiting for upload, the one just saved), whatever the
    arguments (`docs/internals/delete-local-only-once-durable.md`).
    """
    ordered = sorted(set(steps))
    if not ordered:
        return []
    never = {*protected, ordered[-1]}
    window = set(ordered[-max(local_keep, 1) :])
    durable = -1 if durable_step is None else durable_step
    return [s for s in ordered if s not in never and (s not in window or s < durable)]
