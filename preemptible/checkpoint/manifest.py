"""The manifest: the commit record of a checkpoint, and the names of things in a checkpoint root.

A checkpoint is the directory ``step-<zero-padded step>/``; it exists if and only if it holds a
``manifest.json`` that parses and lists every data file with its size and CRC32C. Because the
manifest is written last (and, on POSIX, the whole directory is renamed into place after it),
a reader that finds a valid manifest finds a complete checkpoint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from preemptible.errors import CheckpointFormatError

FORMAT = "preemptible.checkpoint/1"
MANIFEST_NAME = "manifest.json"
STEP_DIGITS = 12
_STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
SHARDED_DIR = "dcp"  # torch.distributed.checkpoint's files for sharded tensors


def step_dirname(step: int) -> str:
    return f"step-{step:0{STEP_DIGITS}d}"


def parse_step_dirname(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class FileRecord:
    size: int
    crc32c: int

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "crc32c": f"{self.crc32c:08x}"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """Everything recorded about one committed checkpoint."""

    step: int
    created_at: float
    save_seconds: float
    world_size: int
    state_file: str
    files: dict[str, FileRecord]
    rank_state_files: list[str] = field(default_factory=list)
    writer: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def state_file_for(self, rank: int) -> str:
        """The state index a rank loads: its own, or ``rank mod world_size`` after a resize."""
        if not self.rank_state_files:
            return self.state_file
        return self.rank_state_files[rank % len(self.rank_state_files)]

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.files.values())

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "step": self.step,
            "created_at": self.created_at,
            "save_seconds": self.save_seconds,
            "bytes": self.total_bytes,
            "world_size": self.world_size,
            "checksum": "crc32c",
            "state_file": self.state_file,
            "rank_state_files": self.rank_state_files,
            "files": {name: rec.to_json() for name, rec in sorted(self.files.items())},
            "writer": self.writer,
            "versions": self.versions,
            "metadata": self.metadata,
        }
        return json.dumps(body, indent=1, sort_keys=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate a manifest.

        Raises:
            CheckpointFormatError: it is not JSON, not ours, or misses a required field.
        """
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointFormatError(f"manifest is not valid JSON: {e}") from e
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
            raise CheckpointFormatError(
                f"manifest format is {found!r}, expected {FORMAT!r}: written by another tool or "
                "a newer version of preemptible"
            )
        try:
            files = {
                str(name): FileRecord(size=int(rec["size"]), crc32c=int(rec["crc32c"], 16))
                for name, rec in raw["files"].items()
            }
            manifest = cls(
                step=int(raw["step"]),
                created_at=float(raw["created_at"]),
                save_seconds=float(raw["save_seconds"]),
                world_size=int(raw["world_size"]),
                state_file=str(raw["state_file"]),
                rank_state_files=[str(f) for f in raw.get("rank_state_files", [])],
                files=files,
                writer=dict(raw.get("writer", {})),
                versions=dict(raw.get("versions", {})),
                metadata=dict(raw.get("metadata", {})),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointFormatError(f"manifest misses or mangles a field: {e!r}") from e
        for name in manifest.files:
            if not _valid_file_name(name):
                raise CheckpointFormatError(f"manifest lists an invalid file name {name!r}")
        if manifest.state_file not in manifest.files:
            raise CheckpointFormatError(
                f"manifest does not list its state file {manifest.state_file!r}"
            )
        return manifest


def _valid_file_name(name: str) -> bool:
    """A data file directly in the step directory, or one of DCP's files in its ``dcp/``."""
    head, slash, tail = name.partition("/")
    if slash:
        return head == SHARDED_DIR and bool(tail) and "/" not in tail and tail not in (".", "..")
    return bool(name) and not name.startswith(".") and name != MANIFEST_NAME
