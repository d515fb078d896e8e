"""The whole exception tree of `preemptible`, in one place.

Every error a user can see derives from `PreemptibleError`, so `except PreemptibleError` catches
all of ours and nothing else. Families group errors by what went wrong (a checkpoint, the storage
under it, the configuration, the queue service); leaves also subclass a builtin where the meaning
matches, so code written against builtins keeps working. Every message says what to do next.
"""

from __future__ import annotations


class PreemptibleError(Exception):
    """Base class of every error raised by preemptible."""


class PreemptibleWarning(UserWarning):
    """Something was worked around (e.g. a corrupt checkpoint skipped); nothing was lost."""


# --- configuration and input -------------------------------------------------------------------


class ConfigError(PreemptibleError, ValueError):
    """A setting, argument or configuration file is invalid."""


# --- checkpoints -------------------------------------------------------------------------------


class CheckpointError(PreemptibleError):
    """Base class of checkpoint errors."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No committed checkpoint exists (for the given step)."""


class CheckpointCorruptedError(CheckpointError):
    """A committed checkpoint fails verification: a file is missing, truncated or altered."""

    def __init__(self, message: str, *, step: int | None = None, problems: list[str] | None = None):
        super().__init__(message)
        self.step = step
        self.problems = list(problems or [])


class CheckpointFormatError(CheckpointError):
    """A checkpoint's metadata is not in a format this version can read safely."""


class UnsupportedStateError(CheckpointError, TypeError):
    """The state passed to save() holds a value that cannot be stored without pickle."""


class StateMismatchError(CheckpointError, KeyError):
    """restore() found that the checkpoint and the live state disagree (a key, shape or type)."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable.
        return str(self.args[0]) if self.args else ""


class SaveInProgressError(CheckpointError, RuntimeError):
    """A background save failed; raised on the next call so that the failure never vanishes."""


# --- storage -----------------------------------------------------------------------------------


class StorageError(PreemptibleError, OSError):
    """Reading or writing the checkpoint storage failed (disk full, permission, network...)."""


class BackendNotInstalledError(PreemptibleError, ImportError):
    """The fsspec backend for a URL scheme is not installed."""


# --- preemption runtime ------------------------------------------------------------------------


class GuardError(PreemptibleError, RuntimeError):
    """The preemption guard cannot be installed or used as asked."""


# --- queue manager -----------------------------------------------------------------------------


class QueueError(PreemptibleError):
    """Base class of queue manager errors."""


class TraceFormatError(QueueError, ValueError):
    """A trace file does not have the columns or values the simulator expects."""


__all__ = [
    "BackendNotInstalledError",
    "CheckpointCorruptedError",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointNotFoundError",
    "ConfigError",
    "GuardError",
    "PreemptibleError",
    "PreemptibleWarning",
    "QueueError",
    "SaveInProgressError",
    "StateMismatchError",
    "StorageError",
    "TraceFormatError",
    "UnsupportedStateError",
]
