"""PreemptibleAccelerator with a real Accelerator on the CPU, in this process: Accelerate's
naming and total_limit on the atomic store, what is refused and why, and Accelerate's own
behaviour where ours differs on purpose."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch

pytest.importorskip("accelerate")

from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import ProjectConfiguration
from torch.utils.data import DataLoader, TensorDataset

from preemptible import (
    AlreadyComplete,
    CheckpointCorruptedError,
    Checkpointer,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ConfigError,
    NoValidCheckpointError,
    PreemptibleWarning,
    UnsupportedStateError,
)
from preemptible.accelerate import PreemptibleAccelerator


class Flaky:
    """A registered object whose state_dict fails on demand: a save that breaks midway."""

    def __init__(self) -> None:
        self.fail = False
        self.value = torch.zeros(3)

    def state_dict(self) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("the disk is full")
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value.copy_(state["value"])


class Run:
    """One prepared Accelerator: a model, its optimizer, a shuffled loader."""

    def __init__(
        self, project: Path, *, total_limit: Any = None, naming: bool = True, accumulate: int = 1
    ) -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        torch.manual_seed(0)
        config = ProjectConfiguration(
            project_dir=str(project), automatic_checkpoint_naming=naming, total_limit=total_limit
        )
        self.accelerator = Accelerator(
            cpu=True, project_config=config, gradient_accumulation_steps=accumulate
        )
        data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        model = torch.nn.Linear(4, 1)
        self.model, self.opt, self.loader = self.accelerator.prepare(
            model,
            torch.optim.Adam(model.parameters(), lr=0.1),
            DataLoader(data, batch_size=4, shuffle=True),
        )

    def train(self, acc: PreemptibleAccelerator, batches: int) -> None:
        for n, (x, y) in enumerate(acc.batches(self.loader), 1):
            self.accelerator.backward(torch.nn.functional.mse_loss(self.model(x), y))
            self.opt.step()
            self.opt.zero_grad()
            if n == batches:
                break


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    yield lambda **kw: Run(tmp_path / "project", **kw)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _folders(run: Run) -> list[str]:
    return sorted(p.name for p in (Path(run.accelerator.project_dir) / "checkpoints").iterdir())


def _weights(run: Run) -> torch.Tensor:
    return run.model.weight.detach().clone()


# --- Accelerate's habits ---------------------------------------------------------------------


def test_save_state_names_checkpoints_like_accelerate_and_routes_the_accelerators_own(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        first = acc.save_state()
        r.train(acc, 2)
        r.accelerator.save_state()  # the accelerator's own method, routed to ours
    assert _folders(r) == ["checkpoint_0", "checkpoint_1"]
    assert r.accelerator.project_configuration.iteration == 2
    assert first.endswith("checkpoint_0")
    steps = [Checkpointer(Path(first).parent / n).latest().step for n in _folders(r)]
    assert steps == [0, 2], "each folder is a store with one committed step: batches trained"
    assert "save_state" not in r.accelerator.__dict__, "close() gives the method back"


def test_total_limit_keeps_the_newest_n(run):
    r = run(total_limit=2)
    with PreemptibleAccelerator(r.accelerator) as acc:
        for _ in range(4):
            r.train(acc, 1)
            acc.save_state()
    assert _folders(r) == ["checkpoint_2", "checkpoint_3"]


def test_a_failed_save_deletes_nothing_where_accelerates_own_deleted_first(run, tmp_path):
    r = run(total_limit=1)
    flaky = Flaky()
    r.accelerator.register_for_checkpointing(flaky)
    with PreemptibleAccelerator(r.accelerator) as acc:
        acc.save_state()
        saved = _weights(r)
        r.train(acc, 1)
        flaky.fail = True
        with pytest.raises(RuntimeError, match="disk is full"):
            acc.save_state()
        flaky.fail = False
        assert _folders(r) == ["checkpoint_0"]
        assert acc.load_state() == 0
        assert torch.equal(_weights(r), saved)
    # Accelerate's own save_state (accelerator.py:3666-3682) removes the old folder first.
    theirs = run(total_limit=1)
    theirs.accelerator.register_for_checkpointing(flaky)
    Accelerator.save_state(theirs.accelerator)
    flaky.fail = True
    with pytest.raises(RuntimeError, match="disk is full"):
        Accelerator.save_state(theirs.accelerator)
    assert _folders(theirs) == ["checkpoint_1"], "the good checkpoint is gone"
    assert not list(
        (Path(theirs.accelerator.project_dir) / "checkpoints/checkpoint_1").glob(
            "custom_checkpoint_*"
        )
    ), "and the new one is incomplete"


def test_a_restart_continues_the_numbering_where_accelerate_refuses(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        acc.save_state()
        acc.save_state()
    again = run()
    with pytest.raises(ValueError, match="already exists"):
        Accelerator.save_state(again.accelerator)  # iteration restarts at 0 in a new process
    with PreemptibleAccelerator(again.accelerator) as acc:
        acc.load_state()
        assert again.accelerator.project_configuration.iteration == 2
        acc.save_state()
    assert "checkpoint_2" in _folders(again)


def test_load_state_restores_weights_optimizer_position_and_returns_the_step(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        r.train(acc, 3)
        acc.save_state()
        saved_w, saved_opt = _weights(r), r.opt.state_dict()["state"][0]["exp_avg"].clone()
        r.train(acc, 1)  # the loader is followed on: the pass continues
    again = run()
    with PreemptibleAccelerator(again.accelerator) as acc:
        assert acc.load_state() == 3
        assert (acc.epoch, acc.global_step) == (0, 3)
        assert torch.equal(_weights(again), saved_w)
        assert torch.equal(again.opt.state_dict()["state"][0]["exp_avg"], saved_opt)
        assert len(list(acc.batches(again.loader))) == 1, "3 of 4 batches were trained"
        assert acc.epoch == 1


def test_first_run_has_nothing_to_load(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        assert acc.load_state() is None
        assert list(acc.epochs(2)) == [0, 1], "epochs whose body skips batches() still advance"


def test_a_notice_mid_accumulation_saves_at_the_end_of_the_cycle(run):
    r = run(accumulate=2)
    with PreemptibleAccelerator(r.accelerator) as acc:
        with pytest.raises(SystemExit) as stopped:
            for n, (x, y) in enumerate(acc.batches(r.loader), 1):
                with r.accelerator.accumulate(r.model):
                    r.accelerator.backward(torch.nn.functional.mse_loss(r.model(x), y))
                    r.opt.step()
                    r.opt.zero_grad()
                if n == 1:
                    acc.context.guard.request("test")  # gradients of batch 1 not applied yet
        assert stopped.value.code == 143 and acc.should_stop
    checkpoint = Path(r.accelerator.project_dir) / "checkpoints" / "checkpoint_0"
    assert Checkpointer(checkpoint).latest().step == 2


# --- falling back, and what is refused ------------------------------------------------------


def _flip_a_byte(folder: Path) -> None:
    (data,) = folder.glob("step-*/data-*.bin")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))


def test_a_corrupted_newest_checkpoint_falls_back_and_an_explicit_one_fails(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        r.train(acc, 1)
        acc.save_state()
        r.train(acc, 1)
        newest = Path(acc.save_state())
    _flip_a_byte(newest)
    again = run()
    with PreemptibleAccelerator(again.accelerator) as acc:
        with pytest.warns(PreemptibleWarning, match="skipping checkpoint step 2"):
            assert acc.load_state() == 1
        acc.save_state()
    assert _folders(again)[-1] == "checkpoint_2", "never reuse a number"
    with (
        PreemptibleAccelerator(run().accelerator) as acc,
        pytest.raises(CheckpointCorruptedError, match="step 2"),
    ):
        acc.load_state(newest)


def test_an_interrupted_save_is_skipped_then_deleted_after_the_next_commit(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        acc.save_state()
    torn = Path(r.accelerator.project_dir) / "checkpoints/checkpoint_1/.tmp-step-000000000004-ab"
    torn.mkdir(parents=True)
    (torn / "data-00000.bin").write_bytes(b"half a checkpoint")
    again = run()
    with PreemptibleAccelerator(again.accelerator) as acc:
        assert acc.load_state() == 0
        acc.save_state()
    assert _folders(again) == ["checkpoint_0", "checkpoint_2"]


def test_when_every_checkpoint_is_corrupt_the_run_stops_unless_it_starts_over(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        for _ in range(2):
            r.train(acc, 1)
            acc.save_state()
    for name in _folders(r):
        _flip_a_byte(Path(r.accelerator.project_dir) / "checkpoints" / name)
    again = run()
    with (
        PreemptibleAccelerator(again.accelerator) as acc,
        pytest.warns(PreemptibleWarning),
        pytest.raises(NoValidCheckpointError) as err,
    ):
        acc.load_state()
    assert err.value.steps == [2, 1] and "checkpoint_1" in str(err.value)
    assert 'on_no_valid_checkpoint="start_over"' in str(err.value)
    fresh = run()
    with PreemptibleAccelerator(fresh.accelerator, on_no_valid_checkpoint="start_over") as acc:
        with pytest.warns(PreemptibleWarning):
            assert acc.load_state() is None
        assert acc.global_step == 0
        acc.save_state()
    assert _folders(fresh)[-1] == "checkpoint_2", "never reuse a number"


def test_a_finished_run_started_again_says_so_and_exits_0(run, caplog):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        for _ in acc.epochs(1):
            r.train(acc, 4)
        acc.save_state()
    again = run()
    ran = []
    with (
        caplog.at_level(logging.INFO, logger="preemptible"),
        PreemptibleAccelerator(again.accelerator) as acc,
        pytest.raises(SystemExit) as exit_,
    ):
        for epoch in acc.epochs(1):
            ran.append(epoch)
    assert isinstance(exit_.value, AlreadyComplete) and exit_.value.code == 0 and ran == []
    assert "resumed from step 4 at " in caplog.text
    assert "already complete at step 4: the checkpoint at " in caplog.text
    assert "epochs 0 to 0 are done" in caplog.text


def test_accelerates_own_checkpoint_is_refused_not_unpickled_nor_deleted(run, tmp_path):
    r = run(total_limit=1)
    Accelerator.save_state(r.accelerator)  # checkpoint_0 in Accelerate's pickle format
    with (
        PreemptibleAccelerator(r.accelerator) as acc,
        pytest.raises(CheckpointFormatError, match="unpickle"),
    ):
        acc.load_state(Path(r.accelerator.project_dir) / "checkpoints/checkpoint_0")
    with PreemptibleAccelerator(run(total_limit=1).accelerator) as acc:
        assert acc.load_state() is None
        acc.save_state()
    assert _folders(r) == ["checkpoint_0", "checkpoint_1"], "total_limit counts only ours"


def test_save_state_to_an_output_dir_replaces_it_atomically(run, tmp_path):
    r = run()
    out = tmp_path / "export"
    with PreemptibleAccelerator(r.accelerator) as acc:
        acc.save_state(out)
        r.train(acc, 2)
        acc.save_state(out)
        assert [i.step for i in Checkpointer(out).list()] == [2]
        assert acc.load_state(out) == 2
    assert not (Path(r.accelerator.project_dir) / "checkpoints").exists()


def test_cost_is_measured_and_written_to_the_cost_file(run, tmp_path):
    cost_file = tmp_path / "cost.json"
    r = run()
    with PreemptibleAccelerator(r.accelerator, cost_file=cost_file) as acc:
        acc.save_state()
        acc.save_state()
    cost = json.loads(cost_file.read_text())
    assert cost["samples"] == 2 and cost["save_seconds_p95"] > 0 and cost["bytes"] > 0
    with PreemptibleAccelerator(run().accelerator) as acc:
        acc.load_state()
        assert acc.cost.restore.count == 1 and acc.cost.restore.last > 0


class Opaque:
    def state_dict(self) -> dict[str, Any]:
        return {"fn": print}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@pytest.mark.parametrize("limit", [0, -2, "3", True], ids=["zero", "negative", "str", "bool"])
def test_a_bad_total_limit_is_refused(run, limit):
    with pytest.raises(ConfigError, match="total_limit must be a positive integer"):
        PreemptibleAccelerator(run(total_limit=limit).accelerator)


def test_a_process_started_as_one_of_two_that_runs_alone_is_refused(run, monkeypatch):
    """What ``accelerate launch --multi_gpu`` gives on a machine without GPUs: a launcher that
    started two processes (WORLD_SIZE=2) whose Accelerator runs alone."""
    r = run()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"one of 2 \(WORLD_SIZE=2\).*ACCELERATE_USE_CPU=1"):
        PreemptibleAccelerator(r.accelerator)
    assert not (Path(r.accelerator.project_dir) / "checkpoints").exists()
    monkeypatch.setenv("WORLD_SIZE", "1")
    with PreemptibleAccelerator(r.accelerator) as acc:
        assert acc.load_state() is None


def test_bad_input_gets_errors_that_say_what_to_do(run, tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoint_dir=.*automatic_checkpoint_naming=True"):
        PreemptibleAccelerator(run(naming=False).accelerator)
    r = run()
    r.accelerator.register_for_checkpointing(Opaque())
    with PreemptibleAccelerator(r.accelerator) as acc:
        with pytest.raises(CheckpointNotFoundError, match="no committed checkpoint at"):
            acc.load_state(tmp_path / "nowhere")
        with pytest.raises(ConfigError, match="map_location"):
            acc.load_state(map_location="cpu")
        with pytest.raises(ConfigError, match="prepare"):
            next(acc.batches(DataLoader(TensorDataset(torch.zeros(4)))))
        with pytest.raises(UnsupportedStateError, match=r"custom\[0\].state_dict\(\).fn"):
            acc.save_state()
        with pytest.raises(ConfigError, match="total must be >= 0"):
            next(acc.epochs(-1))


def test_two_tiers_over_several_nodes_are_refused_before_the_first_save(monkeypatch):
    """Processes on several nodes cannot share one local folder: refused when the wrapper is
    made (the first save may be a notice's), from the launcher's LOCAL_WORLD_SIZE."""
    from preemptible.accelerate import _check_one_node

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    _check_one_node(4)  # every process on this node
    with pytest.raises(ConfigError, match=r"8 processes with 4 per node.*--num_machines=1"):
        _check_one_node(8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    _check_one_node(8)  # unknown here: the first save checks hosts and folders collectively


def test_something_prepared_after_the_first_save_is_named(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        acc.save_state()
        r.accelerator.prepare(torch.nn.Linear(2, 2))
        with pytest.raises(ConfigError, match="models: 1 when the first save or load ran, 2 now"):
            acc.save_state()


def test_no_warning_on_a_clean_resume(run):
    r = run()
    with PreemptibleAccelerator(r.accelerator) as acc:
        acc.save_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PreemptibleWarning)
        with PreemptibleAccelerator(run().accelerator) as acc:
            assert acc.load_state() == 0


def test_an_fsspec_url_gets_the_same_naming_total_limit_and_fallback(run):
    url = "memory://accelerate-test/run1"
    r = run(total_limit=2)
    with PreemptibleAccelerator(r.accelerator, checkpoint_dir=url) as acc:
        for _ in range(3):
            r.train(acc, 1)
            acc.save_state()
    names = sorted(p.rsplit("/", 1)[-1] for p in fsspec.filesystem("memory").ls(url, detail=False))
    assert names == ["checkpoint_1", "checkpoint_2"]
    with PreemptibleAccelerator(run(total_limit=2).accelerator, checkpoint_dir=url) as acc:
        assert acc.load_state() == 3
    fsspec.filesystem("memory").rm(url, recursive=True)
