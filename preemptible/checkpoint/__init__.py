"""Atomic, verifiable checkpoints on any fsspec filesystem (DESIGN.md §3)."""

from preemptible.checkpoint.manager import Checkpointer, CheckpointInfo, IgnoredDir, VerifyReport
from preemptible.checkpoint.stats import CheckpointCost, Summary
from preemptible.checkpoint.storage import CommitMode

__all__ = [
    "CheckpointCost",
    "CheckpointInfo",
    "Checkpointer",
    "CommitMode",
    "IgnoredDir",
    "Summary",
    "VerifyReport",
]
