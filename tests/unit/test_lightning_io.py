"""PreemptibleCheckpointIO: atomic replacement, checksums, no pickle, and resume_path's choice."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from preemptible import (
    AlreadyComplete,
    CheckpointCorruptedError,
    Checkpointer,
    CheckpointFormatError,
    CheckpointNotFoundError,
    NoValidCheckpointError,
    PreemptibleWarning,
    UnsupportedStateError,
)
from preemptible.lightning import PreemptibleCheckpointIO, PreemptionCallback, _local_dir


def _checkpoint(step: int) -> dict:
    """What Lightning hands a CheckpointIO: nested values, int-keyed optimizer state."""
    return {
        "epoch": 0,
        "global_step": step,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": {"net.weight": torch.full((2, 3), float(step))},
        "loops": {"fit_loop": {"epoch_loop.batch_progress": {"total": {"completed": step}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None}},
        "optimizer_states": [
            {"state": {0: {"step": torch.tensor(float(step))}}, "param_groups": [{"lr": 0.1}]}
        ],
        "lr_schedulers": [],
    }


def test_round_trip_and_replace(tmp_path: Path) -> None:
    io = PreemptibleCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(_checkpoint(3), path)
    io.save_checkpoint(_checkpoint(3), path)  # same global_step again: still replaced
    io.save_checkpoint(_checkpoint(7), path)
    loaded = io.load_checkpoint(path)
    assert loaded["global_step"] == 7
    assert torch.equal(loaded["state_dict"]["net.weight"], torch.full((2, 3), 7.0))
    assert loaded["optimizer_states"][0]["state"][0]["step"].item() == 7.0
    infos = Checkpointer(path).list()
    assert [i.step for i in infos] == [7], "one committed checkpoint, the newest, at its step"
    assert infos[0].metadata["global_step"] == 7


def test_the_step_folder_is_the_global_step_or_one_past_the_last(tmp_path: Path) -> None:
    io = PreemptibleCheckpointIO()
    path = tmp_path / "last.ckpt"
    steps = []
    for global_step in (3, 3, 10, 4):  # twice at one step; then a resume from an older one
        io.save_checkpoint(_checkpoint(global_step), path)
        steps.append(Checkpointer(path).latest().step)
    assert steps == [3, 4, 10, 11]
    assert io.load_checkpoint(path)["global_step"] == 4, "the newest save, whatever its folder"


def test_corrupted_file_is_detected(tmp_path: Path) -> None:
    io = PreemptibleCheckpointIO()
    path = tmp_path / "a.ckpt"
    io.save_checkpoint(_checkpoint(1), path)
    (data,) = path.glob("step-*/data-*.bin")
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorruptedError):
        io.load_checkpoint(path)  # its only checkpoint fails verification


def test_resume_path_refuses_to_start_over_silently_when_no_checkpoint_is_valid(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    io = PreemptibleCheckpointIO()
    for name, step in (("last.ckpt", 24), ("preempted.ckpt", 30)):
        io.save_checkpoint(_checkpoint(step), tmp_path / name)
        (data,) = (tmp_path / name).glob("step-*/data-*.bin")
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x10  # a real bit flip
        data.write_bytes(bytes(raw))
    with pytest.warns(PreemptibleWarning), pytest.raises(NoValidCheckpointError) as err:
        PreemptionCallback(tmp_path).resume_path()
    assert err.value.steps == [30, 24]
    assert "preempted.ckpt (global step 30)" in str(err.value)
    assert 'on_no_valid_checkpoint="start_over"' in str(err.value)
    start_over = PreemptionCallback(tmp_path, on_no_valid_checkpoint="start_over")
    with pytest.warns(PreemptibleWarning), caplog.at_level(logging.WARNING, "preemptible"):
        assert start_over.resume_path() is None
    assert "starting over" in caplog.text and "checksum mismatch" in caplog.text


def test_never_unpickles(tmp_path: Path) -> None:
    """A torch.save file at the path is not read; an object with no pickle-free form is refused."""

    class Boom:
        def __reduce__(self) -> tuple:
            raise AssertionError("unpickled")

    path = tmp_path / "foreign.ckpt"
    torch.save({"x": 1}, path)
    with pytest.raises(CheckpointFormatError, match="unpickle"):
        PreemptibleCheckpointIO().load_checkpoint(path)
    with pytest.raises(CheckpointNotFoundError):
        PreemptibleCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(UnsupportedStateError, match="hyper_parameters"):
        PreemptibleCheckpointIO().save_checkpoint(
            {"global_step": 1, "hyper_parameters": {"obj": Boom()}}, tmp_path / "b.ckpt"
        )
    assert not list((tmp_path / "b.ckpt").glob("step-*")), "nothing committed"


def test_remove(tmp_path: Path) -> None:
    io = PreemptibleCheckpointIO()
    io.save_checkpoint(_checkpoint(1), tmp_path / "epoch=0.ckpt")
    io.remove_checkpoint(tmp_path / "epoch=0.ckpt")
    assert not (tmp_path / "epoch=0.ckpt").exists()
    io.remove_checkpoint(tmp_path / "epoch=0.ckpt")  # gone already: no error


def test_resume_path_picks_newest_valid(tmp_path: Path) -> None:
    io = PreemptibleCheckpointIO()
    callback = PreemptionCallback(tmp_path / "ckpt")
    assert callback.resume_path() is None, "first run: nothing to resume"
    io.save_checkpoint(_checkpoint(24), tmp_path / "ckpt" / "last.ckpt")
    io.save_checkpoint(_checkpoint(30), tmp_path / "ckpt" / "preempted.ckpt")
    io.save_checkpoint(_checkpoint(12), tmp_path / "ckpt" / "epoch=0-step=12.ckpt")
    (tmp_path / "ckpt" / "notes.txt").write_text("ignored")
    assert callback.resume_path() == str(tmp_path / "ckpt" / "preempted.ckpt")
    (data,) = (tmp_path / "ckpt" / "preempted.ckpt").glob("step-*/data-*.bin")
    data.write_bytes(b"\0" * data.stat().st_size)
    with pytest.warns(PreemptibleWarning, match="preempted.ckpt"):
        assert callback.resume_path() == str(tmp_path / "ckpt" / "last.ckpt"), "corrupt: skipped"


def test_memory_url(tmp_path: Path) -> None:
    """Any fsspec URL: the same save, load and resume on memory://."""
    io = PreemptibleCheckpointIO()
    io.save_checkpoint(_checkpoint(5), "memory://lt-unit/ckpt/last.ckpt")
    assert io.load_checkpoint("memory://lt-unit/ckpt/last.ckpt")["global_step"] == 5
    callback = PreemptionCallback("memory://lt-unit/ckpt")
    assert callback.resume_path() == "memory://lt-unit/ckpt/last.ckpt"
    io.remove_checkpoint("memory://lt-unit/ckpt/last.ckpt")
    assert callback.resume_path() is None


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def train_dataloader(self) -> Any:
        data = torch.utils.data.TensorDataset(torch.randn(8, 2))
        return torch.utils.data.DataLoader(data, batch_size=2)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(ckpt: Path) -> None:
    preemption = PreemptionCallback(ckpt)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[PreemptibleCheckpointIO()],
        callbacks=[ModelCheckpoint(dirpath=ckpt, save_last=True), preemption],
    )
    trainer.fit(_Tiny(), ckpt_path=preemption.resume_path())


