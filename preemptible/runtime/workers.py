"""Signal hygiene for DataLoader worker processes: the trainer's notice must not kill them.

The queue manager sends SIGTERM to the job's whole process group, and so do ``kill -- -PGID``,
torchrun (``os.killpg`` on each worker's group) and SLURM (every process of a step). DataLoader
workers are in that group, and SIGTERM's default action kills them at once. The trainer then
dies in the DataLoader's SIGCHLD handler ("DataLoader worker (pid N) is killed by signal:
Terminated") or on its next batch, before the final save the notice was meant to allow.

`worker_init_fn` makes a worker ignore the notice signals. Workers still go away when the
trainer does: the DataLoader shuts them down on exit, and a worker whose parent has died exits by
itself (its ``ManagerWatchdog`` checks the parent). SIGKILL still works.

Everything here is a module-level function or a `functools.partial` of one, so it pickles
for the ``spawn`` and ``forkserver`` start methods as well as ``fork``. With ``forkserver`` the
fork server process is itself in the group and dies of a group SIGTERM; its workers are not the
trainer's children, so that does not disturb the final save.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from typing import Any, TypeVar

from preemptible.errors import GuardError

WORKER_IGNORED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGINT,
)
"""The notice signals a DataLoader worker ignores; the trainer's guard handles them."""

LoaderT = TypeVar("LoaderT")


def worker_init_fn(worker_id: int) -> None:
    """Make this DataLoader worker ignore SIGTERM, SIGUSR1 and SIGINT.

    Pass it as ``DataLoader(..., worker_init_fn=worker_init_fn)``, or use
    `protect_dataloader` to keep an existing ``worker_init_fn``.

    Args:
        worker_id: The worker's index, as the DataLoader passes it (unused).
    """
    del worker_id
    for sig in WORKER_IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _chained_worker_init(original: Callable[[int], Any] | None, worker_id: int) -> None:
    # Ignore first: a notice that lands during a slow user init must not kill the worker either.
    worker_init_fn(worker_id)
    if original is not None:
        original(worker_id)


def protect_dataloader(loader: LoaderT) -> LoaderT:
    """Make ``loader``'s worker processes ignore notice signals, keeping its ``worker_init_fn``.

    Works on ``torch.utils.data.DataLoader`` and anything with a ``worker_init_fn`` attribute
    (torchdata's StatefulDataLoader). Calling it twice is harmless. Call it before iterating: a
    persistent worker that is already running keeps its old handlers.

    Args:
        loader: The data loader; changed in place.

    Returns:
        The same loader, for ``loader = protect_dataloader(DataLoader(...))``.

    Raises:
        GuardError: The loader has no ``worker_init_fn`` attribute, or its persistent workers are
            already running.
    """
    if not hasattr(loader, "worker_init_fn"):
        raise GuardError(
            f"{type(loader).__name__} has no worker_init_fn; pass "
            "preemptible.worker_init_fn to its worker processes yourself"
        )
    original = loader.worker_init_fn
    if original is worker_init_fn or (
        isinstance(original, functools.partial) and original.func is _chained_worker_init
    ):
        return loader
    if getattr(loader, "persistent_workers", False) and getattr(loader, "_iterator", None):
        raise GuardError(
            "protect_dataloader() was called after the loader's persistent workers started; "
            "call it right after creating the DataLoader"
        )
    loader.worker_init_fn = (
        worker_init_fn if original is None else functools.partial(_chained_worker_init, original)
    )
    return loader
