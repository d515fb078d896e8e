"""Lightning adapter: atomic, checksummed, pickle-free checkpoints and a save on notice.

Two objects, used together (`docs/ways-in/lightning.md`):

- `PreemptibleCheckpointIO` is the ``plugins=`` entry that makes every Lightning save
  (``ModelCheckpoint``, ``trainer.save_checkpoint``) go through `Checkpointer`. Each Lightning
  checkpoint path (``.../last.ckpt``) becomes a checkpoint root holding one committed step, so
  overwriting ``last.ckpt`` is an atomic replacement, a torn write is never loaded, and loading
  decodes JSON plus raw arrays: nothing is unpickled.
- `PreemptionCallback` records SIGTERM/SIGUSR1/SIGINT with a `PreemptionGuard`, saves at the end
  of the batch in which the notice arrived (all ranks agreeing), and exits with ``128 + signum``.
  ``trainer.fit(model, ckpt_path=callback.resume_path())`` is the same line on the first run and
  on every restart: it is None until a checkpoint exists, then the newest valid one. A resume
  says "resuming from PATH at step N" (`announce`); a finished run started again exits 0 after
  "already complete at step N" (`AlreadyComplete`).

Mid-epoch resume at the right batch needs a resumable data loader (torchdata's
``StatefulDataLoader``): Lightning saves its state in the loop state and restores it.

Two tiers (``local=`` on both objects): each Lightning path gets a sub-directory of a node-local
directory, named from the path (``last.ckpt-<hash of the path>``: readable, and two paths never
share one), and a two-tier `Checkpointer` per path commits there and uploads to the path in the
background. A sub-directory per path, not one local root for every path, because each Lightning
path is its own one-checkpoint root: sharing a root would make ``last.ckpt`` and
``epoch=1.ckpt`` each other's older steps.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
import shutil
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from preemptible import (
    AlreadyComplete,
    BackendNotInstalledError,
    CheckpointCorruptedError,
    Checkpointer,
    CheckpointError,
    CheckpointFormatError,
    CheckpointInfo,
    CheckpointNotFoundError,
    ConfigError,
    NoValidCheckpointError,
    PreemptibleError,
    PreemptibleWarning,
    PreemptionGuard,
    RNGState,
    StorageError,
    announce,
)

try:
    import lightning.fabric.utilities.data as fabric_data
    import lightning.pytorch as pl
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.pytorch.callbacks import Callback
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise BackendNotInstalledError(
        "preemptible.lightning needs Lightning: pip install 'preemptible[lightning]'",
        extra="lightning",
    ) from error

__all__ = ["PreemptibleCheckpointIO", "PreemptionCallback"]

_PREEMPTED_NAME = "preempted.ckpt"
_PATH_KEY = "lightning_path"  # the metadata entry naming the Lightning path of a save

log = logging.getLogger("preemptible")


class PreemptibleCheckpointIO(CheckpointIO):
    """Write and read Lightning checkpoints with `Checkpointer` (``plugins=[...]``).

    A Lightning path is the root of a one-checkpoint store: each save commits a step there and
    only then deletes the previous one (``keep=1``), so a path always holds a complete
    checkpoint, old or new. The step is ``global_step``, or one past the path's previous step
    when that is not higher: Lightning writes the same path twice at one ``global_step`` (end
    of epoch, then validation), and a second commit of an existing step would be ignored.
    ``global_step`` and ``epoch`` go into the manifest's metadata, where
    `PreemptionCallback.resume_path` reads them.

    With ``local=`` a save commits in ``local``'s sub-directory for the path and returns; a
    background thread uploads it to the path. ``teardown`` (the end of ``fit``, or its exit on
    an exception) waits for every upload; on a notice `PreemptionCallback` waits until the
    deadline at most. Lightning calls it from global rank 0 alone, as without tiers.

    Args:
        storage_options: default fsspec options (credentials, ``endpoint_url``); Lightning's
            per-save ``storage_options`` override them.
        local: a directory on this node (local disk or tmpfs) for the first tier; give
            `PreemptionCallback` the same one. None: saves go to the path alone.
    """

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        *,
        local: str | os.PathLike[str] | None = None,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self.local = None if local is None else os.path.abspath(os.fspath(local))
        self._tiered: dict[str, Checkpointer] = {}  # path -> its open two-tier checkpointer

    def _store(self, path: str | os.PathLike[str], options: Any = None) -> Checkpointer:
        merged = {**self.storage_options, **(options or {})}
        # Lightning saves from global rank 0 alone (strategies gather the state first), and
        # every rank loads: a collective checkpointer would wait forever for the other ranks.
        return Checkpointer(
            os.fspath(path), keep=1, storage_options=merged or None, collective=False
        )

    def _tiered_store(self, path: str | os.PathLike[str], options: Any = None) -> Checkpointer:
        """The two-tier checkpointer of ``path``, opened once and kept while it uploads."""
        assert self.local is not None, "called with local= only"
        key = os.fspath(path)
        store = self._tiered.get(key)
        if store is None:
            merged = {**self.storage_options, **(options or {})}
            store = Checkpointer(
                key,
                keep=1,
                storage_options=merged or None,
                collective=False,
                local=_local_dir(self.local, key),
                local_keep=1,
            )
            self._tiered[key] = store
        return store

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        """Commit ``checkpoint`` atomically at ``path`` (a values-only dict: see `serialize`);
        with ``local=``, commit it locally and upload it to ``path`` in the background.

        Raises:
            UnsupportedStateError: the dict holds an object with no pickle-free form (e.g.
                hyperparameters that are arbitrary classes); the message names its key.
        """
        if self.local is None:
            store = self._store(path, storage_options)
        else:
            store = self._tiered_store(path, storage_options)
        latest = store.latest()
        global_step = int(checkpoint.get("global_step", 0))
        # The step folder is the training step; a second save at one global step (end of
        # epoch, then validation) takes the next number, as a commit never replaces a step.
        step = global_step if latest is None else max(global_step, latest.step + 1)
        meta = {
            "global_step": global_step,
            "epoch": int(checkpoint.get("epoch", 0)),
            "format": "lightning",
            _PATH_KEY: os.fspath(path),
        }
        store.save(step, checkpoint, metadata=meta)
        self._close_idle(keep=os.fspath(path))

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any | None = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``; ``weights_only`` is moot, nothing is unpickled.

        With ``local=``, the newest copy of either tier, the local one first on a tie; a copy
        that fails its checksums is skipped for the other tier's, with a `PreemptibleWarning`.

        Raises:
            CheckpointNotFoundError: no committed checkpoint at ``path``.
            CheckpointFormatError: ``path`` is a file (``torch.save``): unpickling it is refused.
            CheckpointCorruptedError: its files fail their checksums.
        """
        fs, root = fsspec.core.url_to_fs(os.fspath(path), **self.storage_options)
        if fs.isfile(root):
            raise CheckpointFormatError(
                f"{os.fspath(path)} is a file, not a checkpoint written by PreemptibleCheckpointIO "
                "(perhaps torch.save); it is not read, since loading it would unpickle it"
            )
        copies = self._copies(path)
        if not copies:
            raise CheckpointNotFoundError(f"no committed checkpoint at {os.fspath(path)}")
        for i, (store, info) in enumerate(copies):
            try:
                # This step, not an older one of the same tier: silently resuming from stale
                # state is worse than failing.
                loaded = store.load(info.step, map_location=map_location)
            except CheckpointCorruptedError as e:
                if i == len(copies) - 1:
                    raise
                warnings.warn(
                    f"skipping the copy of {os.fspath(path)} at {store.url}: {e}; loading the "
                    "other tier's",
                    PreemptibleWarning,
                    stacklevel=2,
                )
                continue
            if not isinstance(loaded, dict):
                raise CheckpointFormatError(
                    f"{os.fspath(path)} does not hold a Lightning checkpoint"
                )
            return loaded
        raise AssertionError("unreachable: the last copy returns or raises")

    def _copies(self, path: str | os.PathLike[str]) -> list[tuple[Checkpointer, CheckpointInfo]]:
        """The newest committed checkpoint of ``path`` in each tier, newest first (local first
        on a tie). One-tier readers: loading starts no uploader, on any rank."""
        remote = self._store(path)
        if self.local is None:
            info = remote.latest()
            return [] if info is None else [(remote, info)]
        local = Checkpointer(_local_dir(self.local, os.fspath(path)), keep=None, collective=False)
        found = []
        for rank, store in enumerate((local, remote)):
            try:
                info = store.latest()
            except StorageError as e:  # the other tier may still have it
                warnings.warn(f"cannot read {store.url}: {e}", PreemptibleWarning, stacklevel=3)
                continue
            if info is not None:
                found.append(((-info.step, rank), store, info))
        return [(store, info) for _, store, info in sorted(found, key=lambda f: f[0])]

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Delete the checkpoint root at ``path`` (``ModelCheckpoint`` rotating its top-k), and
        its local copy; an upload to it in flight is finished first, then deleted too."""
        store = self._tiered.pop(os.fspath(path), None)
        if store is not None:
            try:
                store.close()
            except PreemptibleError as e:  # it is being deleted: its upload no longer matters
                log.warning("closing %s before deleting it: %s", os.fspath(path), e)
        fs, root = fsspec.core.url_to_fs(os.fspath(path), **self.storage_options)
        if fs.exists(root):
            fs.rm(root, recursive=True)
        if self.local is not None:
            shutil.rmtree(_local_dir(self.local, os.fspath(path)), ignore_errors=True)

    def wait_durable(self, timeout: float | None = None) -> bool:
        """Wait until every save so far is uploaded (at once without ``local=``).

        Returns:
            False if ``timeout`` seconds passed first.

        Raises:
            StorageError: an upload failed after its retries; the others are still waited for.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        failed: StorageError | None = None
        for path, store in list(self._tiered.items()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if not store.wait_durable(left):
                    return False
            except StorageError as e:
                log.error("%s is committed locally only: %s", path, e)
                failed = failed or e
        if failed is not None:
            raise failed
        return True

    def close(self, *, wait_durable: bool = True) -> None:
        """Stop the uploaders, after their uploads by default; a later save opens new ones.
        ``wait_durable=False`` leaves an upload unfinished: its local copy stays, and the next
        save to that path (or `PreemptionCallback.resume_path`'s resume) starts from it.

        Raises:
            StorageError: an upload failed after its retries (every uploader is still closed).
        """
        tiered, self._tiered = self._tiered, {}
        failed: PreemptibleError | None = None
        for path, store in tiered.items():
            try:
                store.close(wait_durable=wait_durable)
            except PreemptibleError as e:
                log.error("%s is committed locally only: %s", path, e)
                failed = failed or e
        if failed is not None:
            raise failed

    def teardown(self) -> None:
        """Lightning's end of ``fit`` (or of its exit on an exception): wait for the uploads."""
        self.close()

    def _close_idle(self, keep: str) -> None:
        """Close the uploaders of other paths with nothing left to upload: one thread per path
        written (``ModelCheckpoint`` names a new path each epoch) would pile up."""
        for path, store in list(self._tiered.items()):
            if path == keep:
                continue
            try:
                idle = store.wait_durable(timeout=0)
            except StorageError as e:  # reported once; the local copy stays
                log.error("%s is committed locally only: %s", path, e)
                idle = True
            if idle:
                del self._tiered[path]
                store.close(wait_durable=False)


def _local_dir(local: str, path: str) -> str:
    """The sub-directory of ``local`` that holds the local tier of the Lightning ``path``:
    its file name, readable, then a hash of the whole absolute path or URL, so that two paths
    never share one and a restart finds the same one."""
    url = path.rstrip("/") if "://" in path else os.path.abspath(path)
    name = re.sub(r"[^A-Za-z0-9._=-]", "_", url.rstrip("/").rsplit("/", 1)[-1]) or "ckpt"
    return os.path.join(local, f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:12]}")


