"""Sharded tensors (DTensor, FSDP2) through torch.distributed.checkpoint, made safe to load.

A DTensor is a slice of a global tensor laid out over a device mesh; a checkpoint written by W
ranks must load on W' ranks with another layout. That resharding is what
``torch.distributed.checkpoint`` (DCP) does, so sharded tensors go through it, into a ``dcp/``
directory inside our step directory. Our manifest lists DCP's files with their sizes and CRC32C
like every other file: the commit protocol, retention and verification stay ours.

DCP's ``FileSystemReader`` reads its ``.metadata`` file with plain ``pickle.load``: loading an
untrusted checkpoint could run arbitrary code. `SafeFileSystemReader` reads it with an unpickler
that only knows DCP's own metadata classes and refuses everything else. Tensor data in
``.distcp`` files is already read with ``weights_only=True`` by DCP.
"""

from __future__ import annotations

import os
import pickle
import warnings
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from preemptible.checkpoint.manifest import SHARDED_DIR
from preemptible.distributed import rank_and_world
from preemptible.errors import CheckpointFormatError

_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "ChunkStorageMetadata",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
    if hasattr(dcp_metadata, name)
}


def _allowed(module: str, name: str) -> Any:
    if (module, name) in _ALLOWED:
        return _ALLOWED[(module, name)]
    if module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo":
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        return _StorageInfo
    if module == "torch" and name == "Size":
        return torch.Size
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.layout):
        return getattr(torch, name)
    if module == "torch.serialization" and name == "_get_layout":
        from torch.serialization import _get_layout

        return _get_layout
    if module == "pathlib" and name in ("PosixPath", "PurePosixPath"):
        import pathlib

        return getattr(pathlib, name)
    return None


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name)
        if found is None:
            raise CheckpointFormatError(
                f"DCP metadata refers to {module}.{name}, which is not part of DCP's metadata; "
                "refusing to load it. Nothing was executed"
            )
        return found


class SafeFileSystemReader(FileSystemReader):
    """DCP's reader, with ``.metadata`` unpickled against an allowlist of DCP classes only."""

    def read_metadata(self) -> dcp_metadata.Metadata:
        path = os.path.join(str(self.path), ".metadata")
        with open(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(f).load()
            except CheckpointFormatError:
                raise
            except Exception as e:
                raise CheckpointFormatError(f"DCP metadata {path} is unreadable: {e!r}") from e
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise CheckpointFormatError(f"DCP metadata {path} holds a {type(metadata).__name__}")
        storage_meta = getattr(metadata, "storage_meta", None)  # absent in older torch
        if storage_meta is not None:
            storage_meta.load_id = self.load_id
        return metadata


def save(directory: str, tensors: dict[str, Any], group: Any) -> list[str]:
    """DCP-save ``tensors`` (all ranks); returns the names (``dcp/...``) this rank wrote."""
    dcp_save(tensors, storage_writer=FileSystemWriter(directory), process_group=group)
    rank = rank_and_world()[0]
    mine = [n for n in os.listdir(directory) if n.startswith(f"__{rank}_")]
    if rank == 0:
        mine.append(".metadata")
    return [f"{SHARDED_DIR}/{n}" for n in sorted(mine)]


def load_into(directory: str, targets: dict[str, Any], group: Any = None) -> None:
    """Load in place into ``targets`` (DTensors laid out for this job, or full tensors)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(
            targets,
            storage_reader=SafeFileSystemReader(directory),
            process_group=group,
            no_dist=not distributed,
        )


def full_size_targets(directory: str, keys: list[str]) -> dict[str, torch.Tensor]:
    """Empty full-size tensors for ``keys``, from the checkpoint's metadata (no mesh needed)."""
    metadata = SafeFileSystemReader(directory).read_metadata()
    targets = {}
    for key in keys:
        entry = metadata.state_dict_metadata.get(key)
        if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            raise CheckpointFormatError(f"sharded tensor {key!r} is missing from the DCP metadata")
        targets[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
    return targets
