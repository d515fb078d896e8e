"""Two tiers without S3: the local retention rule, bad arguments, a slow remote, a failing
remote, and the cost record's new fields. The S3 side is in tests/integration/test_tiers.py."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from preemptible import Checkpointer
from preemptible.checkpoint.retention import local_steps_to_delete
from preemptible.checkpoint.stats import CostTracker
from preemptible.errors import ConfigError, StorageError
from preemptible.runtime.cost_file import read_cost_file, write_cost_file
from tests import faulty_fs
from tests.helpers import assert_same, make_state

WRITE_DELAY_S = 0.3


class _SlowFile:
    """A file of the slow filesystem: each write really sleeps, as a slow link would."""

    def __init__(self, inner):
        self._inner = inner

    def write(self, data) -> int:
        time.sleep(WRITE_DELAY_S)
        return self._inner.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._inner.close()

    def __getattr__(self, name):
        return getattr(self._inner, name)


class SlowFileSystem(MemoryFileSystem):
    """``slow://``: memory, but every data write takes WRITE_DELAY_S."""

    protocol = ("slow",)
    store: dict = {}  # noqa: RUF012 - its own, not memory://'s
    pseudo_dirs = [""]  # noqa: RUF012

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).removeprefix("slow://"))

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode, **kwargs)
        return _SlowFile(f) if "w" in mode else f


fsspec.register_implementation("slow", SlowFileSystem, clobber=True)


@pytest.mark.parametrize(
    ("steps", "local_keep", "durable", "protected", "deleted"),
    [
        pytest.param([1, 2, 3], 2, None, set(), [1], id="keep-window-nothing-durable"),
        pytest.param([1, 2, 3], 3, 2, set(), [1], id="older-than-durable-goes"),
        pytest.param([1, 2, 3], 3, 3, set(), [1, 2], id="all-superseded-newest-stays"),
        pytest.param([1, 2, 3], 1, None, {1}, [2], id="uploading-step-is-kept"),
        pytest.param([1, 2, 3], 1, 9, {2}, [1], id="newest-kept-even-if-remote-is-newer"),
        pytest.param([4], 1, 9, set(), [], id="single-step-never-deleted"),
        pytest.param([], 1, None, set(), [], id="empty"),
    ],
)
def test_local_retention_keeps_newest_and_uploading_and_drops_superseded(
    steps, local_keep, durable, protected, deleted
):
    got = local_steps_to_delete(
        steps, local_keep=local_keep, durable_step=durable, protected=protected
    )
    assert got == deleted


@pytest.mark.parametrize(
    ("remote", "local", "local_keep", "says"),
    [
        pytest.param("{tmp}/ckpt", "{tmp}/ckpt", 2, "same directory", id="local-equals-remote"),
        pytest.param("{tmp}/ckpt", "{tmp}/ckpt/cache", 2, "holds the other", id="nested"),
        pytest.param("memory://r/run", "memory://l/run", 2, "not a path on this node", id="url"),
        pytest.param("memory://r/run", "{tmp}/loc", 0, "local_keep", id="local-keep-0"),
        pytest.param("memory://r/run", "{tmp}/loc", True, "local_keep", id="local-keep-bool"),
    ],
)
def test_bad_two_tier_arguments_raise_config_error_saying_what_to_do(
    tmp_path, remote, local, local_keep, says
):
    with pytest.raises(ConfigError, match=says):
        Checkpointer(
            remote.format(tmp=tmp_path), local=local.format(tmp=tmp_path), local_keep=local_keep
        )


