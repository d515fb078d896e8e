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
        CostTracker,
        SaveHandle,
        VerifyReport,
    )
    from preemptible.distributed import forget_process_groups, init_process_group
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
        JobSpecError,
        JobStateError,
        NoValidCheckpointError,
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
    from preemptible.runtime.announce import announce
    from preemptible.runtime.context import AlreadyComplete, Context, preemptible
    from preemptible.runtime.global_batch import GlobalBatch
    from preemptible.runtime.rng import RNGState
    from preemptible.runtime.sampler import ResumableSampler
    from preemptible.runtime.signals import PreemptionGuard
    from preemptible.runtime.workers import protect_dataloader, worker_init_fn

_EXPORTS = {
    "CheckpointCost": "preemptible.checkpoint",
    "CheckpointInfo": "preemptible.checkpoint",
    "CostTracker": "preemptible.checkpoint",
    "forget_process_groups": "preemptible.distributed",
    "init_process_group": "preemptible.distributed",
    "Checkpointer": "preemptible.checkpoint",
    "VerifyReport": "preemptible.checkpoint",
    "PreemptionGuard": "preemptible.runtime.signals",
    "protect_dataloader": "preemptible.runtime.workers",
    "worker_init_fn": "preemptible.runtime.workers",
    "SaveHandle": "preemptible.checkpoint",
    "AlreadyComplete": "preemptible.runtime.context",
    "Context": "preemptible.runtime.context",
    "preemptible": "preemptible.runtime.context",
    "ResumableSampler": "preemptible.runtime.sampler",
    "GlobalBatch": "preemptible.runtime.global_batch",
    "RNGState": "preemptible.runtime.rng",
    "announce": "preemptible.runtime.announce",
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
    "JobSpecError": "preemptible.errors",
    "JobStateError": "preemptible.errors",
    "NoValidCheckpointError": "preemptible.errors",
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
    "AlreadyComplete",
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
    "CostTracker",
    "GlobalBatch",
    "GuardError",
    "JobNotFoundError",
    "JobSpecError",
    "JobStateError",
    "NoValidCheckpointError",
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
    "announce",
    "forget_process_groups",
    "init_process_group",
    "preemptible",
    "protect_dataloader",
    "worker_init_fn",
]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