class PreemptionCallback(Callback):
    """Save at the end of the batch in which a notice arrived, then exit ``128 + signum``.

    The guard is installed in ``setup``, before Lightning registers its own handlers, so
    Lightning leaves SIGUSR1 to us even with SLURM's ``auto_requeue``; it composes its own
    SIGTERM handler over ours, and ``on_train_start`` takes SIGTERM back
    (`docs/ways-in/lightning.md`).
    The save goes to ``dirpath/preempted.ckpt`` via ``trainer.save_checkpoint``, hence through
    the trainer's CheckpointIO; with `PreemptibleCheckpointIO` it is atomic. The process leaves
    by raising ``SystemExit``, which Lightning turns into its teardown (``on_exception`` hooks,
    loggers closed) before the exit.

    A run resumed from a checkpoint that already ends it (``max_epochs`` or ``max_steps``
    reached: Lightning trains nothing) exits 0 at the end of ``fit`` by raising `AlreadyComplete`,
    after logging "already complete at step N", so that the code after ``fit``, which would see
    no training, does not run.

    Args:
        dirpath: where checkpoints live; give ``ModelCheckpoint`` the same one so that
            `resume_path` sees its saves too.
        guard: an installed guard to share with other code; else one is made and installed here.
        storage_options: fsspec options for listing ``dirpath``.
        on_no_valid_checkpoint: when `resume_path` finds checkpoints of ours and every one fails
            verification: ``"fail"`` (the default) raises `NoValidCheckpointError`, which names
            them; ``"start_over"`` returns None (training starts over; new saves replace them).
        local: the ``local=`` given to `PreemptibleCheckpointIO`, so that `resume_path` also
            sees saves whose upload did not finish; with it, the save on a notice waits for its
            upload until the notice's deadline (``guard.remaining()``), no longer.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str],
        *,
        guard: PreemptionGuard | None = None,
        storage_options: Mapping[str, Any] | None = None,
        on_no_valid_checkpoint: str = "fail",
        local: str | os.PathLike[str] | None = None,
    ) -> None:
        if on_no_valid_checkpoint not in ("fail", "start_over"):
            raise ConfigError(
                f"on_no_valid_checkpoint must be 'fail' or 'start_over', got "
                f"{on_no_valid_checkpoint!r}"
            )
        self.dirpath = os.fspath(dirpath)
        self.storage_options = dict(storage_options or {})
        self.guard = guard if guard is not None else PreemptionGuard()
        self.on_no_valid_checkpoint = on_no_valid_checkpoint
        self.local = None if local is None else os.path.abspath(os.fspath(local))
        self._owns_guard = guard is None
        self._trained = False
        self._trainer: pl.Trainer | None = None
        self._resumed: _Resumed | None = None
        self._loader_states: list[dict[str, Any]] = []

    # --- resuming ---------------------------------------------------------------------------

    def resume_path(self) -> str | None:
        """The newest checkpoint under ``dirpath`` that verifies, or None; for ``ckpt_path=``.

        Newest means the highest ``global_step``, then the latest commit: a preemption save
        mid-epoch is newer than the last epoch's ``ModelCheckpoint`` file. A checkpoint whose
        checksums fail is skipped with a `PreemptibleWarning`, so a corrupted newest file costs
        progress, not the run.

        Raises:
            NoValidCheckpointError: checkpoints of ours exist and every one fails verification
                (unless ``on_no_valid_checkpoint="start_over"``).
        """
        best: tuple[tuple[int, float], str] | None = None
        corrupt: list[tuple[int, str]] = []
        for path, store in self._copies():
            try:
                info = store.latest()
                if info is None:
                    continue
                report = store.verify(info.step)
            except (CheckpointError, OSError):
                continue
            step = int(info.metadata.get("global_step", -1))
            if not report.ok:
                problem = f"{store.url} (global step {step}): {'; '.join(report.problems)}"
                warnings.warn(f"skipping {problem}", PreemptibleWarning, stacklevel=2)
                corrupt.append((step, problem))
                continue
            key = (step, info.created_at)
            if best is None or key > best[0]:
                best = (key, path)
        if best is None and corrupt:
            self._no_valid_checkpoint(sorted(corrupt, reverse=True))
        return None if best is None else best[1]

    def _copies(self) -> list[tuple[str, Checkpointer]]:
        """``(Lightning path, one-tier reader)`` of every copy under ``dirpath``, and, with
        ``local``, of every local copy of a path under ``dirpath`` (its upload may not have
        finished: the path may not exist yet)."""
        options = self.storage_options or None
        copies = []
        fs, root = fsspec.core.url_to_fs(self.dirpath, **self.storage_options)
        if fs.exists(root):
            for entry in fs.ls(root, detail=False):
                name = posixpath.basename(entry.rstrip("/"))
                if name.endswith(".ckpt"):
                    path = _join(self.dirpath, name)
                    copies.append((path, Checkpointer(path, keep=None, storage_options=options)))
        if self.local is None or not os.path.isdir(self.local):
            return copies
        for name in sorted(os.listdir(self.local)):
            store = Checkpointer(os.path.join(self.local, name), keep=None, collective=False)
            try:
                info = store.latest()
            except (CheckpointError, OSError):
                continue
            saved = None if info is None else info.metadata.get(_PATH_KEY)
            # Ours, and of this dirpath: the local directory may serve several runs.
            ours = isinstance(saved, str) and _local_dir(self.local, saved) == store.url
            if ours and _same_place(_parent(str(saved)), self.dirpath):
                copies.append((str(saved), store))
        return copies

    def _no_valid_checkpoint(self, corrupt: list[tuple[int, str]]) -> None:
        listed = "".join(f"\n  {problem}" for _, problem in corrupt)
        if self.on_no_valid_checkpoint == "start_over":
            log.warning(
                "no valid checkpoint under %s: starting over, as on_no_valid_checkpoint="
                '"start_over" asks; corrupt:%s',
                self.dirpath,
                listed,
            )
            return
        raise NoValidCheckpointError(
            f"every checkpoint under {self.dirpath} fails verification, so there is none to "
            f"resume from:{listed}\nTo start over from step 0, move them away, or pass "
            'on_no_valid_checkpoint="start_over" to PreemptionCallback',
            steps=[step for step, _ in corrupt],
            problems=[problem for _, problem in corrupt],
        )

    # --- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The global RNG states (Python, numpy, torch, CUDA): Lightning saves none, and a
        resumed run must draw what the uninterrupted one would have (samplers seeded from the
        global generator, dropout); and whether the epoch's batches were all done, which
        decides when a resume puts them back (`_realign`)."""
        trainer = self._trainer
        epoch_done = False
        if trainer is not None:
            done = trainer.fit_loop.epoch_loop.batch_progress.current.ready
            epoch_done = done >= trainer.num_training_batches
        return {"rng": RNGState().state_dict(), "epoch_done": epoch_done}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "rng" not in state_dict:
            return
        if "epoch_done" not in state_dict:  # an earlier version: restored at once, as then
            RNGState().load_state_dict(state_dict["rng"])
            return
        self._resumed = _Resumed(state_dict["rng"], bool(state_dict["epoch_done"]))

    # --- hooks --------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        io = trainer.strategy.checkpoint_io
        if isinstance(io, PreemptibleCheckpointIO) and io.local != self.local:
            raise ConfigError(
                f"PreemptibleCheckpointIO has local={io.local!r}, PreemptionCallback "
                f"local={self.local!r}: give both the same local directory, or resume_path "
                "misses the saves whose upload did not finish"
            )
        if self._owns_guard and not self.guard.installed:
            self.guard.install()
        self._trained = False
        self._trainer = trainer

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        fit_state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        self._loader_states = list(fit_state.get("combined_loader", []))
        if trainer.is_global_zero:
            step = int(checkpoint.get("global_step", 0))
            announce("resuming from %s at step %d", trainer.ckpt_path, step)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning has just put its SIGTERM handler over ours (Trainer._run). With several
        # processes it broadcasts from inside that handler and raises SIGTERMException at the
        # next batch, which races with our agreement and can end the run with status 0 and no
        # save (seen with ddp on gloo under load); the notice is ours alone during training.
        self._trained = True
        taken = self.guard.reclaim()
        if taken:
            log.debug("preemption notices by %s are handled by PreemptionCallback alone", taken)
        if self._resumed is not None:
            resumed, self._resumed = self._resumed, None
            _realign(trainer, resumed, self._loader_states)
        self._loader_states = []

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning skips the training loop of a run resumed at its limit and returns from fit
        # as if it had trained: say so, and leave before the code after fit runs on nothing.
        if self._trained or trainer.ckpt_path is None or not _limit_reached(trainer):
            return
        if self._owns_guard:
            self.guard.uninstall()  # Lightning calls no teardown hook after this exception
        limits = f"max_epochs={trainer.max_epochs}, max_steps={trainer.max_steps}"
        done = AlreadyComplete(
            trainer.global_step,
            f"the checkpoint at {trainer.ckpt_path} ends the run ({limits}); nothing left to run",
        )
        if trainer.is_global_zero:
            log.warning("%s", done.message)
        raise done

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._owns_guard:
            self.guard.uninstall()

    def _wait_durable(self, trainer: pl.Trainer) -> None:
        io = trainer.strategy.checkpoint_io
        if trainer.is_global_zero and isinstance(io, PreemptibleCheckpointIO) and io.local:
            _wait_durable_until_deadline(io, self.guard)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # One small collective per batch: any rank's notice stops every rank at this batch.
        stop = trainer.strategy.reduce_boolean_decision(self.guard.requested, all=False)
        if not stop:
            return
        path = _join(self.dirpath, _PREEMPTED_NAME)
        with self.guard.final_save():
            trainer.save_checkpoint(path, weights_only=False)  # the full state; unasked, it logs
            self._wait_durable(trainer)
        trainer.should_stop = True
        code = self.guard.exit_code() or 143  # a notice seen only by another rank: SIGTERM's
        if trainer.is_global_zero:
            why = self.guard.reason or "another rank's notice"
            announce(
                "%s: saved step %d to %s; exiting with %d", why, trainer.global_step, path, code
            )
        raise SystemExit(code)


