"""Atomic, verifiable checkpoints on any fsspec filesystem (`docs/maintainers/design.md`).

Names are resolved lazily, as `preemptible`'s are: the cost records (`stats`) are read by the
sidecar and the reporters, which never pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from preemptible._lazy import lazy_exports

if TYPE_CHECKING:
    from preemptible.checkpoint.async_save import AsyncMode, SaveHandle
    from preemptible.checkpoint.checkpointer import Checkpointer
    from preemptible.checkpoint.reader import CheckpointReader
    from preemptible.checkpoint.records import CheckpointInfo, IgnoredDir, VerifyReport
    from preemptible.checkpoint.stats import CheckpointCost, CostTracker, Summary
    from preemptible.checkpoint.storage import CommitMode

_EXPORTS = {
    "AsyncMode": "preemptible.checkpoint.async_save",
    "CheckpointCost": "preemptible.checkpoint.stats",
    "CheckpointInfo": "preemptible.checkpoint.records",
    "CheckpointReader": "preemptible.checkpoint.reader",
    "Checkpointer": "preemptible.checkpoint.checkpointer",
    "CommitMode": "preemptible.checkpoint.storage",
    "CostTracker": "preemptible.checkpoint.stats",
    "IgnoredDir": "preemptible.checkpoint.records",
    "SaveHandle": "preemptible.checkpoint.async_save",
    "Summary": "preemptible.checkpoint.stats",
    "VerifyReport": "preemptible.checkpoint.records",
}

__all__ = [
    "AsyncMode",
    "CheckpointCost",
    "CheckpointInfo",
    "CheckpointReader",
    "Checkpointer",
    "CommitMode",
    "CostTracker",
    "IgnoredDir",
    "SaveHandle",
    "Summary",
    "VerifyReport",
]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
