"""The collector settings of the manager and the simulator, and that a run puts them back."""

import gc

from preemptible.queue.quiet_gc import GC_THRESHOLDS, quieter_collections


def test_a_quieter_block_freezes_what_exists_and_puts_the_collector_back():
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    kept = [object() for _ in range(100)]
    with quieter_collections():
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() >= frozen + len(kept)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_what_was_frozen_before_stays_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with quieter_collections():
            pass
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()