def test_a_finished_fit_started_again_logs_the_resume_and_exits_0(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _fit(tmp_path)
    with caplog.at_level(logging.INFO, "preemptible"), pytest.raises(SystemExit) as exit_:
        _fit(tmp_path)
    assert isinstance(exit_.value, AlreadyComplete) and exit_.value.code == 0
    resumed = [r.message for r in caplog.records if r.message.startswith("resuming from")]
    assert resumed == [f"resuming from {tmp_path / 'last.ckpt'} at step 4"]
    assert f"already complete at step 4: the checkpoint at {tmp_path / 'last.ckpt'}" in caplog.text


# --- two tiers (local=) ------------------------------------------------------------------------


def test_with_local_a_save_commits_locally_and_is_uploaded_to_the_path(tmp_path: Path) -> None:
    io = PreemptibleCheckpointIO(local=tmp_path / "node")
    path = tmp_path / "ckpt" / "last.ckpt"
    io.save_checkpoint(_checkpoint(3), path)
    io.save_checkpoint(_checkpoint(7), path)
    (sub,) = (tmp_path / "node").iterdir()
    assert sub.name.startswith("last.ckpt-"), "readable: named from the path"
    assert Checkpointer(sub).latest() is not None, "committed on the local tier"
    assert io.wait_durable(timeout=30)
    remote = Checkpointer(path).list()
    assert [i.metadata["global_step"] for i in remote] == [7], "keep=1 on the remote too"
    assert io.load_checkpoint(path)["global_step"] == 7
    io.teardown()
    assert PreemptibleCheckpointIO().load_checkpoint(path)["global_step"] == 7, "one tier reads it"


def test_with_local_two_paths_never_share_a_sub_directory(tmp_path: Path) -> None:
    io = PreemptibleCheckpointIO(local=tmp_path / "node")
    for run in ("a", "b"):
        io.save_checkpoint(_checkpoint(1), tmp_path / run / "last.ckpt")
    io.teardown()
    names = sorted(p.name for p in (tmp_path / "node").iterdir())
    assert len(names) == 2 and all(n.startswith("last.ckpt-") for n in names), names


def test_with_local_load_takes_the_newest_copy_of_either_tier(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "last.ckpt"
    PreemptibleCheckpointIO().save_checkpoint(_checkpoint(5), path)  # remote only
    io = PreemptibleCheckpointIO(local=tmp_path / "node")
    assert io.load_checkpoint(path)["global_step"] == 5, "the remote's, no local copy yet"
    io.save_checkpoint(_checkpoint(9), path)
    io.close(wait_durable=False)  # the upload may be cut off: the local copy is newer
    assert io.load_checkpoint(path)["global_step"] == 9


def test_with_local_remove_deletes_both_tiers(tmp_path: Path) -> None:
    io = PreemptibleCheckpointIO(local=tmp_path / "node")
    path = tmp_path / "ckpt" / "epoch=0.ckpt"
    io.save_checkpoint(_checkpoint(1), path)
    io.remove_checkpoint(path)  # its upload finishes first, then both go
    assert not path.exists()
    assert list((tmp_path / "node").iterdir()) == []
    io.teardown()


def test_with_local_resume_path_sees_a_save_whose_upload_never_ran(tmp_path: Path) -> None:
    node, ckpt = tmp_path / "node", tmp_path / "ckpt"
    io = PreemptibleCheckpointIO(local=node)
    io.save_checkpoint(_checkpoint(24), ckpt / "last.ckpt")
    io.teardown()
    # What a process killed before its upload leaves: the local copy alone.
    preempted = str(ckpt / "preempted.ckpt")
    meta = {"global_step": 30, "epoch": 1, "format": "lightning", "lightning_path": preempted}
    Checkpointer(_local_dir(str(node), preempted)).save(0, _checkpoint(30), metadata=meta)
    Checkpointer(node / "stray").save(0, _checkpoint(40), metadata={"global_step": 40})
    assert PreemptionCallback(ckpt).resume_path() == str(ckpt / "last.ckpt"), "remote only"
    callback = PreemptionCallback(ckpt, local=node)
    assert callback.resume_path() == preempted
    assert io.load_checkpoint(preempted)["global_step"] == 30
    other = PreemptionCallback(tmp_path / "elsewhere", local=node)
    assert other.resume_path() is None, "another run's local copies are not its"
