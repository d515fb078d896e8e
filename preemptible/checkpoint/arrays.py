"""Raw-byte views of tensors and numpy arrays, and their description in the checkpoint index.

Arrays are written as their exact bytes (no compression, no pickle), so a restore is
bit-identical for every dtype, bfloat16 and float8 included, and reading is a single ``readinto``
into freshly allocated memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from preemptible.checkpoint.serialize import Array, dtype_name, parse_torch_dtype
from preemptible.errors import CheckpointFormatError


@dataclass(frozen=True, slots=True)
class ArrayEntry:
    """Where one array lives in the checkpoint and how to rebuild it."""

    kind: str  # "torch" or "numpy"
    dtype: str
    shape: tuple[int, ...]
    device: str
    file: str
    offset: int
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "device": self.device,
            "file": self.file,
            "offset": self.offset,
            "nbytes": self.nbytes,
        }

    @classmethod
    def from_json(cls, raw: Any) -> ArrayEntry:
        try:
            entry = cls(
                kind=str(raw["kind"]),
                dtype=str(raw["dtype"]),
                shape=tuple(int(d) for d in raw["shape"]),
                device=str(raw["device"]),
                file=str(raw["file"]),
                offset=int(raw["offset"]),
                nbytes=int(raw["nbytes"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointFormatError(
                f"malformed array entry in checkpoint index: {raw!r}"
            ) from e
        if entry.kind not in ("torch", "numpy") or entry.offset < 0 or entry.nbytes < 0:
            raise CheckpointFormatError(f"malformed array entry in checkpoint index: {raw!r}")
        if "/" in entry.file or entry.file.startswith("."):
            raise CheckpointFormatError(f"array entry names a file outside its checkpoint: {raw!r}")
        return entry


def describe(array: Array) -> tuple[str, str, tuple[int, ...], str, int]:
    """Return (kind, dtype, shape, device, nbytes) of an array without touching its data."""
    if isinstance(array, torch.Tensor):
        nbytes = array.numel() * array.element_size()
        return "torch", dtype_name(array.dtype), tuple(array.shape), str(array.device), nbytes
    return "numpy", array.dtype.str, tuple(array.shape), "cpu", int(array.nbytes)


def as_bytes(array: Array) -> memoryview:
    """A flat uint8 view of the array's data on the CPU (copies only if it must)."""
    if isinstance(array, torch.Tensor):
        t = array.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.resolve_conj().resolve_neg().contiguous()
        if t.numel() == 0:
            return memoryview(b"")
        return t.reshape(-1).view(torch.uint8).numpy().data
    a = np.ascontiguousarray(array)
    return a.reshape(-1).view(np.uint8).data


def empty_buffer(nbytes: int) -> torch.Tensor:
    """Uninitialised CPU memory to read an array's bytes into."""
    return torch.empty(nbytes, dtype=torch.uint8)


def from_bytes(entry: ArrayEntry, buffer: torch.Tensor, map_location: Any) -> Array:
    """Rebuild the array described by ``entry`` from its raw bytes (no copy on the CPU)."""
    if entry.kind == "numpy":
        try:
            np_dtype = np.dtype(entry.dtype)
        except TypeError as e:
            raise CheckpointFormatError(f"unknown numpy dtype {entry.dtype!r} in checkpoint") from e
        if np_dtype.hasobject:
            raise CheckpointFormatError("checkpoint declares an object array; refusing to load it")
        array: np.ndarray = buffer.numpy().view(np_dtype).reshape(entry.shape)
        return array
    dtype = parse_torch_dtype(entry.dtype)
    if entry.nbytes == 0:
        tensor = torch.empty(entry.shape, dtype=dtype)
    else:
        tensor = buffer.view(dtype).reshape(entry.shape)
    device = _target_device(entry.device, map_location)
    return tensor if device.type == "cpu" else tensor.to(device)


def _target_device(saved: str, map_location: Any) -> torch.device:
    if map_location is not None:
        return torch.device(map_location)
    device = torch.device(saved)
    if device.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    if (
        device.type == "cuda"
        and device.index is not None
        and device.index >= torch.cuda.device_count()
    ):
        return torch.device("cuda")
    if device.type not in ("cpu", "cuda"):
        return torch.device("cpu")
    return device
