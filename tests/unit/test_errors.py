"""The error tree: the background-save error under its new name, and its deprecated alias."""

from __future__ import annotations

import pytest
import torch

import preemptible.errors as errors
from preemptible import Checkpointer
from preemptible.errors import BackgroundSaveError, CheckpointError, StorageError


def test_a_failed_background_save_is_raised_as_background_save_error(tmp_path, monkeypatch):
    ckpt = Checkpointer(tmp_path / "ckpt", async_mode="copy")

    def fail(*args: object, **kwargs: object) -> None:
        raise StorageError("No space left on device")

    monkeypatch.setattr(ckpt, "_write", fail)
    ckpt.save(1, {"x": torch.ones(2)}, blocking=False)
    with pytest.raises(BackgroundSaveError, match="background save of step 1 failed") as err:
        ckpt.wait()
    assert isinstance(err.value, CheckpointError) and isinstance(err.value, RuntimeError)
    assert isinstance(err.value.__cause__, StorageError)
    assert ckpt.wait() is None  # raised once


def test_the_old_name_is_the_same_class_and_warns():
    with pytest.warns(DeprecationWarning, match="catch BackgroundSaveError instead"):
        old = errors.SaveInProgressError
    assert old is BackgroundSaveError
    assert "SaveInProgressError" not in errors.__all__


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchError"):
        _ = errors.NoSuchError
