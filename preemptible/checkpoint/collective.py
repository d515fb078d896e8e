"""A save by every rank of a torch.distributed job: per-rank files, one manifest.

Each rank writes its own state (optimizer, RNG, data position, replicated tensors) into the
same staging area, and sharded tensors (DTensors) go through torch.distributed.checkpoint into
its ``dcp/`` directory; rank 0 commits a single manifest listing every rank's files only after
all ranks report theirs durable. Every rank runs the same collectives whatever fails, so one
rank's error becomes a `StorageError` on all ranks instead of a hang. They run on a dedicated gloo
group (see `preemptible.distributed`); their payloads are our own file records, not checkpoint data.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from preemptible.checkpoint import io, sharded
from preemptible.checkpoint.manifest import FileRecord, Manifest, step_dirname
from preemptible.checkpoint.serialize import Flattened
from preemptible.checkpoint.storage import CheckpointStorage, Staging
from preemptible.distributed import rank_and_world
from preemptible.errors import StorageError


def write_collectively(
    storage: CheckpointStorage,
    step: int,
    flat: Flattened,
    *,
    group: Any,
    shard_bytes: int,
    max_workers: int,
    devices: list[str] | None,
    build_manifest: Callable[[dict[str, FileRecord], list[str]], Manifest],
    commit: Callable[[Staging, str, Manifest], Manifest],
    sharded_dir: Callable[[str], str] | None = None,
) -> tuple[str, Manifest]:
    """All ranks call this for the same step; returns the committed step directory and manifest."""
    rank, world = rank_and_world()
    step_dir = step_dirname(step)
    # 1. Rank 0 opens the staging area and tells the others where it is.
    opened: list[Any] = [None, None]
    staging = None
    if rank == 0:
        try:
            staging = storage.begin(step_dir, uuid.uuid4().hex[:12])
            opened = [[staging.dirname, staging.nonce], None]
        except Exception as e:
            opened = [None, repr(e)]
    dist.broadcast_object_list(opened, src=0, group=group)
    if opened[1] is not None:
        raise StorageError(f"saving step {step}: rank 0 could not start the save: {opened[1]}")
    if staging is None:
        staging = Staging(dirname=opened[0][0], nonce=opened[0][1])
    # 2. Every rank writes its own files.
    mine: dict[str, Any]
    try:
        written = io.write_state(
            storage,
            staging,
            flat,
            shard_bytes=shard_bytes,
            max_workers=max_workers,
            devices=devices,
            prefix=f"rank{rank:05d}-",
        )
        files = dict(written.files)
        if flat.sharded:
            assert sharded_dir is not None, "the manager checks where sharded tensors can go"
            for name in sharded.save(sharded_dir(staging.dirname), flat.sharded, group):
                files[name] = io.file_record(storage, staging.dirname, name)
        mine = {
            "files": {n: [r.size, r.crc32c] for n, r in files.items()},
            "state": written.state_file,
        }
    except Exception as e:
        mine = {"error": f"rank {rank}: {e!r}", "files": {n: [0, 0] for n in staging.written}}
    shards: list[Any] = [None] * world
    dist.all_gather_object(shards, mine, group=group)
    # 3. Rank 0 commits (or aborts) and tells everyone the outcome.
    outcome: list[Any] = [None]
    if rank == 0:
        try:
            errors = [s["error"] for s in shards if "error" in s]
            if errors:
                raise StorageError("; ".join(errors))
            files = {
                n: FileRecord(size=v[0], crc32c=v[1]) for s in shards for n, v in s["files"].items()
            }
            manifest = build_manifest(files, [s["state"] for s in shards])
            outcome = [("ok", commit(staging, step_dir, manifest).to_bytes().decode())]
        except Exception as e:
            staging.written = [n for s in shards for n in s["files"]]
            with contextlib.suppress(Exception):  # best effort; garbage collection gets the rest
                storage.abort(staging)
            outcome = [("error", str(e))]
    dist.broadcast_object_list(outcome, src=0, group=group)
    kind, body = outcome[0]
    if kind != "ok":
        raise StorageError(
            f"saving step {step} to {storage.describe(step_dir)} failed: {body}. Nothing was "
            "committed and earlier checkpoints are untouched"
        )
    return step_dir, Manifest.from_bytes(body.encode())
