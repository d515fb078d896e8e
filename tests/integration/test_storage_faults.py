"""Storage failing mid-save: the save raises a clear error, the previous checkpoint survives."""

from __future__ import annotations

import errno
import random
import uuid

import pytest

from preemptible import Checkpointer
from preemptible.errors import StorageError
from tests import faulty_fs
from tests.helpers import assert_same, make_state


@pytest.fixture
def plan():
    faulty_fs.PLAN.fail_after_bytes = None
    faulty_fs.PLAN.written = 0
    yield faulty_fs.PLAN
    faulty_fs.PLAN.fail_after_bytes = None


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO, errno.ECONNRESET])
def test_a_write_failing_at_any_byte_leaves_the_previous_checkpoint_intact(plan, error):
    url = f"faulty://run-{uuid.uuid4().hex}"
    ckpt = Checkpointer(url, shard_bytes=64 << 10, max_workers=4)
    ckpt.save(1, make_state(1, mib=0.5))
    plan.written = 0
    ckpt.save(2, make_state(2, mib=0.5))  # measure how many bytes a save writes
    total = plan.written
    rng = random.Random(error)
    # 0: the first byte; total - 50: inside the manifest, the commit itself.
    for trial, fail_at in enumerate(
        [0, total - 50, *(rng.randrange(total - 50) for _ in range(20))]
    ):
        plan.errno, plan.written, plan.fail_after_bytes = error, 0, fail_at
        with pytest.raises(StorageError) as err:
            ckpt.save(3 + trial, make_state(3 + trial, mib=0.5))
        message = str(err.value)
        assert "Nothing was committed" in message and "earlier checkpoints are untouched" in message
        assert isinstance(err.value.__cause__, OSError)
        plan.fail_after_bytes = None
        assert ckpt.latest().step == 2, f"fail at byte {fail_at} of {total}"
        assert ckpt.verify(2).ok
        assert_same(make_state(2, mib=0.5), ckpt.load())
    # The storage recovers: the next save works and retention still applies.
    ckpt.save(100, make_state(100, mib=0.5))
    assert [i.step for i in ckpt.list()] == [1, 2, 100]


def test_a_full_local_disk_fails_the_save_cleanly_and_keeps_the_last_checkpoint(tiny_disk):
    ckpt = Checkpointer(tiny_disk / "run", keep=1)
    ckpt.save(1, make_state(1, mib=1.5))
    with pytest.raises(StorageError, match="No space left"):
        ckpt.save(2, {"big": make_state(2, mib=3.0)})
    assert [i.step for i in ckpt.list()] == [1]
    assert ckpt.verify(1).ok
    assert_same(make_state(1, mib=1.5), ckpt.load())
    assert [p.name for p in (tiny_disk / "run").iterdir()] == ["step-000000000001"]  # temp removed
    ckpt.save(2, make_state(2, mib=1.5))  # room again: retention freed nothing yet, but it fits
    assert [i.step for i in ckpt.list()] == [2]
