"""SIGKILL a saving process at random moments; every kill must leave a loadable checkpoint.

The child runs the real save loop (write shards, commit, retention, garbage collection) in its
own process and is killed with a real SIGKILL at a random time. After every kill, ``latest()``
must be a checkpoint that verifies and loads to exactly the state committed for its step, and no
save that returned may be lost. Iterations: PREEMPTIBLE_CRASH_ITERATIONS (default 50) per backend.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

import pytest

from preemptible import Checkpointer
from tests.conftest import Root, s3_root
from tests.helpers import assert_same, make_state
from tests.integration.crash_child import save_forever

ITERATIONS = int(os.environ.get("PREEMPTIBLE_CRASH_ITERATIONS", "50"))


@pytest.fixture(scope="module")
def forkserver():
    ctx = multiprocessing.get_context("forkserver")
    # Import torch once in the fork server, so each killed child starts in milliseconds.
    ctx.set_forkserver_preload(["torch", "s3fs", "preemptible", "tests.integration.crash_child"])
    return ctx


@pytest.fixture(params=["local", "s3-moto", "s3-seaweedfs"])
def crash_root(request, tmp_path) -> Root:
    if request.param == "local":
        return Root("local", str(tmp_path / "ckpt"))
    return s3_root(request.getfixturevalue(f"{request.param.removeprefix('s3-')}_server"))


def test_sigkill_at_random_moments_never_loses_or_tears_a_checkpoint(
    forkserver, crash_root, tmp_path
):
    rng = random.Random(int(os.environ.get("PREEMPTIBLE_CRASH_SEED", "1234")))
    log_path = tmp_path / "committed.log"
    log_path.touch()
    observer = Checkpointer(crash_root.url, storage_options=crash_root.storage_options, keep=None)
    local = crash_root.backend == "local"
    killed_mid_run, torn, seen = 0, 0, -1
    for iteration in range(ITERATIONS):
        child = forkserver.Process(
            target=save_forever,
            args=(crash_root.url, crash_root.storage_options, str(log_path), 2.0),
            daemon=True,
        )
        child.start()
        time.sleep(rng.uniform(0.02, 0.5 if local else 0.8))
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL, f"iteration {iteration}: child died on its own"

        committed = [int(s) for s in log_path.read_text().split()]
        latest = observer.latest()
        torn += bool(observer.scan()[1])  # the kill left a half-written save behind
        if not committed:
            continue
        killed_mid_run += 1
        where = f"iteration {iteration}, committed up to {committed[-1]}, seen {seen}"
        assert latest is not None, f"{where}: no checkpoint visible"
        # A save that returned is durable and the latest never goes back; beyond that, only the
        # save in flight at the kill may have committed (its PUT reached the server) unlogged.
        assert max(committed[-1], seen) <= latest.step <= max(committed[-1], seen) + 1, (
            f"{where}: latest {latest.step}"
        )
        seen = latest.step
        report = observer.verify(latest.step)
        assert report.ok, f"{where}: {report.problems}"
        assert_same(make_state(latest.step, mib=2.0, tensors=8), observer.load(latest.step))
    assert killed_mid_run >= ITERATIONS // 2, "too few kills landed after a first save"
    assert torn >= ITERATIONS // 10, f"only {torn} kills landed mid-save; the test is too gentle"
