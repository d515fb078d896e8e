"""CUDA paths of the checkpoint store. Not part of `make test` (no GPU there): run with
`.venv/bin/pytest -m gpu tests/gpu` on a machine with a CUDA device."""

from __future__ import annotations

import pytest
import torch

from preemptible import Checkpointer, RNGState
from tests.helpers import assert_same

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cuda_tensors_round_trip_onto_the_gpu_bit_exactly(tmp_path):
    state = {"w": torch.randn(1024, 1024, device="cuda"), "h": torch.randn(8, device="cuda").half()}
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state)
    loaded = ckpt.load(1)
    assert loaded["w"].device.type == "cuda"
    assert_same({k: v.cpu() for k, v in state.items()}, {k: v.cpu() for k, v in loaded.items()})


def test_background_save_of_gpu_state_uses_pinned_staging_and_captures_call_time_values(tmp_path):
    w = torch.randn(4096, 4096, device="cuda")
    before = w.cpu()
    ckpt = Checkpointer(tmp_path, async_mode="auto")
    handle = ckpt.save(1, {"w": w}, blocking=False)
    w.mul_(-1)  # the next step, queued on the same stream right after the copy
    handle.wait()
    assert handle.mode == "copy" and ckpt._staging._buffer.is_pinned()
    assert torch.equal(ckpt.load(1, map_location="cpu")["w"], before)


def test_cuda_rng_state_is_restored():
    torch.cuda.init()  # RNGState saves CUDA generators once CUDA is in use
    rng = RNGState()
    torch.cuda.manual_seed_all(3)
    saved = rng.state_dict()
    expected = torch.rand(4, device="cuda")
    torch.cuda.manual_seed_all(9)
    rng.load_state_dict(saved)
    assert torch.equal(torch.rand(4, device="cuda"), expected)
