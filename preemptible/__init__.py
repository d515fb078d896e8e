"""preemptible: lose at most one step to a preemption, never a checkpoint.

The public API is what this module exports; integrations import only from here.
"""

from __future__ import annotations

from preemptible._version import __version__
from preemptible.checkpoint import CheckpointCost, CheckpointInfo, Checkpointer, VerifyReport

__all__ = ["CheckpointCost", "CheckpointInfo", "Checkpointer", "VerifyReport", "__version__"]
