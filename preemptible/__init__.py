"""preemptible: lose at most one step to a preemption, never a checkpoint.

The public API is what this module exports; integrations import only from here. Names are
resolved lazily so that `preemptible.queue` and the simulator never pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from preemptible._lazy import lazy_exports
from preemptible._version import __version__

if TYPE_CHECKING:
    from preemptible.checkpoint import (
        CheckpointCost,
        Checkpointer,
        CheckpointInfo,
        SaveHandle,
        VerifyReport,
    )
    from preemptible.data import ResumableSampler
    from preemptible.errors import (
        AccessDeniedError,
        BackendNotInstalledError,
        BackgroundSaveError,
        CheckpointCorruptedError,
        CheckpointError,
        CheckpointFormatError,
        CheckpointNotFoundError,
        ConfigError,
        GuardError,
        JobNotFoundError,
        JobStateError,
        PreemptibleError,
        PreemptibleWarning,
        QueueError,
        RequestError,
        StateMismatchError,
        StateStoreError,
        StorageError,
        TraceFormatError,
        UnsupportedStateError,
    )
    from preemptible.rng import RNGState
    from preemptible.runtime import Context, preemptible
    from preemptible.signals import PreemptionGuard
    from preemptible.workers import protect_dataloader

_EXPORTS = {
    "CheckpointCost": "preemptible.checkpoint",
    "CheckpointInfo": "preemptible.checkpoint",
    "Checkpointer": "preemptible.checkpoint",
    "VerifyReport": "preemptible.checkpoint",
    "PreemptionGuard": "preemptible.signals",
    "protect_dataloader": "preemptible.workers",
    "SaveHandle": "preemptible.checkpoint",
    "Context": "preemptible.runtime",
    "preemptible": "preemptible.runtime",
    "ResumableSampler": "preemptible.data",
    "RNGState": "preemptible.rng",
    # The whole error tree: `except preemptible.PreemptibleError` needs no other import.
    "AccessDeniedError": "preemptible.errors",
    "BackendNotInstalledError": "preemptible.errors",
    "BackgroundSaveError": "preemptible.errors",
    "CheckpointCorruptedError": "preemptible.errors",
    "CheckpointError": "preemptible.errors",
    "CheckpointFormatError": "preemptible.errors",
    "CheckpointNotFoundError": "preemptible.errors",
    "ConfigError": "preemptible.errors",
    "GuardError": "preemptible.errors",
    "JobNotFoundError": "preemptible.errors",
    "JobStateError": "preemptible.errors",
    "PreemptibleError": "preemptible.errors",
    "PreemptibleWarning": "preemptible.errors",
    "QueueError": "preemptible.errors",
    "RequestError": "preemptible.errors",
    "StateStoreError": "preemptible.errors",
    "StateMismatchError": "preemptible.errors",
    "StorageError": "preemptible.errors",
    "TraceFormatError": "preemptible.errors",
    "UnsupportedStateError": "preemptible.errors",
}

__all__ = [
    "AccessDeniedError",
    "BackendNotInstalledError",
    "BackgroundSaveError",
    "CheckpointCorruptedError",
    "CheckpointCost",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "Checkpointer",
    "ConfigError",
    "Context",
    "GuardError",
    "JobNotFoundError",
    "JobStateError",
    "PreemptibleError",
    "PreemptibleWarning",
    "PreemptionGuard",
    "QueueError",
    "RNGState",
    "RequestError",
    "ResumableSampler",
    "SaveHandle",
    "StateMismatchError",
    "StateStoreError",
    "StorageError",
    "TraceFormatError",
    "UnsupportedStateError",
    "VerifyReport",
    "__version__",
    "preemptible",
    "protect_dataloader",
]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
