"""`Checkpointer`: atomic, verifiable checkpoints of training state on any fsspec filesystem.

Public methods validate their input once and translate storage failures into our errors; the
work is in `io` (bytes), `storage` (commit protocol) and `retention` (what to delete). Two
writers on one root — a zombie of a preempted run and its replacement — are safe by
construction: a committed step is immutable, the first commit of a step wins and the other
writer discards its copy, a writer only deletes committed checkpoints (newest always kept) and
temporary files older than ``stale_after_seconds``, and it never touches another writer's
in-progress files before then.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
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
from preemptible.checkpoint.inspect import Leaf, leaves
from preemptible.checkpoint.manifest import (
    MANIFEST_NAME,
    SHARDED_DIR,
    TMP_PREFIX,
    TRASH_PREFIX,
    FileRecord,
    Manifest,
    parse_step_dirname,
    step_dirname,
)
from preemptible.checkpoint.records import CheckpointInfo, IgnoredDir, VerifyReport
from preemptible.checkpoint.restore import apply_loaded
from preemptible.checkpoint.retention import steps_to_delete
from preemptible.checkpoint.serialize import Flattened, flatten, sharded_keys, unflatten
from preemptible.checkpoint.stats import CheckpointCost, CostTracker
from preemptible.checkpoint.storage import (
    CheckpointStorage,
    CommitMode,
    Entry,
    LocalStorage,
    Staging,
    open_storage,
)
from preemptible.distributed import gloo_group, is_distributed, rank_and_world
from preemptible.errors import (
    BackgroundSaveError,
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ConfigError,
    PreemptibleError,
    PreemptibleWarning,
    StorageError,
)

log = logging.getLogger("preemptible.checkpoint")

DEFAULT_SHARD_BYTES = 128 << 20


class Checkpointer:
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
        async_mode: how ``save(blocking=False)`` captures the state: ``"auto"``, ``"copy"``
            (reused staging buffer, pinned for GPU state) or ``"fork"`` (copy-on-write child).
        max_staging_bytes: a background save needing more snapshot memory than this is done
            synchronously instead (default: half of the memory available at the time).
        collective: in a torch.distributed job, whether every rank takes part in each save
            (each writes its own state; the default). ``False`` makes this checkpointer one
            process's own, as when a framework saves from rank 0 alone: saves and cleanups run
            no collectives, checkpoints hold one state, and every rank loads that one.
            Sharded tensors (DTensor) need the collective path.
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
    ):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ConfigError(f"keep must be a positive integer or None (keep all), got {keep!r}")
        if keep_every is not None and (not isinstance(keep_every, int) or keep_every < 1):
            raise ConfigError(f"keep_every must be a positive integer or None, got {keep_every!r}")
        if shard_bytes < 1:
            raise ConfigError(f"shard_bytes must be positive, got {shard_bytes!r}")
        if stale_after_seconds <= 0:
            raise ConfigError(f"stale_after_seconds must be positive, got {stale_after_seconds!r}")
        self.keep = keep
        self.keep_every = keep_every
        self.shard_bytes = shard_bytes
        self.stale_after_seconds = stale_after_seconds
        self._storage = open_storage(root, storage_options, commit_mode)
        local = self._storage.commit_mode is CommitMode.RENAME
        self.max_workers = max_workers or (4 if local else 16)
        self._writer_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._cost = CostTracker()
        self.async_mode = AsyncMode(async_mode)
        self.max_staging_bytes = max_staging_bytes
        self._staging = StagingBuffer()
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: SaveHandle | None = None
        self._failed: tuple[int, BaseException] | None = None
        self._warned_resize = False
        self.collective = collective

    # --- properties ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._storage.url

    @property
    def storage(self) -> CheckpointStorage:
        return self._storage

    @property
    def cost(self) -> CheckpointCost:
        """Measured save and restore costs of this checkpointer (last, mean, p95)."""
        return self._cost.snapshot()

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
        _check_step(step)
        started = time.perf_counter()
        self.wait()  # backpressure, ordering, and the previous save's error
        flat = flatten(state)  # refuses bad input before anything touches storage
        meta = dict(metadata or {})
        # All ranks call save() at the same step, in the main thread: the place to make groups.
        group = gloo_group("checkpoint") if self._distributed() else None
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

    def _distributed(self) -> bool:
        """Whether saves and loads coordinate the ranks of a torch.distributed job."""
        return self.collective and is_distributed()

    def _rank_and_world(self) -> tuple[int, int]:
        return rank_and_world() if self.collective else (0, 1)

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

    def _sharded_dir(self, dirname: str) -> str:
        """Where DCP's files of a (staging or committed) checkpoint directory live."""
        assert isinstance(self._storage, LocalStorage)
        return os.path.join(self._storage.root, dirname, SHARDED_DIR)

    def wait(self) -> CheckpointInfo | None:
        """Wait for the save in flight, if any; returns its info or raises its error.

        Raises:
            BackgroundSaveError: the background save failed (raised once, here or on save()).
        """
        handle, self._in_flight = self._in_flight, None
        if handle is not None:
            with contextlib.suppress(BaseException):  # recorded in _failed by the task itself
                handle.wait()
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
        self._maybe_clean_up()

    def _pick_async_mode(self, flat: Flattened) -> AsyncMode:
        mode = self.async_mode
        fork_ok = (
            fork_supported()
            and self._storage.commit_mode is CommitMode.RENAME
            and all_on_cpu(flat.arrays)
        )
        if mode is AsyncMode.FORK and not fork_ok:
            log.warning(
                "async_mode='fork' needs CPU state on a local disk under Linux; copying instead"
            )
        return AsyncMode.FORK if mode is not AsyncMode.COPY and fork_ok else AsyncMode.COPY

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
        devices: list[str] | None = None,
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
        rank_state_files: list[str] | None = None,
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
        devices: list[str] | None = None,
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
        """Commit, or defer to another writer's earlier commit of the same step."""
        storage = self._storage
        for _ in range(3):
            if storage.commit(staging, step_dir, manifest.to_bytes()):
                return manifest
            existing = self._read_manifest(step_dir)
            if existing is not None:
                log.warning(
                    "step %d was already committed at %s by writer %s; keeping it and discarding "
                    "this save (a committed checkpoint is never overwritten)",
                    manifest.step,
                    storage.describe(step_dir),
                    existing.writer.get("id", "?"),
                )
                storage.abort(staging)
                return existing
            # It vanished between the two calls: another writer's retention deleted it. Retry.
        raise StorageError(
            f"step {manifest.step} at {storage.describe(step_dir)} keeps appearing without a "
            "valid manifest; another process is writing this root in an incompatible way"
        )

    # --- listing -----------------------------------------------------------------------------

    def list(self) -> list[CheckpointInfo]:
        """All committed checkpoints, oldest first. Incomplete saves are invisible."""
        return [self._info(d, m) for d, m in self._scan()[0]]

    def latest(self) -> CheckpointInfo | None:
        """The committed checkpoint with the highest step, or None."""
        for dirname, manifest in self._newest_first():
            return self._info(dirname, manifest)
        return None

    def _newest_first(self) -> Iterator[tuple[str, Manifest]]:
        """Committed checkpoints, newest first, reading each manifest only when it is reached."""
        for dirname in reversed(self._step_dirs()):
            manifest = self._read_manifest(dirname)
            if manifest is not None:
                yield dirname, manifest

    def scan(self) -> tuple[builtins.list[CheckpointInfo], builtins.list[IgnoredDir]]:
        """Committed checkpoints, plus what else lies under the root and why it is ignored."""
        committed, ignored = self._scan()
        return [self._info(d, m) for d, m in committed], ignored

    def _scan(self) -> tuple[builtins.list[tuple[str, Manifest]], builtins.list[IgnoredDir]]:
        entries = self._guard_storage("listing", self._storage.list_root)
        step_dirs = _step_dirs_of(entries)
        mtimes = {e.name: e.mtime for e in entries}
        committed: list[tuple[str, Manifest]] = []
        ignored: list[IgnoredDir] = []
        for dirname, manifest in zip(step_dirs, self._read_manifests(step_dirs), strict=True):
            if isinstance(manifest, Manifest):
                committed.append((dirname, manifest))
            else:
                ignored.append(
                    IgnoredDir(
                        name=dirname,
                        reason=manifest,
                        mtime=mtimes[dirname],
                        collectable=manifest == _NO_MANIFEST,
                    )
                )
        for e in entries:
            if e.name.startswith(TMP_PREFIX):
                reason = "save in progress or interrupted"
            elif e.name.startswith(TRASH_PREFIX):
                reason = "deletion in progress or interrupted"
            else:
                continue
            ignored.append(IgnoredDir(name=e.name, reason=reason, mtime=e.mtime, collectable=True))
        return committed, ignored

    def _step_dirs(self) -> builtins.list[str]:
        """Step directories under the root, oldest first (committed or not)."""
        return _step_dirs_of(self._guard_storage("listing", self._storage.list_root))

    def _read_manifests(self, dirnames: builtins.list[str]) -> builtins.list[Manifest | str]:
        if len(dirnames) <= 1 or self._storage.commit_mode is CommitMode.RENAME:
            return [self._manifest_or_reason(d) for d in dirnames]
        with ThreadPoolExecutor(min(self.max_workers, len(dirnames))) as pool:
            return list(pool.map(self._manifest_or_reason, dirnames))

    def _read_manifest(self, dirname: str) -> Manifest | None:
        result = self._manifest_or_reason(dirname)
        return result if isinstance(result, Manifest) else None

    def _manifest_or_reason(self, dirname: str) -> Manifest | str:
        try:
            data = self._storage.read_bytes(dirname, MANIFEST_NAME)
        except FileNotFoundError:
            return _NO_MANIFEST
        except OSError as e:
            return f"manifest unreadable: {e!r}"
        try:
            manifest = Manifest.from_bytes(data)
        except CheckpointFormatError as e:
            return str(e)
        if manifest.step != parse_step_dirname(dirname):
            return f"manifest says step {manifest.step}, directory says {dirname}"
        return manifest

    def _info(self, dirname: str, manifest: Manifest) -> CheckpointInfo:
        return CheckpointInfo(
            step=manifest.step,
            url=self._storage.describe(dirname),
            created_at=manifest.created_at,
            bytes=manifest.total_bytes,
            save_seconds=manifest.save_seconds,
            world_size=manifest.world_size,
            files=len(manifest.files),
            writer=str(manifest.writer.get("id", "")),
            metadata=manifest.metadata,
        )

    # --- load and restore --------------------------------------------------------------------

    def load(
        self, step: int | None = None, *, map_location: Any = None, rank: int | None = None
    ) -> Any:
        """Read a checkpoint into plain Python: nested dicts/lists of tensors and values.

        With ``step=None``, the newest checkpoint that passes verification (corrupt ones are
        skipped with a warning). Tensors go to ``map_location`` if given, else to the device they
        were saved from when it exists here (a missing ``cuda:N``: the current GPU), else to the
        CPU. A checkpoint written by several ranks holds one state per rank: ``rank`` picks one
        (default: this process's rank).

        Raises:
            CheckpointNotFoundError: there is no such (or no) committed checkpoint.
            CheckpointCorruptedError: ``step`` was given and its files fail verification.
        """
        result = self._load_with_fallback(step, map_location, rank)
        if result is None:
            raise CheckpointNotFoundError(
                f"no committed checkpoint under {self.url}; save one first or check the path"
            )
        return result[1]

    def restore(
        self, state: Any, step: int | None = None, *, map_location: Any = None
    ) -> int | None:
        """Load a checkpoint into ``state`` in place; returns its step, or None if there is none.

        Afterwards ``state`` holds what ``load()`` returns. Objects with ``load_state_dict``
        load their part; tensors are copied into (keeping their identity and device) and must
        match in shape and dtype. Plain dicts are updated in place, keys only the checkpoint
        has included; a list of the same length is restored item by item, one of another
        length that holds only plain data takes the checkpoint's items; scalars, strings,
        numpy arrays and tuples of plain data are replaced in their container. The live state
        is touched only after the whole checkpoint has been read and verified and the two
        have been found to agree.

        Raises:
            CheckpointNotFoundError: ``step`` was given and is not committed.
            CheckpointCorruptedError: ``step`` was given and its files fail verification.
            StateMismatchError: ``state`` has a key the checkpoint lacks, a tensor of another
                shape or dtype, a list of live state of another length, or a container where
                the checkpoint has something else; ``state`` is left untouched.
        """
        started = time.perf_counter()
        # Sharded tensors load in place into the live ones, laid out for this job (resharding).
        result = self._load_with_fallback(step, map_location, live=lambda: flatten(state).sharded)
        if result is None:
            return None
        loaded_step, data = result
        apply_loaded(state, data, "state", loaded_step)
        self._cost.record_restore(time.perf_counter() - started)
        return loaded_step

    def _load_with_fallback(
        self,
        step: int | None,
        map_location: Any,
        rank: int | None = None,
        live: Callable[[], dict[str, Any]] | None = None,
    ) -> tuple[int, Any] | None:
        if step is not None:
            dirname, manifest = self._committed_or_raise(step)
            return step, self._load_manifest(dirname, manifest, map_location, rank, live)
        for dirname, manifest in self._newest_first():
            try:
                return manifest.step, self._load_manifest(
                    dirname, manifest, map_location, rank, live
                )
            except (CheckpointCorruptedError, CheckpointFormatError) as e:
                warnings.warn(
                    f"skipping checkpoint step {manifest.step}: {e}",
                    PreemptibleWarning,
                    stacklevel=3,
                )
        return None

    def _load_manifest(
        self,
        dirname: str,
        manifest: Manifest,
        map_location: Any,
        rank: int | None = None,
        live: Callable[[], dict[str, Any]] | None = None,
    ) -> Any:
        own_rank, world = self._rank_and_world()
        if rank is None:
            rank = own_rank
        elif manifest.world_size != world:
            world = manifest.world_size  # an explicit rank asks for that rank's shard: no warning
        if manifest.world_size != world and not self._warned_resize:
            self._warned_resize = True
            log.warning(
                "checkpoint step %d was written by %d ranks, restoring on %d: each rank loads the "
                "state of rank (its rank mod %d); sharded tensors (DTensor) are resharded by DCP",
                manifest.step,
                manifest.world_size,
                world,
                manifest.world_size,
            )

        def read() -> Any:
            tree, entries = io.read_index(self._storage, dirname, manifest, rank)
            arrays = io.read_arrays(
                self._storage,
                dirname,
                manifest,
                entries,
                max_workers=self.max_workers,
                map_location=map_location,
            )
            loaded = self._load_sharded(dirname, manifest, tree, live)
            return unflatten(tree, arrays.__getitem__, loaded.__getitem__)

        try:
            return read()
        except FileNotFoundError as e:
            problem = f"a file listed in the manifest is missing: {e}"
            raise CheckpointCorruptedError(
                f"checkpoint step {manifest.step} is corrupted: {problem}",
                step=manifest.step,
                problems=[problem],
            ) from e
        except IndexError as e:
            raise CheckpointFormatError(f"step {manifest.step}: array index out of range") from e
        except PreemptibleError:
            raise
        except OSError as e:
            raise StorageError(f"reading {self._storage.describe(dirname)} failed: {e!r}") from e

    def _load_sharded(
        self,
        dirname: str,
        manifest: Manifest,
        tree: Any,
        live: Callable[[], dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """Load the checkpoint's sharded tensors: into the live DTensors, else as full tensors."""
        keys = sharded_keys(tree)
        if not keys:
            return {}
        if not isinstance(self._storage, LocalStorage):
            raise CheckpointFormatError("sharded tensors can be loaded from POSIX paths only")
        for name, record in manifest.files.items():  # DCP checks nothing: we check first
            if name.startswith(f"{SHARDED_DIR}/"):
                problem = io.check_file(self._storage, dirname, name, record)
                if problem:
                    raise CheckpointCorruptedError(
                        f"checkpoint step {manifest.step} is corrupted: {name}: {problem}",
                        step=manifest.step,
                        problems=[f"{name}: {problem}"],
                    )
        from preemptible.checkpoint import sharded

        directory = self._sharded_dir(dirname)
        targets = live() if live is not None else {}
        if not all(k in targets for k in keys):
            targets = sharded.full_size_targets(directory, keys)
        targets = {k: targets[k] for k in keys}
        group = gloo_group("checkpoint") if self._distributed() else None
        sharded.load_into(directory, targets, group)
        return targets

    def inspect(self, step: int | None = None) -> tuple[CheckpointInfo, builtins.list[Leaf]]:
        """Keys, dtypes, shapes and sizes of a checkpoint (default: the newest), from its index.

        Raises:
            CheckpointNotFoundError: there is no such (or no) committed checkpoint.
        """
        dirname, manifest = self._committed_or_raise(step)
        tree, entries = io.read_index(self._storage, dirname, manifest)
        return self._info(dirname, manifest), leaves(tree, entries)

    def _committed_or_raise(self, step: int | None) -> tuple[str, Manifest]:
        if step is None:
            for newest in self._newest_first():
                return newest
            raise CheckpointNotFoundError(
                f"no committed checkpoint under {self.url}; save one first or check the path"
            )
        _check_step(step)
        dirname = step_dirname(step)
        manifest = self._manifest_or_reason(dirname)
        if not isinstance(manifest, Manifest):
            committed = [i.step for i in self.list()] or "none"
            raise CheckpointNotFoundError(
                f"no committed checkpoint for step {step} under {self.url} ({manifest}); "
                f"committed steps: {committed}"
            )
        return dirname, manifest

    # --- verification --------------------------------------------------------------------

    def verify(
        self, step: int | None = None, *, on_bytes: Callable[[int], None] | None = None
    ) -> VerifyReport:
        """Check sizes and checksums of every file of a checkpoint (default: the newest).

        ``on_bytes(n)`` is called as data is read, for progress bars.

        Raises:
            CheckpointNotFoundError: no checkpoint directory for ``step`` (or none at all).
        """
        manifest: Manifest | str
        if step is None:
            dirname, manifest = self._committed_or_raise(None)
            step = manifest.step
        else:
            _check_step(step)
            dirname = step_dirname(step)
            manifest = self._manifest_or_reason(dirname)
        url = self._storage.describe(dirname)
        if not isinstance(manifest, Manifest):
            if dirname not in self._step_dirs():
                raise CheckpointNotFoundError(f"no checkpoint for step {step} under {self.url}")
            return VerifyReport(
                step=step,
                url=url,
                problems=[f"{MANIFEST_NAME}: {manifest}"],
                files_checked=0,
                bytes_checked=0,
            )
        problems, checked = [], 0
        for name, record in sorted(manifest.files.items()):
            problem = self._guard_storage(
                "verifying", io.check_file, self._storage, dirname, name, record, on_bytes
            )
            if problem:
                problems.append(f"{name}: {problem}")
            else:
                checked += record.size
        if not problems:
            try:
                io.read_index(self._storage, dirname, manifest)
            except PreemptibleError as e:
                problems.append(f"{manifest.state_file}: {e}")
        return VerifyReport(
            step=step,
            url=url,
            problems=problems,
            files_checked=len(manifest.files),
            bytes_checked=checked,
        )

    # --- retention and garbage collection ----------------------------------------------------

    def _maybe_clean_up(self) -> None:
        """Apply retention and collect garbage; failures are logged, never raised.

        The save that triggered this has committed; losing a cleanup must not fail training.
        """
        if self._rank_and_world()[0] != 0:
            return  # one rank deletes; the others would race it for nothing
        try:
            self._clean_up()
        except Exception as e:
            log.warning(
                "checkpoint cleanup under %s failed (will retry next save): %r", self.url, e
            )

    def _clean_up(self) -> None:
        committed, ignored = self._scan()
        steps = [m.step for _, m in committed]
        doomed = set(steps_to_delete(steps, keep=self.keep, keep_every=self.keep_every))
        for dirname, manifest in committed:
            if manifest.step in doomed:
                log.info("retention: deleting checkpoint step %d under %s", manifest.step, self.url)
                self._storage.delete(dirname, uuid.uuid4().hex[:12])
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

    def _guard_storage(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except PreemptibleError:
            raise
        except OSError as e:
            raise StorageError(f"{what} {self.url} failed: {e!r}") from e


_NO_MANIFEST = "no manifest: save incomplete or interrupted"


def _step_dirs_of(entries: list[Entry]) -> list[str]:
    steps = [
        (step, e.name)
        for e in entries
        if e.is_dir and (step := parse_step_dirname(e.name)) is not None
    ]
    return [name for _, name in sorted(steps, key=lambda pair: pair[0])]


def _check_step(step: Any) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ConfigError(f"step must be a non-negative integer, got {step!r}")


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
