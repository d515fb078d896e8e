"""A zombie of a preempted run and its replacement write to one root at the same time.

What we promise: every checkpoint that is listed verifies and loads to exactly one writer's state
for that step (never a mix), a committed step is never overwritten, retention never removes the
newest checkpoint, and the writers themselves never fail because of each other.
"""

from __future__ import annotations

import multiprocessing

import pytest

from preemptible import Checkpointer
from tests.conftest import Root, s3_root
from tests.helpers import assert_same, make_state
from tests.integration.crash_child import save_steps

SALTS = (0, 100_000)


@pytest.fixture(params=["local", "s3-moto", "s3-seaweedfs"])
def shared_root(request, tmp_path) -> Root:
    if request.param == "local":
        return Root("local", str(tmp_path / "ckpt"))
    return s3_root(request.getfixturevalue(f"{request.param.removeprefix('s3-')}_server"))


def test_two_concurrent_writers_never_corrupt_each_other(shared_root):
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "s3fs", "preemptible", "tests.integration.crash_child"])
    # Overlapping ranges: both write 10..29; the zombie stops at 29, the replacement goes on.
    plans = [list(range(0, 30)), list(range(10, 40))]
    writers = [
        ctx.Process(target=save_steps, args=(shared_root.url, shared_root.storage_options, p, s))
        for p, s in zip(plans, SALTS, strict=True)
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=300)
    assert [w.exitcode for w in writers] == [0, 0], "a writer failed because of the other"

    ckpt = Checkpointer(shared_root.url, storage_options=shared_root.storage_options, keep=None)
    committed = ckpt.list()
    assert committed and committed[-1].step == 39
    for info in committed:
        assert ckpt.verify(info.step).ok, info
        salt = info.metadata["salt"]
        assert salt in SALTS
        assert_same(make_state(info.step + salt, mib=1.0), ckpt.load(info.step))
