"""Atomic, verifiable checkpoints on any fsspec filesystem (`docs/design.md`)."""

from preemptible.checkpoint.async_save import AsyncMode, SaveHandle
from preemptible.checkpoint.manager import Checkpointer
from preemptible.checkpoint.records import CheckpointInfo, IgnoredDir, VerifyReport
from preemptible.checkpoint.stats import CheckpointCost, Summary
from preemptible.checkpoint.storage import CommitMode

__all__ = [
    "AsyncMode",
    "CheckpointCost",
    "CheckpointInfo",
    "Checkpointer",
    "CommitMode",
    "IgnoredDir",
    "SaveHandle",
    "Summary",
    "VerifyReport",
]
