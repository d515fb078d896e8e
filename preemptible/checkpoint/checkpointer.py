"""`Checkpointer`: atomic, verifiable checkpoints of training state on any fsspec filesystem.

Public methods validate their input once and translate storage failures into our errors; the
work is in `io` (bytes), `storage` (commit protocol) and `retention` (what to delete). Two
writers on one root — a zombie of a preempted run and its replacement — are safe by
construction: a valid committed step is immutable, the first commit of a step wins and the
other writer discards its copy, a writer only deletes committed checkpoints (newest always kept)
and temporary files older than ``stale_after_seconds``, and it never touches another writer's
in-progress files before then. The one committed checkpoint a save replaces is a corrupt one at
its own step (its files fail their checksums): it is moved aside with a warning, never skipped
without a word (`docs/internals/corrupt-step-replaced.md`).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import socket
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, overload

import torch

from preemptible._version import __version__
from preemptible.checkpoint import io
from preemptible.checkpoint.arrays import describe
from preemptible.checkpoint.async_save import (
    AsyncMode,
    SaveHandle,
    StagingBuffer,
    all_on_cpu,
    available_memory_bytes,
    fork_and_run,
    fork_supported,
    state_bytes,
)
from preemptible.checkpoint.collective import write_collectively
from preemptible.checkpoint.manifest import (
    TMP_PREFIX,
    TRASH_PREFIX,
    FileRecord,
    Manifest,
    step_dirname,
)
from preemptible.checkpoint.reader import CheckpointReader, check_step
from preemptible.checkpoint.records import CheckpointInfo, VerifyReport
from preemptible.checkpoint.retention import local_steps_to_delete, steps_to_delete
from preemptible.checkpoint.serialize import Flattened, flatten
from preemptible.checkpoint.storage import (
    CommitMode,
    LocalStorage,
    Staging,
)
from preemptible.checkpoint.tiers import (
    Uploader,
    check_local,
    check_one_node,
    list_across,
    load_across,
)
from preemptible.distributed import gloo_group, launch_rank
from preemptible.errors import (
    BackgroundSaveError,
    CheckpointNotFoundError,
    ConfigError,
    PreemptibleError,
    PreemptibleWarning,
    StorageError,
)

log = logging.getLogger("preemptible.checkpoint")

DEFAULT_SHARD_BYTES = 128 << 20


class Checkpointer(CheckpointReader):
    """Save, list, verify and restore checkpoints under one root (a path or fsspec URL).

    Args:
        root: a local directory or any fsspec URL (``s3://bucket/run1``, ``memory://x``...).
        keep: how many of the newest checkpoints to keep (None keeps all). Old checkpoints are
            deleted only after a new one has committed; the newest is never deleted.
        keep_every: also keep every checkpoint whose step is a multiple of this.
        storage_options: passed to fsspec (credentials, ``endpoint_url``...).
        commit_mode: ``"rename"`` (local POSIX default) or ``"manifest"`` (default elsewhere).
        shard_bytes: target size of one data file; shards are written concurrently.
        max_workers: concurrent file writes and reads (default 4 locally, 16 elsewhere).
        stale_after_seconds: incomplete saves older than this are garbage-collected. It must be
            longer than any save takes, or a slow concurrent writer could lose its work.
        async_mode: how ``save(blocking=False)`` captures the state: ``"copy"`` (a staging
            buffer reused between saves, pinned for GPU state; what ``"auto"``, the default,
            picks) or ``"fork"`` (a copy-on-write child; CPU state on a local disk).
        max_staging_bytes: a background save needing more snapshot memory than this is done
            synchronously instead (default: half of the memory available at the time).
        collective: in a torch.distributed job, whether every rank takes part in each save
            (each writes its own state; the default). ``False`` makes this checkpointer one
            process's own, as when a framework saves from rank 0 alone: saves and cleanups run
            no collectives, checkpoints hold one state, and every rank loads that one.
            Sharded tensors (DTensor) need the collective path.
        local: a directory on this node (local disk or tmpfs) for a second, faster tier: a
            save commits there, then a background thread uploads it to ``root``, the durable
            tier (`tiers`). A collective save of several ranks needs them all on one node,
            given the same ``local``; rank 0 alone uploads. Not with sharded tensors (yet).
        local_keep: how many checkpoints the local tier keeps. One goes earlier once a newer
            step is durable at ``root``; the newest and the one uploading are always kept.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep: int | None = 3,
        keep_every: int | None = None,
        storage_options: dict[str, Any] | None = None,
        commit_mode: CommitMode | str | None = None,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        max_workers: int | None = None,
        stale_after_seconds: float = 3600.0,
        async_mode: AsyncMode | str = AsyncMode.AUTO,
        max_staging_bytes: int | None = None,
        collective: bool = True,
        local: str | os.PathLike[str] | None = None,
        local_keep: int = 2,
    ):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ConfigError(f"keep must be a positive integer or None (keep all), got {keep!r}")
        if keep_every is not None and (not isinstance(keep_every, int) or keep_every < 1):
            raise ConfigError(f"keep_every must be a positive integer or None, got {keep_every!r}")
        if shard_bytes < 1:
            raise ConfigError(f"shard_bytes must be positive, got {shard_bytes!r}")
        if stale_after_seconds <= 0:
            raise ConfigError(f"stale_after_seconds must be positive, got {stale_after_seconds!r}")
        self._remote: Checkpointer | None = None
        self._uploader: Uploader | None = None
        if local is not None:
            self._remote = Checkpointer(
                root,
                keep=keep,
                keep_every=keep_every,
                storage_options=storage_options,
                commit_mode=commit_mode,
                shard_bytes=shard_bytes,
                max_workers=max_workers,
                stale_after_seconds=stale_after_seconds,
                collective=collective,  # each rank restores its own state from it too
            )
            root = check_local(local, self._remote.storage, local_keep)
            storage_options = commit_mode = None
        super().__init__(
            root,
            storage_options=storage_options,
            commit_mode=commit_mode,
            max_workers=max_workers,
            collective=collective,
        )
        self.local_keep = local_keep
        self._clean_lock = threading.Lock()  # the uploader's thread cleans the local tier too
        self._one_node_checked = False
        if self._remote is not None:
            self._storage = LocalStorage(self._storage.url, unique_names=True)
        # In a collective save rank 0 commits, so it alone uploads; `launch_rank` because the
        # process group may not exist yet (`_refuse_for_two_tiers` checks it again).
        if self._remote is not None and (not collective or launch_rank() == 0):
            self._uploader = Uploader(
                local=self,
                remote=self._remote,
                commit=self._remote._commit,
                clean_remote=self._remote._maybe_clean_up,
                clean_local=self._maybe_clean_up,
                cost=self._cost,
            )
        self.keep = keep
        self.keep_every = keep_every
        self.shard_bytes = shard_bytes
        self.stale_after_seconds = stale_after_seconds
        self._writer_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.async_mode = AsyncMode(async_mode)
        self.max_staging_bytes = max_staging_bytes
        self._staging = StagingBuffer()
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: SaveHandle | None = None
        self._failed: tuple[int, BaseException] | None = None
        if self._uploader is not None:
            self._uploader.start()

    # --- two tiers (`tiers`) -----------------------------------------------------------------

    @property
    def url(self) -> str:
        """The root: with two tiers, the remote (durable) one."""
        return self._remote.url if self._remote is not None else self._storage.url

    @property
    def remote(self) -> Checkpointer | None:
        """The durable tier of a two-tier checkpointer (None with one tier), e.g. to `verify`
        it; `verify`, `inspect` and `scan` of this checkpointer look at the local tier. Do not
        save to it: the uploader does."""
        return self._remote

    @property
    def local_step(self) -> int | None:
        """The newest step committed on the local tier (with one tier: at the root)."""
        for _, manifest in self._newest_first():
            return manifest.step
        return None

    @property
    def durable_step(self) -> int | None:
        """The newest step known to be committed remotely (with one tier: at the root).

        With two tiers only the uploading process knows: rank 0 of a collective save. The
        other ranks say None (unknown)."""
        if self._uploader is not None:
            return self._uploader.durable_step
        return None if self._remote is not None else self.local_step

    def wait_durable(self, timeout: float | None = None) -> bool:
        """Wait for the save in flight to commit (`wait`) and then, with two tiers, for every
        committed step to be uploaded (or superseded by a newer durable one).

        In a collective two-tier save rank 0 alone uploads and waits; the other ranks wait
        for their part of the save only and return True at once.

        Returns:
            False if ``timeout`` seconds passed before the uploads finished.

        Raises:
            BackgroundSaveError: the background save failed.
            StorageError: the newest upload failed after its retries (raised once).
        """
        self.wait()
        return self._uploader.wait_durable(timeout) if self._uploader is not None else True

    def close(self, *, wait_durable: bool = True) -> None:
        """Wait for the save in flight and, by default, for its upload; stop the uploader.

        ``wait_durable=False`` leaves an upload unfinished: the local copy stays, and the
        next checkpointer on the same local directory uploads it.

        Raises:
            BackgroundSaveError: the background save failed.
            StorageError: the newest upload failed after its retries.
        """
        try:
            self.wait()
            if wait_durable and self._uploader is not None:
                self._uploader.wait_durable()
        finally:
            if self._uploader is not None:
                self._uploader.close(wait=wait_durable)

    def _remote_or_raise(self) -> Checkpointer:
        assert self._remote is not None, "called with two tiers only"
        return self._remote

    def list(self) -> builtins.list[CheckpointInfo]:
        """All committed checkpoints, oldest first; with two tiers, of both (a step on both is
        described by its local copy)."""
        if self._remote is None:
            return super().list()
        return list_across(self, self._remote)

    def latest(self) -> CheckpointInfo | None:
        """The committed checkpoint with the highest step (of either tier), or None."""
        if self._remote is None:
            return super().latest()
        found = self.list()
        return found[-1] if found else None

    def _load_with_fallback(
        self,
        step: int | None,
        map_location: Any,
        rank: int | None = None,
        live: Callable[[], dict[str, Any]] | None = None,
    ) -> tuple[int, Any] | None:
        if self._remote is None:
            return super()._load_with_fallback(step, map_location, rank, live)

        def load(reader: CheckpointReader, dirname: str, manifest: Manifest) -> Any:
            return reader._load_manifest(dirname, manifest, map_location, rank, live)

        found = load_across(self, self._remote, step, load)
        if found is None:
            return None
        self._restored_tier, loaded_step, data = found
        return loaded_step, data

    # --- save --------------------------------------------------------------------------------

    @overload
    def save(
        self,
        step: int,
        state: Any,
        *,
        metadata: Mapping[str, Any] | None = None,
        blocking: Literal[True] = True,
    ) -> CheckpointInfo: ...

    @overload
    def save(
        self,
        step: int,
        state: Any,
        *,
        metadata: Mapping[str, Any] | None = None,
        blocking: Literal[False],
    ) -> SaveHandle: ...

    @overload
    def save(
        self,
        step: int,
        state: Any,
        *,
        metadata: Mapping[str, Any] | None = None,
        blocking: bool = True,
    ) -> CheckpointInfo | SaveHandle: ...

    def save(
        self,
        step: int,
        state: Any,
        *,
        metadata: Mapping[str, Any] | None = None,
        blocking: bool = True,
    ) -> CheckpointInfo | SaveHandle:
        """Write ``state`` as checkpoint ``step`` and commit it atomically.

        ``blocking=True`` returns once the checkpoint is durable. ``blocking=False`` returns a
        `SaveHandle` as soon as the state is captured (see `async_save`); the loop may then
        mutate the state freely. At most one save is in flight: a new save first waits for the
        previous one, whose failure, if any, is raised here (`BackgroundSaveError`).

        Raises:
            UnsupportedStateError: ``state`` holds a value that cannot be saved without pickle.
            StorageError: writing failed; earlier checkpoints are untouched.
            BackgroundSaveError: the previous background save failed.
        """
        check_step(step)
        started = time.perf_counter()
        self.wait()  # backpressure, ordering, and the previous save's error
        flat = flatten(state)  # refuses bad input before anything touches storage
        meta = dict(metadata or {})
        # All ranks call save() at the same step, in the main thread: the place to make groups.
        group = gloo_group("checkpoint") if self._distributed() else None
        if self._remote is not None:
            self._refuse_for_two_tiers(flat, group)
        if flat.sharded:
            if not self.collective:
                raise ConfigError(
                    f"sharded tensors ({', '.join(list(flat.sharded)[:3])}) are saved by every "
                    "rank together: use a Checkpointer with collective=True"
                )
            group = self._prepare_sharded(flat, group)
            blocking = True  # DCP runs collectives of its own; not from a background thread
        if blocking:
            return self._save_now(step, flat, meta, started, group)
        return self._save_in_background(step, flat, meta, started, group)

    def _refuse_for_two_tiers(self, flat: Flattened, group: Any) -> None:
        if flat.sharded:
            raise ConfigError(
                f"sharded tensors ({', '.join(list(flat.sharded)[:3])}) are not supported with "
                "two tiers yet (replicated and per-rank state are, on one node): drop local= "
                "and save to the shared root directly"
            )
        if group is None:
            if self._uploader is None:
                raise ConfigError(
                    f"this process is rank {launch_rank()} (RANK) but saves alone, outside a "
                    "process group, so nothing would upload its saves: create the process "
                    "group before the checkpointer, or pass collective=False"
                )
            return
        if not self._one_node_checked:  # the same answer on every rank: all raise or none
            check_one_node(self._storage.url, group, uploads=self._uploader is not None)
            self._one_node_checked = True

    def _prepare_sharded(self, flat: Flattened, group: Any) -> Any:
        if not isinstance(self._storage, LocalStorage):
            raise ConfigError(
                f"sharded tensors ({', '.join(list(flat.sharded)[:3])}) are saved through "
                "torch.distributed.checkpoint, which this version supports on local or shared "
                f"POSIX filesystems only, not {self.url}"
            )
        if group is None:  # one rank: still the collective path, for DCP's files
            group = gloo_group("checkpoint")
        return group

    def wait(self) -> CheckpointInfo | None:
        """Wait for the save in flight, if any; returns its info or raises its error.

        Raises:
            BackgroundSaveError: the background save failed (raised once, here or on save()).
        """
        handle = self._in_flight
        if handle is not None:
            # The task records its own error in _failed. A Ctrl-C while waiting is the
            # caller's: it propagates, and the save, still in flight, is waited for next time.
            with contextlib.suppress(Exception):
                handle.wait()
            self._in_flight = None
        failed, self._failed = self._failed, None
        if failed is not None:
            step, error = failed
            raise BackgroundSaveError(
                f"the background save of step {step} failed: {error}. Nothing of it was "
                "committed; the previous checkpoint is intact. Fix the cause and save again"
            ) from error
        return None if handle is None else handle.wait()

    def _save_now(
        self,
        step: int,
        flat: Flattened,
        metadata: dict[str, Any],
        started: float,
        group: Any = None,
    ) -> CheckpointInfo:
        info = self._write(step, flat, metadata, started, group=group)
        self._cost.record_stall(time.perf_counter() - started)
        self._record(step, info, started=started)
        return info

    def _save_in_background(
        self,
        step: int,
        flat: Flattened,
        metadata: dict[str, Any],
        started: float,
        group: Any = None,
    ) -> SaveHandle:
        mode = AsyncMode.COPY if group is not None else self._pick_async_mode(flat)
        need = state_bytes(flat.arrays)
        cap = self._staging_cap()
        if need > cap and not (mode is AsyncMode.COPY and self._staging.capacity >= need):
            log.warning(
                "background save of step %d needs %.1f MiB of staging memory, over the cap of "
                "%.1f MiB (max_staging_bytes, default half the available memory); saving "
                "synchronously instead",
                step,
                need / 2**20,
                cap / 2**20,
            )
            info = self._save_now(step, flat, metadata, started, group)
            done: Future[CheckpointInfo] = Future()
            done.set_result(info)
            return SaveHandle(step, time.perf_counter() - started, "sync", done)
        if mode is AsyncMode.FORK:
            forked = fork_and_run(
                lambda: self._write_and_commit(step, flat, metadata, started)[1].to_bytes()
            )

            def persist() -> CheckpointInfo:
                manifest = Manifest.from_bytes(forked.wait())
                return self._info(step_dirname(step), manifest)
        else:
            devices = [describe(a)[3] for a in flat.arrays]
            staged, ready = self._staging.stage(flat.arrays)
            snapshot = Flattened(tree=flat.tree, arrays=staged)

            def persist() -> CheckpointInfo:
                ready()
                return self._write(step, snapshot, metadata, started, devices=devices, group=group)

        stall = time.perf_counter() - started
        self._cost.record_stall(stall)
        handle = SaveHandle(
            step, stall, mode.value, self._executor().submit(self._finish, step, persist, started)
        )
        self._in_flight = handle
        return handle

    def _finish(
        self, step: int, persist: Callable[[], CheckpointInfo], started: float
    ) -> CheckpointInfo:
        """Runs on the background thread: persist, record, clean up; keep any error for later."""
        try:
            info = persist()
        except BaseException as e:
            log.error("background save of step %d failed: %s", step, e)
            self._failed = (step, e)
            raise
        self._record(step, info, started=started)
        return info

    def _record(self, step: int, info: CheckpointInfo, *, started: float) -> None:
        self._cost.record_save(
            step=step,
            persist_seconds=time.perf_counter() - started,
            nbytes=info.bytes,
            at=time.time(),
        )
        if self._uploader is not None:  # before the clean-up, which then keeps it
            self._uploader.submit(step, started)
        self._maybe_clean_up(step)

    def _pick_async_mode(self, flat: Flattened) -> AsyncMode:
        """``copy`` unless ``fork`` was asked for and applies (`async_save.py`: why ``auto``
        copies)."""
        if self.async_mode is not AsyncMode.FORK:
            return AsyncMode.COPY
        fork_ok = (
            fork_supported()
            and self._uploader is None  # no fork beside the uploader's thread and its locks
            and self._storage.commit_mode is CommitMode.RENAME
            and all_on_cpu(flat.arrays)
        )
        if not fork_ok:
            log.warning(
                "async_mode='fork' needs CPU state on a local disk under Linux; copying instead"
            )
            return AsyncMode.COPY
        return AsyncMode.FORK

    def _staging_cap(self) -> int:
        if self.max_staging_bytes is not None:
            return self.max_staging_bytes
        available = available_memory_bytes()
        return available // 2 if available is not None else sys.maxsize

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, "preemptible-save")
        return self._pool

    def _write(
        self,
        step: int,
        flat: Flattened,
        metadata: dict[str, Any],
        started: float,
        devices: builtins.list[str] | None = None,
        group: Any = None,
    ) -> CheckpointInfo:
        if group is not None:

            def manifest(files: dict[str, FileRecord], state_files: list[str]) -> Manifest:
                return self._manifest(step, started, files, state_files[0], metadata, state_files)

            written = write_collectively(
                self._storage,
                step,
                flat,
                group=group,
                shard_bytes=self.shard_bytes,
                max_workers=self.max_workers,
                devices=devices,
                build_manifest=manifest,
                commit=self._commit,
                sharded_dir=self._sharded_dir,
            )
            return self._info(*written)
        return self._info(*self._write_and_commit(step, flat, metadata, started, devices))

    def _manifest(
        self,
        step: int,
        started: float,
        files: dict[str, FileRecord],
        state_file: str,
        metadata: dict[str, Any],
        rank_state_files: builtins.list[str] | None = None,
    ) -> Manifest:
        return Manifest(
            step=step,
            created_at=time.time(),
            save_seconds=time.perf_counter() - started,
            world_size=max(1, len(rank_state_files or [])),
            state_file=state_file,
            rank_state_files=rank_state_files or [],
            files=files,
            writer={"id": self._writer_id, "host": socket.gethostname(), "pid": os.getpid()},
            versions=_versions(),
            metadata=metadata,
        )

    def _write_and_commit(
        self,
        step: int,
        flat: Flattened,
        metadata: dict[str, Any],
        started: float,
        devices: builtins.list[str] | None = None,
    ) -> tuple[str, Manifest]:
        storage = self._storage
        step_dir = step_dirname(step)
        staging = None
        try:
            staging = storage.begin(step_dir, uuid.uuid4().hex[:12])
            written = io.write_state(
                storage,
                staging,
                flat,
                shard_bytes=self.shard_bytes,
                max_workers=self.max_workers,
                devices=devices,
            )
            manifest = self._manifest(step, started, written.files, written.state_file, metadata)
            manifest = self._commit(staging, step_dir, manifest)
        except BaseException as e:
            if staging is not None:
                _best_effort(storage.abort, staging)
            if isinstance(e, PreemptibleError) or not isinstance(e, Exception):
                raise
            raise StorageError(
                f"saving step {step} to {storage.describe(step_dir)} failed: {e!r}. Nothing was "
                "committed and earlier checkpoints are untouched; fix the storage (space, "
                "permissions, credentials, network) and save again"
            ) from e
        return step_dir, manifest

    def _commit(self, staging: Staging, step_dir: str, manifest: Manifest) -> Manifest:
        """Commit; or defer to another writer's earlier, valid commit of the same step; or move
        a corrupt checkpoint of the step aside and commit in its place."""
        storage = self._storage
        reason = ""
        for _ in range(3):
            if storage.commit(staging, step_dir, manifest.to_bytes()):
                return manifest
            existing = self._manifest_or_reason(step_dir)
            if isinstance(existing, Manifest):
                problems, _ = self._problems(step_dir, existing)
                if not problems:
                    log.warning(
                        "step %d was already committed at %s by writer %s; keeping it and "
                        "discarding this save (a committed checkpoint is never overwritten)",
                        manifest.step,
                        storage.describe(step_dir),
                        existing.writer.get("id", "?"),
                    )
                    storage.abort(staging)
                    return existing
                with contextlib.suppress(FileNotFoundError):  # gone already: commit again
                    self._discard(step_dir, existing, problems, "for this save of the step")
                continue
            # No valid manifest: it vanished between the two calls (another writer's retention
            # deleted it), and the commit is tried again; or it is there and unreadable.
            reason = existing
        raise StorageError(
            f"saving step {manifest.step}: {storage.describe(step_dir)} is in the way and holds "
            f"no valid manifest ({reason}), so it is neither replaced nor deleted: it may be a "
            "checkpoint this version cannot read, or another process writes this root in an "
            "incompatible way. Move that folder away and save again"
        )

    def discard_if_corrupt(self, step: int) -> VerifyReport:
        """Verify checkpoint ``step`` and, if it fails, move it aside as retention deletes (it is
        invisible at once, then removed), with a `PreemptibleWarning` naming it and its problems.
        A valid checkpoint is left alone. In a distributed job, call it from one rank.

        Returns:
            The verification report (``ok``: the checkpoint was valid and is still there).

        Raises:
            CheckpointNotFoundError: no checkpoint for ``step`` (or it is not committed).
        """
        check_step(step)
        if self._remote is not None:
            return self._discard_in_both_tiers(step)
        return self._discard_here_if_corrupt(step)

    def _discard_in_both_tiers(self, step: int) -> VerifyReport:
        reports = []
        for tier in (self._discard_here_if_corrupt, self._remote_or_raise().discard_if_corrupt):
            with contextlib.suppress(CheckpointNotFoundError):
                reports.append(tier(step))
        if not reports:
            raise CheckpointNotFoundError(f"no committed checkpoint for step {step} in either tier")
        return next((r for r in reports if not r.ok), reports[0])

    def _discard_here_if_corrupt(self, step: int) -> VerifyReport:
        dirname, manifest = self._committed_or_raise(step)
        problems, checked = self._problems(dirname, manifest)
        report = VerifyReport(
            step=step,
            url=self._storage.describe(dirname),
            problems=problems,
            files_checked=len(manifest.files),
            bytes_checked=checked,
        )
        if problems:
            with contextlib.suppress(FileNotFoundError):
                self._discard(dirname, manifest, problems, "to start over")
        return report

    def _discard(
        self, dirname: str, manifest: Manifest, problems: builtins.list[str], why: str
    ) -> None:
        url = self._storage.describe(dirname)
        warnings.warn(
            f"checkpoint step {manifest.step} at {url} is corrupt ({'; '.join(problems)}); "
            f"moving it to the trash {why}",
            PreemptibleWarning,
            stacklevel=3,
        )
        self._storage.discard(dirname, uuid.uuid4().hex[:12], list(manifest.files))

    # --- retention and garbage collection ----------------------------------------------------

    def _maybe_clean_up(self, saved: int | None = None) -> None:
        """Apply retention and collect garbage; failures are logged, never raised.

        The save that triggered this has committed; losing a cleanup must not fail training.
        """
        if self._rank_and_world()[0] != 0:
            return  # one rank deletes; the others would race it for nothing
        try:
            with self._clean_lock:
                self._clean_up(saved)
        except Exception as e:
            log.warning(
                "checkpoint cleanup under %s failed (will retry next save): %r",
                self._storage.url,
                e,
            )

    def _clean_up(self, saved: int | None = None) -> None:
        committed, ignored = self._scan()
        steps = [m.step for _, m in committed]
        if self._uploader is not None:
            protected = self._uploader.protected() | ({saved} if saved is not None else set())
            durable = self._uploader.durable_step
            doomed = set(
                local_steps_to_delete(
                    steps, local_keep=self.local_keep, durable_step=durable, protected=protected
                )
            )
        else:
            doomed = set(
                steps_to_delete(steps, keep=self.keep, keep_every=self.keep_every, saved=saved)
            )
        for dirname, manifest in committed:
            if manifest.step in doomed:
                log.info(
                    "retention: deleting checkpoint step %d under %s",
                    manifest.step,
                    self._storage.url,
                )
                self._storage.delete(dirname, uuid.uuid4().hex[:12], list(manifest.files))
        now = time.time()
        for item in ignored:
            if not item.collectable:
                continue  # unreadable or foreign: maybe committed; a person decides
            if item.name.startswith(TRASH_PREFIX):
                self._storage.remove_tree(item.name)
                continue
            mtime = item.mtime
            if mtime is None and not item.name.startswith(TMP_PREFIX):
                mtime = self._storage.newest_mtime(item.name)
            if mtime is not None and now - mtime > self.stale_after_seconds:
                log.info("garbage-collecting %s (%s)", item.name, item.reason)
                self._storage.remove_tree(item.name)


def _versions() -> dict[str, str]:
    return {
        "preemptible": __version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def _best_effort(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as e:
        log.debug("cleanup %s failed: %r", getattr(fn, "__name__", fn), e)
