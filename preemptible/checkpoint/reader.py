"""`CheckpointReader`: the read side of the store: list, verify, inspect, load and restore.

A reader never writes, so the CLI's `ls`, `verify` and `inspect` and a job that only restores
need nothing of the save machinery; `Checkpointer` adds the write side (save, background
persist, retention) on top of it. A reader trusts nothing it reads: a step is committed when
its manifest parses and names its directory, and a load checks every file against the manifest
before the live state is touched.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from preemptible.checkpoint import io
from preemptible.checkpoint.inspect import Leaf, leaves
from preemptible.checkpoint.manifest import (
    MANIFEST_NAME,
    SHARDED_DIR,
    TMP_PREFIX,
    TRASH_PREFIX,
    Manifest,
    parse_step_dirname,
    step_dirname,
)
from preemptible.checkpoint.records import CheckpointInfo, IgnoredDir, VerifyReport
from preemptible.checkpoint.restore import apply_loaded
from preemptible.checkpoint.serialize import flatten, sharded_keys, unflatten
from preemptible.checkpoint.stats import CheckpointCost, CostTracker
from preemptible.checkpoint.storage import (
    CheckpointStorage,
    CommitMode,
    LocalStorage,
    RootEntry,
    open_storage,
)
from preemptible.distributed import gloo_group, is_distributed, rank_and_world
from preemptible.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ConfigError,
    NoValidCheckpointError,
    PreemptibleError,
    PreemptibleWarning,
    StorageError,
)

log = logging.getLogger("preemptible.checkpoint")


class CheckpointReader:
    """List, verify, inspect, load and restore the checkpoints under one root.

    Args:
        root: a local directory or any fsspec URL (``s3://bucket/run1``, ``memory://x``...).
        storage_options: passed to fsspec (credentials, ``endpoint_url``...).
        commit_mode: ``"rename"`` (local POSIX default) or ``"manifest"`` (default elsewhere).
        max_workers: concurrent file reads (default 4 locally, 16 elsewhere).
        collective: in a torch.distributed job, whether each rank loads its own state (the
            default) or every rank loads the one state of a single-process checkpoint.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        commit_mode: CommitMode | str | None = None,
        max_workers: int | None = None,
        collective: bool = True,
    ):
        self._storage = open_storage(root, storage_options, commit_mode)
        local = self._storage.commit_mode is CommitMode.RENAME
        self.max_workers = max_workers or (4 if local else 16)
        self.collective = collective
        self._cost = CostTracker()
        self._warned_resize = False
        self._restored_tier: str | None = None  # two tiers: which one the last restore read

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

    def _distributed(self) -> bool:
        """Whether saves and loads coordinate the ranks of a torch.distributed job."""
        return self.collective and is_distributed()

    def _rank_and_world(self) -> tuple[int, int]:
        return rank_and_world() if self.collective else (0, 1)

    def _sharded_dir(self, dirname: str) -> str:
        """Where DCP's files of a (staging or committed) checkpoint directory live."""
        assert isinstance(self._storage, LocalStorage)
        return os.path.join(self._storage.root, dirname, SHARDED_DIR)

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
            NoValidCheckpointError: ``step=None`` and every committed checkpoint fails
                verification.
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

        With ``step=None``, the newest checkpoint that passes verification: a corrupt one is
        skipped with a `PreemptibleWarning` for the one before it. When committed checkpoints
        exist and every one fails, nothing is restored and `NoValidCheckpointError` says which.

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
            NoValidCheckpointError: ``step=None`` and every committed checkpoint fails
                verification; ``state`` is left untouched.
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
        self._cost.record_restore(time.perf_counter() - started, self._restored_tier)
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
        failed: list[tuple[int, str]] = []
        for dirname, manifest in self._newest_first():
            try:
                return manifest.step, self._load_manifest(
                    dirname, manifest, map_location, rank, live
                )
            except (CheckpointCorruptedError, CheckpointFormatError) as e:
                failed.append((manifest.step, str(e)))
                warnings.warn(
                    f"skipping checkpoint step {manifest.step}: {e}",
                    PreemptibleWarning,
                    stacklevel=3,
                )
        if failed:
            raise no_valid_checkpoint(self.url, failed)
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
        check_step(step)
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
            check_step(step)
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
        problems, checked = self._problems(dirname, manifest, on_bytes)
        return VerifyReport(
            step=step,
            url=url,
            problems=problems,
            files_checked=len(manifest.files),
            bytes_checked=checked,
        )

    def _problems(
        self, dirname: str, manifest: Manifest, on_bytes: Callable[[int], None] | None = None
    ) -> tuple[builtins.list[str], int]:
        """What is wrong with a committed checkpoint's files (none: it is valid), and the bytes
        found intact."""
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
        return problems, checked

    def _guard_storage(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except PreemptibleError:
            raise
        except OSError as e:
            raise StorageError(f"{what} {self.url} failed: {e!r}") from e


_NO_MANIFEST = "no manifest: save incomplete or interrupted"


def no_valid_checkpoint(url: str, failed: list[tuple[int, str]]) -> NoValidCheckpointError:
    """The error for a root whose committed checkpoints, ``(step, problem)`` newest first, all
    failed: which ones, why, and the two ways to start over."""
    steps = [step for step, _ in failed]
    listed = "".join(f"\n  {problem}" for _, problem in failed)
    return NoValidCheckpointError(
        f"every committed checkpoint under {url} fails verification (steps "
        f"{', '.join(map(str, steps))}), so none was restored and nothing was changed:{listed}\n"
        f"`preemptible ckpt verify {url}` shows each one. To start over from step 0, "
        "move the root (or those step folders) away, or, in a training job, pass "
        'on_no_valid_checkpoint="start_over" to Context or @preemptible: the corrupt '
        "checkpoints are then moved aside",
        steps=steps,
        problems=[problem for _, problem in failed],
    )


def _step_dirs_of(entries: list[RootEntry]) -> list[str]:
    steps = [
        (step, e.name)
        for e in entries
        if e.is_dir and (step := parse_step_dirname(e.name)) is not None
    ]
    return [name for _, name in sorted(steps, key=lambda pair: pair[0])]


def check_step(step: Any) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ConfigError(f"step must be a non-negative integer, got {step!r}")
