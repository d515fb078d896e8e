"""Turn a training state into JSON plus a list of arrays, and back, without pickle.

A checkpoint must be loadable by someone who does not trust its author, so nothing here can
execute code on load: the structure is plain JSON, arrays are raw bytes described by dtype and
shape, and every other Python type is refused at save time with the path of the offending value.
Objects with ``state_dict()`` (modules, optimizers, schedulers, samplers) are stored as their
state dicts; ``restore`` calls their ``load_state_dict`` on the way back.

Special JSON nodes are dicts holding the key ``"__pt__"`` (a tag): tensors, numpy arrays and
scalars, tuples, bytes, dtypes, and dicts whose keys are not all strings (optimizer state uses
integer keys). A user dict that happens to contain ``"__pt__"`` is stored in the tagged form too,
so decoding is never ambiguous.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from preemptible.errors import CheckpointFormatError, UnsupportedStateError

TAG = "__pt__"

Array = torch.Tensor | np.ndarray


@dataclass(slots=True)
class Flattened:
    """A state split into its JSON skeleton, the arrays it refers to by index, and its sharded
    tensors (DTensors, saved through torch.distributed.checkpoint) by key."""

    tree: Any
    arrays: list[Array]
    sharded: dict[str, Any] = field(default_factory=dict)


def flatten(state: Any) -> Flattened:
    """Split ``state`` into a JSON-able tree, a list of arrays and a dict of sharded tensors.

    Raises:
        UnsupportedStateError: a value has no pickle-free representation; the message names it.
    """
    arrays: list[Array] = []
    sharded: dict[str, Any] = {}
    tree = _encode(state, "state", arrays, sharded)
    return Flattened(tree=tree, arrays=arrays, sharded=sharded)


def _encode(value: Any, path: str, arrays: list[Array], sharded: dict[str, Any]) -> Any:
    # Order matters: a Tensor has no state_dict, but some containers do; check arrays first.
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if is_dtensor(value):
        sharded[path] = value
        return {TAG: "dtensor", "key": path}
    if isinstance(value, torch.Tensor):
        _check_tensor(value, path)
        arrays.append(value.detach())
        return {TAG: "tensor", "id": len(arrays) - 1}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise UnsupportedStateError(
                f"{path}: numpy array of Python objects cannot be saved without pickle; "
                "convert it to a numeric array or a list"
            )
        arrays.append(value)
        return {TAG: "ndarray", "id": len(arrays) - 1}
    if isinstance(value, np.generic):
        arrays.append(np.asarray(value))
        return {TAG: "npscalar", "id": len(arrays) - 1}
    if isinstance(value, Mapping):
        return _encode_mapping(value, path, arrays, sharded)
    if isinstance(value, list):
        return [_encode(v, f"{path}[{i}]", arrays, sharded) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {
            TAG: "tuple",
            "items": [_encode(v, f"{path}[{i}]", arrays, sharded) for i, v in enumerate(value)],
        }
    if isinstance(value, bytes | bytearray):
        return {TAG: "bytes", "b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, torch.dtype):
        return {TAG: "dtype", "name": dtype_name(value)}
    state_dict = getattr(value, "state_dict", None)
    if callable(state_dict):
        return _encode(state_dict(), f"{path}.state_dict()", arrays, sharded)
    raise UnsupportedStateError(
        f"{path}: cannot save a value of type {type(value).__module__}.{type(value).__qualname__} "
        "without pickle. Use tensors, numpy arrays, Python scalars, strings, lists, tuples and "
        "dicts, or give the object state_dict()/load_state_dict()"
    )


def _encode_mapping(
    value: Mapping[Any, Any], path: str, arrays: list[Array], sharded: dict[str, Any]
) -> Any:
    if all(isinstance(k, str) for k in value) and TAG not in value:
        return {k: _encode(v, f"{path}.{k}", arrays, sharded) for k, v in value.items()}
    items = []
    for k, v in value.items():
        key = _encode(k, f"{path}<key {k!r}>", arrays, sharded)
        items.append([key, _encode(v, f"{path}[{k!r}]", arrays, sharded)])
    return {TAG: "dict", "items": items}


def _check_tensor(t: torch.Tensor, path: str) -> None:
    if t.is_sparse or t.layout != torch.strided:
        raise UnsupportedStateError(f"{path}: sparse tensors are not supported; call .to_dense()")
    if t.is_quantized:
        raise UnsupportedStateError(
            f"{path}: quantized tensors are not supported; dequantize first"
        )
    if t.device.type == "meta":
        raise UnsupportedStateError(f"{path}: a meta tensor has no data to save")
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        # DTensor and other subclasses need their own protocol (torch.distributed.checkpoint).
        raise UnsupportedStateError(
            f"{path}: tensor subclass {type(t).__name__} is not supported; convert it to a "
            "regular tensor (DTensors are supported)"
        )


def unflatten(
    tree: Any,
    get_array: Callable[[int], Array],
    get_sharded: Callable[[str], Any] | None = None,
) -> Any:
    """Rebuild the state from its tree; ``get_array(i)`` returns array ``i``, ``get_sharded(key)``
    the loaded sharded tensor saved under ``key``.

    Raises:
        CheckpointFormatError: the tree holds a tag this version does not know.
    """
    if isinstance(tree, list):
        return [unflatten(v, get_array, get_sharded) for v in tree]
    if not isinstance(tree, dict):
        return tree
    tag = tree.get(TAG)
    if tag is None:
        return {k: unflatten(v, get_array, get_sharded) for k, v in tree.items()}
    if tag in ("tensor", "ndarray"):
        return get_array(_int(tree, "id"))
    if tag == "npscalar":
        return get_array(_int(tree, "id"))[()]
    if tag == "dtensor" and get_sharded is not None:
        return get_sharded(str(tree["key"]))
    if tag == "tuple":
        return tuple(unflatten(v, get_array, get_sharded) for v in tree["items"])
    if tag == "dict":
        return {
            _hashable(unflatten(k, get_array, get_sharded)): unflatten(v, get_array, get_sharded)
            for k, v in tree["items"]
        }
    if tag == "bytes":
        return base64.b64decode(tree["b64"])
    if tag == "dtype":
        return parse_torch_dtype(tree["name"])
    raise CheckpointFormatError(
        f"unknown node type {tag!r} in the checkpoint's state; it was written by a newer or "
        "foreign tool. Nothing was executed. Upgrade preemptible or re-save the checkpoint"
    )


def sharded_keys(tree: Any) -> list[str]:
    """The keys of the sharded tensors a saved tree refers to."""
    if isinstance(tree, list):
        return [k for v in tree for k in sharded_keys(v)]
    if not isinstance(tree, dict):
        return []
    if tree.get(TAG) == "dtensor":
        return [str(tree["key"])]
    tag = tree.get(TAG)
    if tag == "tuple":
        values = list(tree["items"])
    elif tag == "dict":
        values = [v for pair in tree["items"] for v in pair]
    else:
        values = list(tree.values()) if tag is None else []
    return [k for v in values for k in sharded_keys(v)]


def _int(node: dict[str, Any], key: str) -> int:
    value = node.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckpointFormatError(
            f"malformed checkpoint state: {node!r} needs an integer {key!r}"
        )
    return value


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    return key


@functools.cache
def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed support
        return None
    return DTensor


def is_dtensor(value: Any) -> bool:
    """True for a DTensor; imports torch.distributed.tensor only once a tensor subclass shows up."""
    if type(value) in (torch.Tensor, torch.nn.Parameter) or not isinstance(value, torch.Tensor):
        return False
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(value, dtensor)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointFormatError(f"unknown torch dtype {name!r} in checkpoint")
    return dtype