@dataclass(frozen=True)
class _Resumed:
    """What a resume puts back once Lightning has rebuilt the data loader (`_realign`)."""

    rng: dict[str, Any]
    epoch_done: bool


def _realign(trainer: pl.Trainer, resumed: _Resumed, loader_states: list[dict[str, Any]]) -> None:
    """Make the resumed run draw and read what the uninterrupted one would have, from the
    first batch on (called at ``on_train_start``, after Lightning built the loader).

    Lightning creates the loader's iterator before it sets the sampler's epoch, and keeps it on a
    resume, so a ``DistributedSampler`` resumed in epoch 1 or later replays epoch 0's order; after
    an end-of-epoch checkpoint it loads no loader state, so a ``StatefulDataLoader`` shuffles
    from a fresh seed. Building the loader also draws from the global generator, which the
    uninterrupted run did long before. So: set the epoch, load the loader's state (which also
    puts a ``StatefulDataLoader``'s shuffling generator back), make the iterator again, put the
    RNG states back, and, when the checkpoint ended an epoch, make the next epoch's iterator from
    there, as the uninterrupted run did (it draws from the global generator)."""
    fit_loop = trainer.fit_loop
    loader = getattr(fit_loop, "_combined_loader", None)
    fetcher = getattr(fit_loop, "_data_fetcher", None)
    set_sampler_epoch = getattr(fabric_data, "_set_sampler_epoch", None)
    if loader is None or fetcher is None or set_sampler_epoch is None:  # a Lightning unknown
        warnings.warn(
            "cannot realign the data loader with this Lightning version; restoring the RNG "
            "states only (the data order after the resume may differ)",
            PreemptibleWarning,
            stacklevel=2,
        )
        RNGState().load_state_dict(resumed.rng)
        return
    # Lightning's own epoch number for set_epoch (typed as the base tracker, it has `processed`)
    epoch = fit_loop.epoch_progress.current.processed  # type: ignore[attr-defined]
    for dataloader in loader.flattened:
        set_sampler_epoch(dataloader, epoch)
    loader._load_state_dicts(loader_states)
    iter(fetcher)
    RNGState().load_state_dict(resumed.rng)
    if resumed.epoch_done:  # the loader stands at the end of the epoch saved: start the next
        iter(fetcher)


