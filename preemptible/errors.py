"""The whole exception tree of `preemptible`, in one place.

Every error a user can see derives from `PreemptibleError`, so `except PreemptibleError` catches
all of ours and nothing else. Families group errors by what went wrong (a checkpoint, the storage
under it, the configuration, the queue service); leaves also subclass a builtin where the meaning
matches, so code written against builtins keeps working. Every message says what to do next.
"""

from __future__ import annotations

import warnings


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


class NoValidCheckpointError(CheckpointCorruptedError):
    """Committed checkpoints exist but every one fails verification, so none can be restored.

    ``steps`` lists them, newest first; ``problems`` says what is wrong with each. Raised instead
    of starting over from step 0 without a word: training from scratch over a root of corrupt
    checkpoints would throw away every step they hold.
    """

    def __init__(self, message: str, *, steps: list[int], problems: list[str] | None = None):
        super().__init__(message, step=steps[0] if steps else None, problems=problems)
        self.steps = list(steps)


class CheckpointFormatError(CheckpointError):
    """A checkpoint's metadata is not in a format this version can read safely."""


class UnsupportedStateError(CheckpointError, TypeError):
    """The state passed to save() holds a value that cannot be stored without pickle."""


class StateMismatchError(CheckpointError, KeyError):
    """restore() found that the checkpoint and the live state disagree (a key, shape or type)."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable.
        return str(self.args[0]) if self.args else ""


class BackgroundSaveError(CheckpointError, RuntimeError):
    """A background save failed; raised by the next save() or wait() so that it never vanishes.

    The original error is its ``__cause__``. Nothing of the failed save was committed.
    """


# --- storage -----------------------------------------------------------------------------------


class StorageError(PreemptibleError, OSError):
    """Reading or writing the checkpoint storage failed (disk full, permission, network...)."""


class BackendNotInstalledError(PreemptibleError, ImportError):
    """An optional package is not installed: an extra of preemptible, or the fsspec backend of
    a URL scheme.

    The message names the `pip install` line to run (``pip install 'preemptible[queue]'``);
    ``extra`` is the extra that installs it, or None when none does (``gcsfs`` for gs://).
    """

    def __init__(self, message: str, *, extra: str | None = None):
        super().__init__(message)
        self.extra = extra


# --- preemption runtime ------------------------------------------------------------------------


class GuardError(PreemptibleError, RuntimeError):
    """The preemption guard cannot be installed or used as asked."""


# --- queue manager -----------------------------------------------------------------------------


class QueueError(PreemptibleError):
    """Base class of queue manager errors."""


class TraceFormatError(QueueError, ValueError):
    """A trace file does not have the columns or values the simulator expects."""


class RequestError(QueueError, ValueError):
    """A request to the queue manager is malformed or asks for the impossible (HTTP 400)."""


class JobSpecError(RequestError):
    """A well-formed submission that cannot run here: a size range the machine never fits, a
    multiple that does not divide it (HTTP 422)."""


class JobNotFoundError(QueueError, LookupError):
    """No job has this id (HTTP 404)."""


class JobStateError(QueueError):
    """The job is not in a state that allows this (cancel a finished job...; HTTP 409)."""


class AccessDeniedError(QueueError, PermissionError):
    """The token is valid but not for this queue or job (HTTP 403)."""


class StateStoreError(QueueError):
    """The queue manager's state file is corrupt, newer than this version, or unwritable."""


__all__ = [
    "AccessDeniedError",
    "BackendNotInstalledError",
    "BackgroundSaveError",
    "CheckpointCorruptedError",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointNotFoundError",
    "ConfigError",
    "GuardError",
    "JobNotFoundError",
    "JobSpecError",
    "JobStateError",
    "NoValidCheckpointError",
    "PreemptibleError",
    "PreemptibleWarning",
    "QueueError",
    "RequestError",
    "StateMismatchError",
    "StateStoreError",
    "StorageError",
    "TraceFormatError",
    "UnsupportedStateError",
]


_DEPRECATED = {"SaveInProgressError": "BackgroundSaveError"}


def __getattr__(name: str) -> type[PreemptibleError]:
    # Old names keep working for one release, with a warning; they are not in __all__.
    new = _DEPRECATED.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"preemptible.errors.{name} is deprecated: it is raised for a background save that "
        f"failed, not one in progress; catch {new} instead",
        DeprecationWarning,
        stacklevel=2,
    )
    error: type[PreemptibleError] = globals()[new]
    return error
