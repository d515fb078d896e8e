"""SIGKILL a saving process at random moments; every kill must leave a loadable checkpoint.

The child runs the real save loop (write shards, commit, retention, garbage collection) in its
own process and is killed with a real SIGKILL at a random time: half the kills at any moment from
its start, half while a save writes its files. After every kill, ``latest()`` must be a checkpoint
that verifies and loads to exactly the state committed for its step, no save that returned may be
lost, and the kill may have torn at most the one save in flight. Iterations:
PREEMPTIBLE_CRASH_ITERATIONS (default 30) per backend.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import signal
import time

import pytest

from preemptible import Checkpointer
from preemptible.checkpoint import IgnoredDir
from tests.conftest import Root, s3_root
from tests.helpers import assert_same, make_state
from tests.integration.crash_child import save_forever
from tests.polling import wait_until

ITERATIONS = int(os.environ.get("PREEMPTIBLE_CRASH_ITERATIONS", "30"))


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
    files_before: dict[str, frozenset[str]] = {}  # what interrupted saves held before the kill
    resumed_after = -1  # the child resumes after the latest checkpoint at its start
    for iteration in range(ITERATIONS):
        child = forkserver.Process(
            target=save_forever,
            args=(crash_root.url, crash_root.storage_options, str(log_path), 2.0),
            daemon=True,
        )
        logged = len(log_path.read_text().split())
        child.start()
        if rng.random() < 0.5:
            time.sleep(rng.uniform(0.02, 0.5 if local else 0.8))  # startup included
        else:
            # Just after a save returned, while the next one writes its files: on an object
            # store, startup and the clean-up after each save outlast those writes, so the
            # window above alone lands mid-write too rarely.
            _wait_for_a_commit(log_path, logged, child)
            time.sleep(rng.uniform(0.0, 0.01 if local else 0.1))
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL, f"iteration {iteration}: child died on its own"

        committed = [int(s) for s in log_path.read_text().split()]
        latest = observer.latest()
        where = f"iteration {iteration}, committed up to {committed[-1:]}, seen {seen}"
        left = observer.scan()[1]
        # Interrupted saves and deletions are garbage to collect later; a step whose manifest
        # is unreadable or corrupt is not, and no kill may leave one.
        assert all(item.collectable for item in left), f"{where}: {left}"
        # The save in flight was the step after the last one this child logged, or after the
        # one it resumed from (a save whose commit landed but the kill came before the log).
        done = max(committed[-1] if committed else -1, resumed_after)
        files = _interrupted_saves_after(crash_root, left, done)
        assert all(_step_of(name) == done + 1 for name in files), f"{where}: {sorted(files)}"
        # This kill tore that save if it left files no earlier kill had left. Older leftovers
        # stay until they are stale, and retention's emptied step directories (an object store
        # may list them) lie at or below `done`, so neither counts for this kill.
        tore = [n for n, f in files.items() if n not in files_before or f - files_before[n]]
        assert len(tore) <= 1, f"{where}: one save was in flight, yet this kill left {tore}"
        torn += bool(tore)
        files_before = files
        resumed_after = latest.step if latest is not None else -1
        if not committed:
            continue
        killed_mid_run += 1
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


def _wait_for_a_commit(log_path, logged: int, child, timeout: float = 60.0) -> None:
    """Until the child logs a save beyond the first ``logged`` lines."""

    def committed() -> bool:
        if len(log_path.read_text().split()) > logged:
            return True
        assert child.is_alive(), "the child died before its first save"
        return False

    wait_until(committed, f"a save logged after the first {logged}", timeout=timeout, every=0.002)


def _interrupted_saves_after(
    root: Root, left: list[IgnoredDir], step: int
) -> dict[str, frozenset[str]]:
    """The files of each interrupted save beyond ``step``. Names alone do not tell one kill's
    leftovers from the next: on an object store a save writes into its step's own directory,
    so a save torn twice keeps its name; its files carry a nonce per attempt."""
    fs = root.fs
    fs.invalidate_cache()
    return {
        i.name: frozenset(fs.find(f"{root.path}/{i.name}")) for i in left if _step_of(i.name) > step
    }


def _step_of(name: str) -> int:
    """The step in a listed name: ``step-…``, ``.tmp-step-…-nonce`` or ``.trash-step-…-nonce``."""
    found = re.search(r"step-(\d+)", name)
    assert found, f"unexpected entry under the checkpoint root: {name}"
    return int(found.group(1))