def _wait_durable_until_deadline(io: PreemptibleCheckpointIO, guard: PreemptionGuard) -> None:
    """After a notice's save, committed locally: wait for the uploads until the deadline, then
    stop the uploaders without waiting (``teardown`` then has nothing left to wait for)."""
    try:
        durable = io.wait_durable(timeout=guard.remaining())
    except StorageError as e:
        durable = False
        log.error("uploading the checkpoints failed: %s", e)
    if durable:
        log.warning("the checkpoint saved on the notice is durable")
    else:
        log.warning(
            "the checkpoint saved on the notice is committed on the local tier %s, not "
            "uploaded before the deadline: a restart on this node resumes from it and uploads "
            "it; one on another node resumes from the newest uploaded checkpoint",
            io.local,
        )
    io.close(wait_durable=False)


def _limit_reached(trainer: pl.Trainer) -> bool:
    """Whether the trainer's ``max_steps`` or ``max_epochs`` is reached (-1 or None: no limit)."""
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps:
        return True
    return max_epochs is not None and max_epochs >= 0 and trainer.current_epoch >= max_epochs


def _parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] if "://" in path else os.path.dirname(path)


def _same_place(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.abspath(a) == os.path.abspath(b)


def _join(base: str, name: str) -> str:
    if "://" in base:
        return base.rstrip("/") + "/" + name
    return os.path.join(base, name)
