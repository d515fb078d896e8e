"""What the checkpoint API returns: descriptions of checkpoints and of verification results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInfo:
    """A committed checkpoint, as its manifest describes it."""

    step: int
    url: str
    created_at: float
    bytes: int
    save_seconds: float
    world_size: int
    files: int
    writer: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class IgnoredDir:
    """A directory under the root that is not a committed checkpoint, and why."""

    name: str
    reason: str
    mtime: float | None = None  # as listed; None where the store gives no time for directories
    collectable: bool = False
    """Garbage once stale: an interrupted save or deletion. A step directory whose manifest is
    unreadable, corrupt or foreign is never collected: it may be a committed checkpoint."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReport:
    """The outcome of checking one checkpoint's files against its manifest."""

    step: int
    url: str
    problems: list[str]
    files_checked: int
    bytes_checked: int

    @property
    def ok(self) -> bool:
        return not self.problems
