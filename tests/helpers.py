"""Small factories shared by tests: deterministic states and raw tampering with stored files."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def make_state(step: int, *, mib: float = 0.05, tensors: int = 6) -> dict[str, Any]:
    """A state whose every byte is a function of ``step``, so a loaded one names its step."""
    g = torch.Generator().manual_seed(step)
    per = max(1, int(mib * (1 << 20) / 4 / tensors))
    return {
        "weights": {f"w{i}": torch.randn(per + i, generator=g) for i in range(tensors)},
        "half": torch.randn(7, 3, generator=g).to(torch.bfloat16),
        "ids": torch.randint(0, 1 << 40, (11,), generator=g),
        "meta": {"step": step, "name": f"state-{step}", "lr": 0.1 / (step + 1)},
        "np": np.full(5, step, dtype=np.int32),
    }


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """Bit-exact structural equality of two states (dtypes and shapes included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        )
        assert torch.equal(_raw(a), _raw(b)), f"{path}: bytes differ"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {set(a)} vs {set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


def _raw(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)
