"""Copying a committed checkpoint to another store, checking every byte on the way.

An upload never serializes the state again: the local tier's files already are what the
remote must hold, so they are streamed as they are, under the same names, and each file's size
and CRC32C are computed on the very chunks written and compared with the local manifest. Only
when every file matches is the manifest, the commit marker, written to the remote with the
remote's own protocol; a local copy that went bad on disk therefore never becomes a committed
remote checkpoint. Verifying first and copying after would read every file twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from preemptible.checkpoint import io
from preemptible.checkpoint.manifest import SHARDED_DIR, FileRecord, Manifest
from preemptible.checkpoint.storage import CheckpointStorage, Staging
from preemptible.errors import CheckpointCorruptedError, ConfigError

Commit = Callable[[Staging, str, Manifest], Manifest]
"""Commits a staged copy (the remote checkpointer's commit: first commit of a step wins)."""


def copy_verified(
    source: CheckpointStorage,
    dirname: str,
    name: str,
    record: FileRecord,
    target: CheckpointStorage,
    staging: Staging,
) -> None:
    """Stream one file from ``source`` into ``staging`` on ``target``, checking it on the way.

    Raises:
        CheckpointCorruptedError: the bytes read do not match ``record`` (the staged copy is
            left for the caller's abort).
        FileNotFoundError: the source file is gone.
    """
    with target.open_write(staging, name) as out:
        actual = io.file_record(source, dirname, name, sink=out.write)
    problem = io.record_problem(actual, record)
    if problem:
        raise CheckpointCorruptedError(
            f"the local copy of {dirname} is corrupted: {name}: {problem}",
            problems=[f"{name}: {problem}"],
        )


def upload_step(
    source: CheckpointStorage,
    dirname: str,
    manifest: Manifest,
    target: CheckpointStorage,
    *,
    nonce: str,
    max_workers: int,
    commit: Commit,
) -> Manifest:
    """Copy the committed checkpoint ``dirname`` from ``source`` to ``target`` and commit it.

    Returns the manifest committed at ``target``: this one, or an earlier writer's valid
    commit of the same step (which then wins). On any error, nothing is committed and the
    staged files are removed as far as possible (garbage collection takes the rest).

    Raises:
        ConfigError: the checkpoint holds sharded (DCP) files, which two tiers do not copy yet.
        CheckpointCorruptedError: a local file does not match its manifest.
    """
    names = sorted(manifest.files)
    if any(n.startswith(f"{SHARDED_DIR}/") for n in names):
        raise ConfigError(f"{dirname} holds sharded tensors, which two tiers do not support yet")
    staging = target.begin(dirname, nonce)
    try:

        def copy(name: str) -> None:
            copy_verified(source, dirname, name, manifest.files[name], target, staging)

        io.in_threads(copy, names, max_workers, "preemptible-upload")
    except BaseException:
        with contextlib.suppress(Exception):  # best effort: garbage collection catches the rest
            target.abort(staging)
        raise
    # No abort once the commit is tried: a commit that failed after the manifest landed (a
    # lost answer) would otherwise delete a committed checkpoint's files. Garbage collection
    # removes the staged files of a commit that really failed.
    return commit(staging, dirname, manifest)
