"""The checkpoint store's contract, run on every backend: local disk, memory://, and S3 through
s3fs against moto's server and SeaweedFS (real HTTP endpoints on 127.0.0.1)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from preemptible.errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    NoValidCheckpointError,
    PreemptibleWarning,
    StateMismatchError,
    StorageError,
    UnsupportedStateError,
)
from tests.helpers import assert_same, make_state


def _data_files(root, step: int) -> list[str]:
    fs = root.fs
    fs.invalidate_cache()
    return sorted(p for p in fs.find(f"{root.path}/step-{step:012d}") if "/data-" in p)


def _plant(root, relpath: str, data: bytes) -> None:
    path = f"{root.path}/{relpath}"
    root.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    root.fs.pipe_file(path, data)


def _flip_byte(root, path: str, at: int = 100) -> None:
    data = bytearray(root.fs.cat_file(path))
    data[at % len(data)] ^= 0x01
    root.fs.pipe_file(path, bytes(data))


def _truncate(root, path: str) -> None:
    data = root.fs.cat_file(path)
    root.fs.pipe_file(path, data[: len(data) // 2])


def test_save_then_load_is_bit_identical_for_every_supported_value(root):
    odd = torch.arange(24, dtype=torch.float64).reshape(4, 6).t()  # non-contiguous
    state = {
        "f32": torch.randn(33, 17),
        "bf16": torch.randn(9).to(torch.bfloat16),
        "f16": torch.randn(4, 4).half(),
        "f8": torch.randn(16).to(torch.float8_e4m3fn),
        "c64": torch.randn(5, dtype=torch.complex64),
        "bool": torch.tensor([True, False, True]),
        "i64": torch.tensor([-(1 << 62), 0, 1 << 62]),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 7),
        "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
        "transposed": odd,
        "np": np.arange(10, dtype=np.float16).reshape(2, 5),
        "np_scalar": np.int64(7),
        "py": {"int": 1 << 70, "float": 0.1, "str": "ü", "none": None, "bool": True},
        "seq": [1, (2, "three"), [4.0]],
        "bytes": b"\x00\xff",
        "int_keys": {0: "a", 1: {"b": torch.ones(2)}},
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
        "dtype": torch.float16,
    }
    ckpt = root.checkpointer()
    info = ckpt.save(7, state, metadata={"epoch": 2})
    assert info.step == 7 and info.metadata == {"epoch": 2} and info.bytes > 0
    loaded = ckpt.load(7)
    expected = dict(state, transposed=odd.contiguous())
    assert_same(expected, loaded)
    assert loaded["transposed"].equal(odd)


def test_restore_loads_modules_optimizers_and_schedulers_in_place(root):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(3):
        model(torch.randn(4, 8)).pow(2).sum().backward()
        opt.step()
        sched.step()
    ckpt = root.checkpointer()
    ckpt.save(3, {"model": model, "optim": opt, "sched": sched, "extra": {"epoch": 1}})

    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2)
    state2 = {"model": model2, "optim": opt2, "sched": sched2, "extra": {"epoch": 0}}
    weight_before = model2[0].weight
    assert ckpt.restore(state2) == 3
    assert model2[0].weight is weight_before  # in place, not replaced
    assert_same(model.state_dict(), model2.state_dict())
    assert_same(opt.state_dict(), opt2.state_dict())
    assert sched2.state_dict() == sched.state_dict()
    assert state2["extra"] == {"epoch": 1}
    assert ckpt.cost.restore.count == 1


def test_restore_of_an_empty_root_returns_none_and_load_raises(root):
    ckpt = root.checkpointer()
    assert ckpt.restore({"x": torch.zeros(1)}) is None
    assert ckpt.latest() is None and ckpt.list() == []
    with pytest.raises(CheckpointNotFoundError):
        ckpt.load()


def test_list_and_latest_ignore_a_save_that_never_committed(root):
    ckpt = root.checkpointer(keep=None)
    ckpt.save(1, make_state(1))
    # A half-written later step: data but no manifest, as a crash mid-save leaves it.
    _plant(root, "step-000000000002/data-00000.bin", b"partial")
    _plant(root, ".tmp-step-000000000003-abc/data-00000.bin", b"partial")
    assert [i.step for i in ckpt.list()] == [1]
    assert ckpt.latest().step == 1
    assert_same(make_state(1), ckpt.load())
    _, ignored = ckpt.scan()
    assert {i.name for i in ignored} >= {"step-000000000002"}


def test_retention_keeps_the_newest_and_every_kth(root):
    ckpt = root.checkpointer(keep=2, keep_every=4)
    for step in range(1, 11):
        ckpt.save(step, make_state(step, mib=0.01))
    assert [i.step for i in ckpt.list()] == [4, 8, 9, 10]
    fs = root.fs
    fs.invalidate_cache()
    leftovers = [p for p in fs.find(root.path) if "step-000000000005" in p]
    assert leftovers == []


def test_large_state_is_split_into_concurrently_written_shards(root):
    state = {f"t{i}": torch.randn(64 * 1024) for i in range(12)}  # 12 x 256 KiB
    ckpt = root.checkpointer(shard_bytes=512 * 1024, max_workers=4)
    info = ckpt.save(1, state)
    assert info.files >= 6  # data shards + state index
    assert_same(state, ckpt.load(1))


def test_verify_names_the_bit_flipped_file(root):
    ckpt = root.checkpointer()
    ckpt.save(1, make_state(1))
    assert ckpt.verify(1).ok
    victim = _data_files(root, 1)[0]
    _flip_byte(root, victim)
    report = ckpt.verify(1)
    assert not report.ok
    assert any(victim.rsplit("/", 1)[-1] in p and "checksum mismatch" in p for p in report.problems)


def test_verify_names_the_truncated_file(root):
    ckpt = root.checkpointer()
    ckpt.save(1, make_state(1))
    victim = _data_files(root, 1)[0]
    _truncate(root, victim)
    report = ckpt.verify()
    assert [p for p in report.problems if "truncated" in p and victim.rsplit("/", 1)[-1] in p]


def test_restore_falls_back_to_the_newest_valid_checkpoint_with_a_warning(root):
    ckpt = root.checkpointer(keep=None)
    ckpt.save(1, make_state(1))
    ckpt.save(2, make_state(2))
    _flip_byte(root, _data_files(root, 2)[0])
    state = make_state(0)
    with pytest.warns(PreemptibleWarning, match="step 2"):
        assert ckpt.restore(state) == 1
    assert_same(make_state(1), state)


def test_when_every_checkpoint_is_corrupt_restore_and_load_say_which_instead_of_none(root):
    ckpt = root.checkpointer(keep=None)
    ckpt.save(1, make_state(1))
    ckpt.save(2, make_state(2))
    _flip_byte(root, _data_files(root, 1)[0])
    _truncate(root, _data_files(root, 2)[0])
    state = make_state(0)
    with pytest.warns(PreemptibleWarning), pytest.raises(NoValidCheckpointError) as err:
        ckpt.restore(state)
    assert err.value.steps == [2, 1]
    message = str(err.value)
    assert "checksum mismatch" in message and "truncated" in message
    assert 'on_no_valid_checkpoint="start_over"' in message and "ckpt verify" in message
    assert isinstance(err.value, CheckpointCorruptedError)
    assert_same(make_state(0), state)  # nothing was loaded
    with pytest.warns(PreemptibleWarning), pytest.raises(NoValidCheckpointError):
        ckpt.load()


def test_restore_of_a_named_corrupt_step_raises_and_leaves_the_state_untouched(root):
    ckpt = root.checkpointer(keep=None)
    ckpt.save(1, make_state(1))
    ckpt.save(2, make_state(2))
    _truncate(root, _data_files(root, 2)[0])
    state = make_state(0)
    with pytest.raises(CheckpointCorruptedError) as err:
        ckpt.restore(state, step=2)
    assert err.value.step == 2 and "truncated" in str(err.value)
    assert_same(make_state(0), state)
    with pytest.raises(CheckpointNotFoundError, match="step 5"):
        ckpt.restore(state, step=5)


def test_a_committed_step_is_never_overwritten_by_a_second_writer(root):
    first, second = root.checkpointer(), root.checkpointer()
    first.save(5, make_state(5))
    info = second.save(5, make_state(99))
    assert info.step == 5
    assert_same(make_state(5), second.load(5))
    assert first.verify(5).ok
    files = root.fs.find(f"{root.path}/step-000000000005")
    assert len(files) == info.files + 1  # the loser's files are gone: data + index + manifest


def test_retention_leaves_another_writers_save_of_the_same_step_alone(root):
    # A zombie still writing step 5 (staged the backend's own way: in the step's folder on an
    # object store) while its replacement, already past it, retires its own step 5.
    replacement, zombie = root.checkpointer(keep=1), root.checkpointer()
    replacement.save(5, make_state(5))
    storage = zombie._storage
    staging = storage.begin("step-000000000005", "zombie000001")
    name = storage.data_name(staging, "data-00000")
    with storage.open_write(staging, name) as f:
        f.write(b"half a shard")
    replacement.save(6, make_state(6))  # keep=1: step 5 goes
    assert [i.step for i in replacement.list()] == [6]
    assert storage.read_bytes(staging.dirname, name) == b"half a shard"  # it once went too


def test_a_save_at_the_step_of_a_corrupt_checkpoint_moves_it_aside_and_commits(root):
    first, second = root.checkpointer(), root.checkpointer()
    first.save(4, make_state(4))
    first.save(5, make_state(5))
    victim = _data_files(root, 5)[0]
    _flip_byte(root, victim)
    with pytest.warns(PreemptibleWarning, match="step 5 .* is corrupt") as caught:
        info = second.save(5, make_state(55))
    assert victim.rsplit("/", 1)[-1] in str(caught[0].message)
    assert "checksum mismatch" in str(caught[0].message)
    assert info.step == 5 and second.verify(5).ok
    assert_same(make_state(55), first.load(5))
    root.fs.invalidate_cache()
    files = root.fs.find(f"{root.path}/step-000000000005")
    assert len(files) == info.files + 1  # the corrupt one's files are gone: data + index + manifest
    assert [i.step for i in first.list()] == [4, 5]


def test_discard_if_corrupt_moves_a_corrupt_checkpoint_aside_and_keeps_a_valid_one(root):
    ckpt = root.checkpointer(keep=None)
    ckpt.save(1, make_state(1))
    ckpt.save(2, make_state(2))
    assert ckpt.discard_if_corrupt(1).ok
    _flip_byte(root, _data_files(root, 2)[0])
    with pytest.warns(PreemptibleWarning, match="step 2 .* is corrupt .* trash"):
        report = ckpt.discard_if_corrupt(2)
    assert not report.ok and "checksum mismatch" in report.problems[0]
    assert [i.step for i in ckpt.list()] == [1]
    assert_same(make_state(1), ckpt.load())


def test_saves_after_a_fallback_past_corrupt_checkpoints_are_not_lost_to_retention(root):
    ckpt = root.checkpointer(keep=2, keep_every=10)
    for step in (10, 18, 19):
        ckpt.save(step, make_state(step))
    for step in (18, 19):
        _flip_byte(root, _data_files(root, step)[0])
    with pytest.warns(PreemptibleWarning):
        assert ckpt.restore(make_state(0)) == 10
    ckpt.save(11, make_state(11))  # the newest two are the corrupt ones: 11 stays all the same
    ckpt.save(12, make_state(12))
    assert [i.step for i in ckpt.list()] == [10, 12, 18, 19]
    with pytest.warns(PreemptibleWarning):
        assert ckpt.restore(make_state(0)) == 12


def test_a_save_never_replaces_a_step_folder_whose_manifest_it_cannot_read(root):
    ckpt = root.checkpointer()
    _plant(root, "step-000000000003/manifest.json", b"{not json")
    with pytest.raises(StorageError, match=r"step-000000000003 is in the way .* not valid JSON"):
        ckpt.save(3, make_state(3))
    root.fs.invalidate_cache()
    assert root.fs.cat_file(f"{root.path}/step-000000000003/manifest.json") == b"{not json"


def test_a_writer_that_raced_past_the_existence_check_still_loses(root, monkeypatch):
    if not root.backend.startswith("s3"):
        pytest.skip("the race needs two processes here; only a server decides it for real")
    first, second = root.checkpointer(), root.checkpointer()
    first.save(5, make_state(5))
    fs = second.storage.fs
    real_exists = fs.exists
    # Both writers checked before either wrote: the store's exclusive write must decide.
    monkeypatch.setattr(
        fs, "exists", lambda p, **kw: False if p.endswith("manifest.json") else real_exists(p, **kw)
    )
    info = second.save(5, make_state(99))
    monkeypatch.undo()
    assert info.step == 5
    assert_same(make_state(5), second.load(5))
    assert first.verify(5).ok


def test_stale_incomplete_saves_are_garbage_collected_fresh_ones_kept(root):
    fs = root.fs
    _plant(root, "step-000000000003/data-00000.x.bin", b"partial")
    ckpt = root.checkpointer(stale_after_seconds=3600)
    ckpt.save(1, make_state(1))
    fs.invalidate_cache()
    assert fs.exists(f"{root.path}/step-000000000003/data-00000.x.bin")  # might be a live writer
    later = root.checkpointer(stale_after_seconds=1e-6)
    later.save(2, make_state(2))
    fs.invalidate_cache()
    assert not fs.exists(f"{root.path}/step-000000000003/data-00000.x.bin")


def test_step_directories_with_an_unreadable_or_foreign_manifest_are_never_collected(root):
    fs = root.fs
    _plant(root, "step-000000000003/manifest.json", b"{not json")
    _plant(root, "step-000000000003/data-00000.x.bin", b"maybe committed")
    ckpt = root.checkpointer(stale_after_seconds=1e-6)
    ckpt.save(4, make_state(4))
    _plant(
        root,
        "step-000000000007/manifest.json",
        fs.cat_file(f"{root.path}/step-000000000004/manifest.json"),
    )
    ckpt.save(8, make_state(8))
    fs.invalidate_cache()
    assert fs.exists(f"{root.path}/step-000000000003/data-00000.x.bin")
    assert fs.exists(f"{root.path}/step-000000000007/manifest.json")  # says step 4: foreign
    _, ignored = ckpt.scan()
    assert {i.name: i.collectable for i in ignored} == {
        "step-000000000003": False,
        "step-000000000007": False,
    }


def test_restore_with_keys_the_checkpoint_lacks_says_which(root):
    ckpt = root.checkpointer()
    ckpt.save(1, {"model": torch.nn.Linear(2, 2)})
    with pytest.raises(StateMismatchError, match="optim"):
        ckpt.restore({"model": torch.nn.Linear(2, 2), "optim": {}})


def test_unsupported_values_are_refused_before_anything_is_written(root):
    ckpt = root.checkpointer()
    with pytest.raises(UnsupportedStateError, match=r"state\.cfg\.fn"):
        ckpt.save(1, {"cfg": {"fn": lambda: None}})
    assert ckpt.list() == []