def test_ctrl_c_while_waiting_for_a_background_save_reaches_the_caller():
    # One tier on the slow filesystem: wait() blocks on a save of 8+ slow writes. A real SIGINT
    # from another thread must raise KeyboardInterrupt there, not vanish (it once did).
    ckpt = Checkpointer(f"slow://run-{uuid.uuid4().hex}", shard_bytes=64 << 10)
    # Python's own SIGINT handler, whatever an earlier test in this process left installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ckpt.save(0, make_state(0, mib=0.5), blocking=False)
        main = threading.main_thread().ident
        assert main is not None
        # To the main thread, as a terminal's Ctrl-C reaches a process waiting in it: a signal
        # the kernel hands to another thread does not interrupt the main thread's wait.
        timer = threading.Timer(WRITE_DELAY_S, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        started = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            ckpt.wait()
        assert time.perf_counter() - started < 8 * WRITE_DELAY_S  # before the save finished
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    ckpt.close()  # the save runs on and commits: nothing half-written is left behind
    assert ckpt.latest() is not None and ckpt.verify(0).ok


def test_local_commit_returns_at_once_while_a_slow_upload_lags_and_the_copy_stays(tmp_path):
    remote = f"slow://run-{uuid.uuid4().hex}"
    ckpt = Checkpointer(remote, local=tmp_path / "local", local_keep=1, shard_bytes=64 << 10)
    started = time.perf_counter()
    ckpt.save(0, make_state(0, mib=0.5))
    saved_in = time.perf_counter() - started
    assert ckpt.local_step == 0
    assert ckpt.durable_step is None  # 8+ files at WRITE_DELAY_S each: still uploading
    assert saved_in < WRITE_DELAY_S
    ckpt.save(1, make_state(1, mib=0.5))
    local_dirs = sorted(n for n in os.listdir(tmp_path / "local") if n.startswith("step-"))
    # local_keep=1 would drop step 0, but it is being uploaded: kept until a newer one is durable
    assert local_dirs == ["step-000000000000", "step-000000000001"]
    assert ckpt.wait_durable(timeout=60)
    assert ckpt.durable_step == 1
    assert [i.step for i in ckpt.remote.list()] == [0, 1]
    local_dirs = sorted(n for n in os.listdir(tmp_path / "local") if n.startswith("step-"))
    assert local_dirs == ["step-000000000001"]
    cost = ckpt.cost
    assert cost.upload.count == 2 and cost.durable.last > cost.save.last
    assert cost.upload.last >= WRITE_DELAY_S
    loaded = Checkpointer(remote).load()
    assert_same(loaded, make_state(1, mib=0.5))
    ckpt.close()


def test_a_failing_remote_is_retried_then_reported_by_wait_durable(tmp_path):
    faulty_fs.PLAN.fail_after_bytes = 0
    faulty_fs.PLAN.failures = 0
    try:
        ckpt = Checkpointer(f"faulty://run-{uuid.uuid4().hex}", local=tmp_path / "local")
        ckpt._uploader.backoff_secs = 0.01  # five tries in a blink, not in 7.5 s
        ckpt.save(3, make_state(3))
        assert ckpt.local_step == 3
        with pytest.raises(StorageError, match="step 3 is committed on the local tier"):
            ckpt.wait_durable(timeout=30)
        assert faulty_fs.PLAN.failures >= ckpt._uploader.attempts
        assert ckpt.durable_step is None
        ckpt.wait_durable(timeout=30)  # raised once
        state = make_state(0)
        assert ckpt.restore(state) == 3  # the local copy still serves this node
        assert_same(state, make_state(3))
        ckpt.close(wait_durable=False)
    finally:
        faulty_fs.PLAN.fail_after_bytes = None


def test_cost_file_round_trips_the_two_tier_fields_and_old_files_still_read(tmp_path):
    tracker = CostTracker()
    tracker.record_save(step=4, persist_seconds=0.2, nbytes=10, at=100.0)
    tracker.record_upload(step=4, upload_seconds=1.5, durable_seconds=1.8, at=101.0)
    tracker.record_restore(0.3, "local")
    tracker.record_restore(2.5, "remote")
    cost = tracker.snapshot()
    path = tmp_path / "cost.json"
    write_cost_file(path, cost, now=102.0)
    raw = json.loads(path.read_text())
    assert raw["upload_seconds_p95"] == 1.5 and raw["durable_seconds_last"] == 1.8
    assert raw["restore_local_seconds"] == 0.3 and raw["restore_remote_seconds"] == 2.5
    assert raw["last_durable_step"] == 4 and raw["last_durable_time"] == 101.0
    back = read_cost_file(path)
    assert back.upload.p95 == 1.5 and back.durable.last == 1.8 and back.durable.count == 1
    assert back.restore_local.last == 0.3 and back.restore_remote.last == 2.5
    assert back.last_durable_step == 4
    # one tier: the new fields are null, and read back as "not measured"
    single = CostTracker()
    single.record_save(step=1, persist_seconds=0.2, nbytes=10, at=100.0)
    write_cost_file(path, single.snapshot(), now=102.0)
    raw = json.loads(path.read_text())
    assert raw["upload_seconds_p95"] is None and raw["restore_local_seconds"] is None
    assert read_cost_file(path).upload.count == 0
    # a file of an older version has none of them
    old = {k: v for k, v in raw.items() if k.split("_")[0] not in ("upload", "durable")}
    old = {k: v for k, v in old.items() if "local" not in k and "remote" not in k}
    old = {k: v for k, v in old.items() if not k.startswith("last_durable")}
    path.write_text(json.dumps(old))
    back = read_cost_file(path)
    assert back.save.p95 == 0.2 and back.upload.count == 0 and back.last_durable_step is None


def test_the_decorator_passes_local_on_and_close_waits_for_the_upload(tmp_path):
    from preemptible import Context, preemptible

    remote = f"memory://tiers-{uuid.uuid4().hex}/run"
    cost_file = tmp_path / "cost.json"

    @preemptible(remote, every_steps=2, local=tmp_path / "local", cost_file=cost_file)
    def train(ctx: Context) -> int:
        weights = {"w": make_state(0)["weights"]["w0"]}
        ctx.register(model=weights)
        for _ in ctx.steps(total=5):
            weights["w"] += 1
        return ctx.checkpointer.local_step

    assert train() == 4
    # close() waited for the upload: the root has the final step, the cost file its upload
    assert Checkpointer(remote).latest().step == 4
    assert read_cost_file(cost_file).last_durable_step == 4
