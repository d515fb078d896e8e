"""Loading a checkpoint into live objects, with torch.distributed.checkpoint's semantics."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from preemptible.errors import StateMismatchError


def apply_loaded(target: Any, loaded: Any, path: str, step: int) -> None:
    """Load ``loaded`` into ``target`` in place.

    Objects with ``load_state_dict`` load their part; tensors are copied into (so they keep their
    device and identity); nested dicts are restored recursively; other entries are replaced.
    Keys that ``target`` has and the checkpoint lacks are an error: silently keeping a freshly
    initialised value would resume a different model.
    """
    if _has_load_state_dict(target):
        target.load_state_dict(loaded)
        return
    if not isinstance(target, MutableMapping):
        raise StateMismatchError(
            f"{path}: restore() needs a dict (or an object with load_state_dict) to load into, "
            f"got {type(target).__name__}; use load() to get the checkpoint as plain data"
        )
    if not isinstance(loaded, Mapping):
        raise StateMismatchError(
            f"{path}: checkpoint step {step} holds a {type(loaded).__name__} here, not a dict"
        )
    missing = [k for k in target if k not in loaded]
    if missing:
        raise StateMismatchError(
            f"{path}: checkpoint step {step} has no {missing!r} "
            f"(it has {sorted(map(str, loaded))}). Restore with the same keys as when it was "
            "saved, or use load() and pick what you need"
        )
    for key, live in target.items():
        value, where = loaded[key], f"{path}.{key}"
        if _has_load_state_dict(live):
            live.load_state_dict(value)
        elif value is live:
            continue  # a sharded tensor that was loaded in place
        elif isinstance(live, torch.Tensor) and isinstance(value, torch.Tensor):
            if live.shape != value.shape or live.dtype != value.dtype:
                raise StateMismatchError(
                    f"{where}: live tensor is {tuple(live.shape)} {live.dtype}, checkpoint step "
                    f"{step} has {tuple(value.shape)} {value.dtype}"
                )
            with torch.no_grad():
                live.copy_(value)
        elif isinstance(live, MutableMapping) and isinstance(value, Mapping):
            apply_loaded(live, value, where, step)
        else:
            target[key] = value


def _has_load_state_dict(obj: Any) -> bool:
    return not isinstance(obj, Mapping | torch.Tensor) and callable(
        getattr(obj, "load_state_dict", None)
    )
