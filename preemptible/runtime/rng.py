"""Every random number generator a training step may draw from, as one registrable object.

Bit-exact resume needs the exact generator states at the checkpointed step boundary: Python's
``random``, NumPy's global generator, torch's CPU generator and each CUDA device's generator.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

from preemptible.errors import PreemptibleWarning


class RNGState:
    """``state_dict``/``load_state_dict`` over all global generators of this process."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            state["cuda"] = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(_as_python_state(state["python"]))
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        cuda = state.get("cuda")
        if cuda and torch.cuda.is_available():
            if len(cuda) != torch.cuda.device_count():
                warnings.warn(
                    f"checkpoint has {len(cuda)} CUDA RNG states, this process sees "
                    f"{torch.cuda.device_count()} devices; restoring the ones that match",
                    PreemptibleWarning,
                    stacklevel=2,
                )
            for i, s in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, i)


def _as_python_state(state: Any) -> tuple[Any, ...]:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
