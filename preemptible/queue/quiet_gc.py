"""Fewer, shorter garbage collections for a process that holds many long-lived jobs.

The queue manager and the simulator keep every job as objects that live as long as the process
(the recovered jobs, a trace of a million). Python's default collector walks the older
generations again and again as short-lived objects come and go, and at 100,000 jobs one such
walk is longer than a whole scheduling cycle (`docs/internals/gc-while-serving.md`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["GC_THRESHOLDS", "quiet_garbage_collector", "quieter_collections"]

GC_THRESHOLDS = (10_000, 20, 20)
"""The collector's generation thresholds (Python's default is (700, 10, 10))."""


def quiet_garbage_collector() -> None:
    """Freeze what exists now out of every later collection, and collect the youngest
    generation after 10,000 allocations rather than 700. Call it once the long-lived state is
    built: what is frozen is never freed by the collector (plain reference counting still frees
    it), so it is for the start of a long-running process, not for a library call."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@contextmanager
def quieter_collections() -> Iterator[None]:
    """`quiet_garbage_collector` for the length of a block (a simulation run from the command
    line, which may run inside a longer process), then the collector as it was."""
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    quiet_garbage_collector()
    try:
        yield
    finally:
        if not frozen:  # what someone froze before stays frozen (unfreeze takes all)
            gc.unfreeze()
        gc.set_threshold(*thresholds)
