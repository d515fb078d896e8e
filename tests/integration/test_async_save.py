"""Background saves: capture at call time, persist later, never lose an error or the host."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from preemptible import Checkpointer
from preemptible.errors import BackgroundSaveError, StorageError
from tests import faulty_fs
from tests.helpers import assert_same, make_state


@pytest.fixture(params=["local-fork", "local-copy", "memory-copy", "s3-copy"])
def backend_and_mode(request) -> tuple[str, str]:
    backend, mode = request.param.split("-")
    return backend, mode


@pytest.fixture
def async_ckpt(backend_and_mode, request, tmp_path):
    backend, mode = backend_and_mode
    if backend == "local":
        return Checkpointer(tmp_path / "ckpt", async_mode=mode)
    if backend == "memory":
        return Checkpointer(f"memory://async/{tmp_path.name}", async_mode=mode)
    from tests.conftest import s3_root

    root = s3_root(request.getfixturevalue("moto_server"))
    return Checkpointer(root.url, storage_options=root.storage_options, async_mode=mode)


def test_the_checkpoint_holds_the_values_at_the_time_of_the_call(async_ckpt, backend_and_mode):
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    handle = async_ckpt.save(1, {"model": model, "optim": opt}, blocking=False)
    with torch.no_grad():  # the training loop goes on at once and mutates in place
        for p in model.parameters():
            p.mul_(-3.0).add_(1.0)
    info = handle.wait()
    assert info.step == 1 and handle.done()
    assert_same(before, async_ckpt.load(1)["model"])
    assert handle.mode == backend_and_mode[1]  # the mode asked for, no silent fallback


def test_a_second_save_waits_for_the_first_so_at_most_one_is_in_flight(async_ckpt):
    first = async_ckpt.save(1, make_state(1, mib=4), blocking=False)
    second = async_ckpt.save(2, make_state(2, mib=4), blocking=False)
    assert first.done()  # save(2) returned only after save(1) had finished
    second.wait()
    assert [i.step for i in async_ckpt.list()] == [1, 2]
    cost = async_ckpt.cost
    assert cost.save.count == 2 and cost.stall.last <= cost.persist.last


def test_the_stall_is_known_when_the_handle_returns_before_the_save_is_durable(async_ckpt):
    handle = async_ckpt.save(1, make_state(1, mib=32), blocking=False)
    cost = async_ckpt.cost  # what interval="auto" reads at the very next step
    assert cost.stall.count == 1 and cost.stall.last == pytest.approx(handle.stall_seconds)
    handle.wait()
    assert async_ckpt.cost.persist.count == 1


def test_a_failed_background_save_surfaces_on_the_next_call_and_in_the_log(caplog):
    faulty_fs.PLAN.fail_after_bytes, faulty_fs.PLAN.written = 100, 0
    try:
        ckpt = Checkpointer(f"faulty://async-{threading.get_ident()}", async_mode="copy")
        with caplog.at_level(logging.ERROR, logger="preemptible.checkpoint"):
            handle = ckpt.save(1, make_state(1), blocking=False)
            with pytest.raises(
                BackgroundSaveError, match="background save of step 1 failed"
            ) as err:
                ckpt.save(2, make_state(2), blocking=False)
        assert isinstance(err.value.__cause__, StorageError)
        assert "background save of step 1 failed" in caplog.text
        with pytest.raises(StorageError):
            handle.wait()  # the handle keeps its own error too
        faulty_fs.PLAN.fail_after_bytes = None
        ckpt.save(2, make_state(2), blocking=False)
        assert ckpt.wait().step == 2  # raised once, then the checkpointer works again
    finally:
        faulty_fs.PLAN.fail_after_bytes = None


def test_a_failed_forked_save_reports_the_childs_error(tiny_disk):
    ckpt = Checkpointer(tiny_disk / "run", async_mode="fork")
    ckpt.save(1, make_state(1, mib=1.0), blocking=False).wait()
    handle = ckpt.save(2, make_state(2, mib=6.0), blocking=False)
    assert handle.mode == "fork"  # the error below came from the child, not from a copy
    with pytest.raises(BackgroundSaveError, match="No space left"):
        ckpt.wait()
    assert [i.step for i in ckpt.list()] == [1]
    assert ckpt.verify(1).ok


def test_a_save_over_the_staging_cap_falls_back_to_synchronous_and_says_so(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path / "ckpt", max_staging_bytes=1024, async_mode="copy")
    with caplog.at_level(logging.WARNING, logger="preemptible.checkpoint"):
        handle = ckpt.save(1, make_state(1, mib=1.0), blocking=False)
    assert handle.mode == "sync" and handle.done()
    assert "saving synchronously instead" in caplog.text
    assert ckpt.latest().step == 1


def test_the_staging_buffer_is_reused_between_saves(tmp_path):
    ckpt = Checkpointer(tmp_path / "ckpt", async_mode="copy")
    ckpt.save(1, make_state(1, mib=1.0), blocking=False).wait()
    buffer = ckpt._staging._buffer
    ckpt.save(2, make_state(2, mib=1.0), blocking=False).wait()
    assert ckpt._staging._buffer is buffer


def test_the_default_mode_copies_cpu_state_on_a_local_disk(tmp_path):
    # A step rewrites the whole state: under fork the kernel would copy it page by page anyway
    # (async_save.py says why the default copies).
    ckpt = Checkpointer(tmp_path / "ckpt")
    handle = ckpt.save(1, make_state(1, mib=1.0), blocking=False)
    assert handle.mode == "copy"
    handle.wait()
    assert ckpt._staging.capacity >= 1 << 20  # into the reused staging buffer
