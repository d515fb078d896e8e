"""Loading a checkpoint into live objects, in place.

The rule: after ``restore(state)`` returns, reading ``state`` back gives what ``load()`` returns.
Live state (tensors, objects with ``load_state_dict``) is loaded into, strictly: a tensor keeps
its identity and device and must match shape and dtype; a key the live state has and the
checkpoint lacks is an error, since resuming with a freshly initialised value resumes a
different run. Plain data is filled: a dict is updated in place (keys only the checkpoint has are
added), a list of the same length is restored item by item, a list of another length that holds
only plain data takes the checkpoint's items, and scalars, strings, numpy arrays and tuples of
plain data are replaced in their container.

The alternatives were torch.distributed.checkpoint's rule (only the keys the live state names are
loaded), which leaves a ``{"meta": {}}`` template empty without a word, and silently keeping live
values the checkpoint lacks, which resumes a mix of two runs. The work is planned first and done
after: a mismatch anywhere raises before anything is changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import numpy as np
import torch

from preemptible.errors import StateMismatchError

_Plan = list[Callable[[], object]]

# What save() stores as a value: these are replaced, never loaded into.
_PLAIN = (
    type(None),
    bool,
    int,
    float,
    str,
    bytes,
    bytearray,
    torch.dtype,
    np.ndarray,
    np.generic,
)


def apply_loaded(target: Any, loaded: Any, path: str, step: int) -> None:
    """Load ``loaded`` into ``target`` in place, by the rule of this module.

    Raises:
        StateMismatchError: ``target`` cannot be loaded in place, or it and the checkpoint
            disagree (a missing key, another shape, dtype or container). Nothing was changed,
            except by a ``load_state_dict`` of the user's that raised something else.
    """
    if not isinstance(target, MutableMapping | list | torch.Tensor) and not _has_load_state_dict(
        target
    ):
        raise StateMismatchError(
            f"{path}: restore() loads in place into a dict, a list, a tensor or an object with "
            f"load_state_dict, not a {type(target).__name__}; use load() to get the checkpoint "
            "as plain data"
        )
    plan: _Plan = []
    _plan(target, loaded, path, step, plan)
    for action in plan:
        action()


def _plan(live: Any, loaded: Any, where: str, step: int, plan: _Plan) -> Any:
    """Plan loading ``loaded`` into ``live``; return what ``live``'s container should hold."""
    if loaded is live:
        return live  # a sharded tensor (DTensor) that DCP loaded in place
    if _has_load_state_dict(live):
        plan.append(functools.partial(live.load_state_dict, loaded))
        return live
    if isinstance(live, torch.Tensor):
        _plan_tensor(live, loaded, where, step, plan)
        return live
    if isinstance(live, MutableMapping):
        _plan_mapping(live, loaded, where, step, plan)
        return live
    if isinstance(live, list):
        _plan_list(live, loaded, where, step, plan)
        return live
    if isinstance(live, tuple) and not _is_plain(live):
        return _plan_tuple(live, loaded, where, step, plan)
    if _is_plain(live):
        return loaded
    raise StateMismatchError(
        f"{where}: cannot load into a {type(live).__module__}.{type(live).__qualname__}: it has "
        "no load_state_dict; give it one, or put its state in the dict instead"
    )


def _plan_tensor(live: torch.Tensor, loaded: Any, where: str, step: int, plan: _Plan) -> None:
    if not isinstance(loaded, torch.Tensor):
        raise _mismatch(where, step, "a tensor", loaded)
    if live.shape != loaded.shape or live.dtype != loaded.dtype:
        raise StateMismatchError(
            f"{where}: live tensor is {tuple(live.shape)} {live.dtype}, checkpoint step "
            f"{step} has {tuple(loaded.shape)} {loaded.dtype}"
        )
    plan.append(functools.partial(_copy_into, live, loaded))


def _copy_into(live: torch.Tensor, loaded: torch.Tensor) -> None:
    with torch.no_grad():  # parameters are leaves that require grad
        live.copy_(loaded)


def _plan_mapping(
    live: MutableMapping[Any, Any], loaded: Any, where: str, step: int, plan: _Plan
) -> None:
    if not isinstance(loaded, Mapping):
        raise _mismatch(where, step, "a dict", loaded)
    missing = [k for k in live if k not in loaded]
    if missing:
        raise StateMismatchError(
            f"{where}: checkpoint step {step} has no {missing!r} (it has "
            f"{sorted(map(str, loaded))}). Restore with the keys it was saved with (set new "
            "ones after restore()), or use load() and pick what you need"
        )
    for key, value in loaded.items():
        if key in live:
            old = live[key]
            new = _plan(old, value, _key_path(where, key), step, plan)
            if new is old:
                continue
        else:
            new = value
        plan.append(functools.partial(live.__setitem__, key, new))


def _plan_list(live: list[Any], loaded: Any, where: str, step: int, plan: _Plan) -> None:
    if not isinstance(loaded, list):
        raise _mismatch(where, step, "a list", loaded)
    if len(live) == len(loaded):
        for i, (old, value) in enumerate(zip(live, loaded, strict=True)):
            new = _plan(old, value, f"{where}[{i}]", step, plan)
            if new is not old:
                plan.append(functools.partial(live.__setitem__, i, new))
    elif _is_plain(live):
        plan.append(functools.partial(live.__setitem__, slice(None), loaded))
    else:
        raise StateMismatchError(
            f"{where}: live list has {len(live)} items holding tensors or stateful objects, "
            f"checkpoint step {step} has {len(loaded)}"
        )


def _plan_tuple(
    live: tuple[Any, ...], loaded: Any, where: str, step: int, plan: _Plan
) -> tuple[Any, ...]:
    """A tuple holding live state: load each item; its container gets the rebuilt tuple."""
    if not isinstance(loaded, tuple) or len(loaded) != len(live):
        raise _mismatch(where, step, f"a tuple of {len(live)}", loaded)
    pairs = enumerate(zip(live, loaded, strict=True))
    return tuple(_plan(old, value, f"{where}[{i}]", step, plan) for i, (old, value) in pairs)


def _is_plain(value: Any) -> bool:
    """True for data save() stores as values: nothing in it can be loaded into."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, Mapping):
        return all(_is_plain(k) and _is_plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    return False


def _mismatch(where: str, step: int, live: str, loaded: Any) -> StateMismatchError:
    return StateMismatchError(
        f"{where}: live state is {live}, checkpoint step {step} has a {type(loaded).__name__} here"
    )


def _key_path(where: str, key: Any) -> str:
    return f"{where}.{key}" if isinstance(key, str) else f"{where}[{key!r}]"


def _has_load_state_dict(obj: Any) -> bool:
    return not isinstance(obj, Mapping | torch.Tensor) and callable(
        getattr(obj, "load_state_dict", None)
    )
