"""Accelerate adapter: Accelerate's ``save_state``/``load_state`` habits on our atomic store.

`PreemptibleAccelerator` wraps the user's `accelerate.Accelerator` (`docs/ways-in/accelerate.md`):

- ``save_state()``/``load_state()`` keep Accelerate's naming (``checkpoint_{i}`` under
  ``project_dir/checkpoints``, the ``iteration`` counter) and ``total_limit``, and save what it
  saves (models, optimizers, schedulers, the scaler, objects given to
  ``register_for_checkpointing``, the RNG states and data position of every process), but each
  ``checkpoint_{i}`` is a `Checkpointer` root: atomic commit, checksums, any fsspec URL, nothing
  unpickled on load. Old checkpoints are deleted after the new one has committed; Accelerate
  deletes them before it writes (`docs/ways-in/accelerate.md` has the lines). The wrapped
  accelerator's own ``save_state``/``load_state`` are routed here too, so code that calls them
  keeps working and writes the safe format.
- ``batches(loader)`` is the training loop's step boundary: on SIGTERM, SIGUSR1 or SIGINT every
  process agrees on the same step, saves and exits with ``128 + signum``. A resumed run skips
  the batches already trained on (``skip_first_batches``) with the data order of the
  interrupted epoch replayed from its RNG states, so the result is bitwise the same.

Two tiers (``local=``): each ``checkpoint_{i}`` is a two-tier `Checkpointer` whose local tier is
``local/checkpoint_{i}``, the same layout on a node-local disk; the save returns after the local
commit and a background thread uploads it. With several processes on one node every process
writes its own files to the same local folder, the main process commits and alone uploads;
processes on several nodes are refused (`Checkpointer`'s ``local``).

Why a wrapper and not a subclass of ``Accelerator``: the user's ``Accelerator(...)`` line and its
process-wide state stay exactly theirs, we do not re-declare a constructor that changes with
every Accelerate release, and the methods whose meaning changes are the ones this class
defines. Why `Context` underneath: the notice, the agreement of the ranks, the exit code, the
cost file, the reporters and the queue manager's link are `Context`'s; it drives the store
below as its checkpointer through its methods for loops it does not run (``start``,
``step_done``, ``save``, ``report``), so none of that is written twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import fsspec
import torch

from preemptible import (
    BackendNotInstalledError,
    CheckpointCost,
    Checkpointer,
    CheckpointFormatError,
    CheckpointInfo,
    CheckpointNotFoundError,
    ConfigError,
    Context,
    CostTracker,
    NoValidCheckpointError,
    PreemptibleError,
    RNGState,
    StorageError,
    announce,
    forget_process_groups,
)
from preemptible.distributed import local_world_size

try:
    from accelerate.data_loader import get_sampler  # type: ignore[import-untyped]
    from accelerate.utils import DistributedType  # type: ignore[import-untyped]
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise BackendNotInstalledError(
        "preemptible.accelerate needs Accelerate: pip install 'preemptible[accelerate]'",
        extra="accelerate",
    ) from error

__all__ = ["PreemptibleAccelerator"]

log = logging.getLogger("preemptible.accelerate")

_NAME = re.compile(r"^checkpoint_(\d+)$")
_TRASH = ".trash-"
# Files Accelerate's own save_state writes (accelerate/utils/constants.py): a folder holding
# them is not ours, and loading it would unpickle it.
_ACCELERATE_FILES = re.compile(
    r"^(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|optimizer(_\d+)?\.bin|"
    r"random_states_\d+\.pkl|custom_checkpoint_\d+\.pkl)$"
)
_UNSUPPORTED = ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA")


class PreemptibleAccelerator:
    """Atomic ``save_state``/``load_state`` and a save on notice for an ``Accelerator``.

    Create it after ``accelerator.prepare(...)`` and call ``load_state()`` (or start the loop),
    which restores the newest valid checkpoint if there is one:

        acc = PreemptibleAccelerator(accelerator)
        acc.load_state()
        for epoch in acc.epochs(num_epochs):
            for batch in acc.batches(train_loader):
                ...
            acc.save_state()

    Every process runs the same calls, as with Accelerate.

    Args:
        accelerator: the ``Accelerator``, with its models, optimizers and data loaders prepared.
        checkpoint_dir: where ``checkpoint_{i}`` folders go (a path or fsspec URL); default
            ``project_dir/checkpoints`` when ``ProjectConfiguration(automatic_checkpoint_naming=
            True)``. ``ProjectConfiguration.total_limit`` applies either way.
        storage_options: fsspec options (credentials, ``endpoint_url``).
        exit_code: exit code after a notice save (default ``128 + signum``).
        signals: the notices to handle (default SIGTERM, SIGUSR1, SIGINT).
        cost_file: where to write measured costs (default ``$PREEMPTIBLE_COST_FILE``).
        on_no_valid_checkpoint: when checkpoints exist but every one fails verification:
            ``"fail"`` (the default) raises `NoValidCheckpointError`, which names them;
            ``"start_over"`` starts at step 0 (new saves take new numbers; ``total_limit``
            deletes the corrupt ones, oldest first).
        local: a directory on this node (local disk or tmpfs) for a first tier: ``save_state``
            returns once ``local/checkpoint_{i}`` has committed and a background thread uploads
            it to ``checkpoint_{i}``; `close` waits for the uploads, a notice until its deadline.
            Several processes share it: every process on one node, all given the same path.

    Raises:
        ConfigError: no place for checkpoints, a ``total_limit`` below 1, a distributed type
            this adapter does not support (DeepSpeed, FSDP, Megatron-LM, XLA), or ``local``
            with processes on several nodes.
    """

    def __init__(
        self,
        accelerator: Any,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        exit_code: int | None = None,
        signals: tuple[int, ...] | None = None,
        cost_file: str | os.PathLike[str] | None = None,
        on_no_valid_checkpoint: str = "fail",
        local: str | os.PathLike[str] | None = None,
    ) -> None:
        _check_distributed_type(accelerator)
        _check_launched_alone(int(accelerator.num_processes))
        if local is not None:
            _check_one_node(int(accelerator.num_processes))
        config = accelerator.project_configuration
        self.accelerator = accelerator
        self.store = _Store(
            _checkpoint_root(config, checkpoint_dir),
            total_limit=_total_limit(config.total_limit),
            storage_options=storage_options,
            main_process=bool(accelerator.is_main_process),
            processes=int(accelerator.num_processes),
            first_index=int(config.iteration or 0),
            local=None if local is None else os.fspath(local),
        )
        options: dict[str, Any] = {} if signals is None else {"signals": tuple(signals)}
        self.context = Context(
            checkpointer=cast(Checkpointer, self.store),  # the Checkpointer calls Context makes
            async_save=False,
            exit_code=exit_code,
            cost_file=cost_file,
            on_no_valid_checkpoint=on_no_valid_checkpoint,
            **options,
        )
        self._loop = _LoopState(self)
        self._registered: dict[str, Any] = {}
        self._started = False
        self._checked_complete = False
        self._routed = {
            name: accelerator.__dict__.get(name) for name in ("save_state", "load_state")
        }
        accelerator.save_state = self.save_state
        accelerator.load_state = self.load_state

    # --- Accelerate's two methods -------------------------------------------------------------

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save the state of every process to the next ``checkpoint_{i}`` (or ``output_dir``).

        All processes call it. It returns once the checkpoint has committed; only then are
        checkpoints beyond ``total_limit`` deleted, oldest first. ``output_dir`` is a root of its
        own holding one checkpoint, replaced atomically by the next save there; it is not where
        a notice saves, nor where ``load_state()`` looks. ``safe_serialization`` is moot:
        nothing is pickled.

        Returns:
            The committed checkpoint's folder (``.../checkpoint_{i}``, or ``output_dir``).

        Raises:
            UnsupportedStateError: a registered object's state has no pickle-free form.
            ConfigError: something was prepared after the first save or load.
            StorageError: writing failed; earlier checkpoints are untouched.
        """
        _no_engine_options("save_state", save_model_func_kwargs)
        self._ensure_started()
        step = self._loop.global_step
        if output_dir is None:
            self.context.save(step)
            self._sync_iteration()
        else:
            self.store.save_to(os.fspath(output_dir), step, self.context.state())
            self.context.report()
        assert self.store.last_root is not None, "set by the save that just committed"
        return self.store.last_root

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: Any = None,
        **load_model_func_kwargs: Any,
    ) -> int | None:
        """Restore the newest valid checkpoint (or the one at ``input_dir``), in place.

        With no ``input_dir`` a checkpoint that fails its checksums or was never committed is
        skipped, with a warning, for the one before it; none at all is not an error (the first
        run of a job). An explicit ``input_dir`` is loaded or fails. ``load_kwargs`` is moot.

        Returns:
            The step (batches trained) of the restored checkpoint, or None when there is none.

        Raises:
            CheckpointNotFoundError: ``input_dir`` holds no committed checkpoint.
            CheckpointFormatError: ``input_dir`` was written by Accelerate's own ``save_state``:
                loading it would unpickle it.
            CheckpointCorruptedError: ``input_dir``'s files fail their checksums.
            StateMismatchError: the checkpoint holds other models or optimizers than this run.
        """
        _no_engine_options("load_state", load_model_func_kwargs)
        source = None if input_dir is None else os.fspath(input_dir)
        if not self._started:
            self.store.source = source
            self._ensure_started()
            step = self.context.resumed_from
        else:
            self.store.source = source
            step = self.store.restore(self.context.state())
            self._sync_iteration()
        if step is not None and self.accelerator.is_main_process:
            announce("resuming from %s at step %d", self.store.restored_url, step)
        return step

    # --- the loop -----------------------------------------------------------------------------

    def epochs(self, total: int) -> Iterator[int]:
        """Yield the epochs from the restored one (0 on a first run) to ``total - 1``."""
        if total < 0:
            raise ConfigError(f"total must be >= 0, got {total}")
        self._ensure_started()
        if not self._checked_complete:
            self._checked_complete = True
            if self.context.resumed_from is not None and self._loop.epoch >= total:
                self._end_process_group()  # as before a notice's exit
                self.context.already_complete(
                    self._loop.global_step, f"epochs 0 to {total - 1} are done"
                )
        while self._loop.epoch < total:
            epoch = self._loop.epoch
            yield epoch
            if self._loop.epoch == epoch:  # the body did not run batches() to the end
                self._loop.end_pass()

    def batches(self, dataloader: Any) -> Iterator[Any]:
        """One pass over a prepared ``dataloader``, resumed where the restored run stopped.

        A batch counts as trained once it has been handed out. After each one whose gradients
        were synchronised (``accelerator.sync_gradients``: the end of an accumulation cycle) the
        processes agree on a notice; on one they save and exit with ``128 + signum``.

        Raises:
            ConfigError: ``dataloader`` was not prepared by this accelerator, or it is not the
                loader an earlier ``batches()`` call followed.
        """
        self._ensure_started()
        index = self._loop.follow(dataloader)
        source, skipping = self._pass_source(dataloader)
        for batch in source:
            self._loop.taken += 1
            self._loop.global_step += 1
            yield batch
            if self.accelerator.sync_gradients:
                self._step_done()
        if skipping is not None:  # the loader Accelerate built counted the epoch, not ours
            self.accelerator._dataloaders[index].iteration = skipping.iteration
        self._loop.end_pass()

    def _step_done(self) -> None:
        try:
            self.context.step_done(self._loop.global_step)
        except SystemExit:  # the notice's exit, after the save
            self.store.finish_after_notice(self.context.guard.remaining())
            self._end_process_group()
            raise

    def _end_process_group(self) -> None:
        """Destroy the process group before the notice's exit, as ``end_training`` would.

        A process that exits with its gloo group alive may abort in the interpreter's teardown
        (SIGABRT, exit -6 instead of the notice's 143), and a notice skips the end of the
        script where ``end_training`` usually is. Idempotent: a later ``end_training`` is fine.
        """
        try:
            self.accelerator.state.destroy_process_group()
        except Exception as e:  # the exit code matters more than a clean teardown
            log.warning("could not destroy the process group before exiting: %r", e)
        forget_process_groups()

    def _pass_source(self, dataloader: Any) -> tuple[Iterator[Any], Any]:
        """The batches of this pass, and the skipping loader if it resumes a pass."""
        loop = self._loop
        if loop.taken == 0 or loop.pass_rng is None:
            loop.taken, loop.pass_rng = 0, _rng_states(dataloader)
            return iter(dataloader), None
        skipping = self.accelerator.skip_first_batches(dataloader, loop.taken)
        # The interrupted pass drew its order (sampler seed, worker seeds) from the RNG states
        # it started with: draw it again from them, then continue from the saved states.
        now = RNGState().state_dict()
        _load_rng_states(dataloader, loop.pass_rng)
        batches = iter(skipping)
        first = next(batches, _END)
        RNGState().load_state_dict(now)
        return (batches if first is _END else _chain(first, batches)), skipping

    @property
    def should_stop(self) -> bool:
        """True once the processes have agreed to stop at this step boundary."""
        return self.context.should_stop

    @property
    def epoch(self) -> int:
        """The epoch in progress (passes completed by `batches`)."""
        return self._loop.epoch

    @property
    def global_step(self) -> int:
        """Batches handed to the loop so far, over all epochs and restarts."""
        return self._loop.global_step

    @property
    def cost(self) -> CheckpointCost:
        """Measured save and restore costs (last, mean, p95), as the cost file has them."""
        return self.store.cost

    # --- start and end ------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._started:
            return
        self._registered = self._live_state()
        self.context.register(accelerate=self._registered)
        self._started = True
        self.context.start()  # the guard, the queue link, the restore (all ranks agreeing)
        self._sync_iteration()

    def _live_state(self) -> dict[str, Any]:
        acc = self.accelerator
        for i, loader in enumerate(acc._dataloaders):
            if getattr(loader, "use_stateful_dataloader", False):
                raise ConfigError(
                    f"prepared data loader {i} uses use_stateful_dataloader=True, which "
                    "PreemptibleAccelerator does not support yet; it resumes a plain one with "
                    "skip_first_batches. Leave DataLoaderConfiguration(use_stateful_dataloader) off"
                )
        state: dict[str, Any] = {
            "models": list(acc._models),
            "optimizers": list(acc._optimizers),
            "schedulers": list(acc._schedulers),
            "custom": list(acc._custom_objects),
            "loop": self._loop,
        }
        if acc.scaler is not None:
            state["scaler"] = acc.scaler
        return state

    def _check_unchanged(self) -> None:
        now = self._live_state()
        for key in ("models", "optimizers", "schedulers", "custom"):
            if len(now[key]) != len(self._registered[key]):
                raise ConfigError(
                    f"{key}: {len(self._registered[key])} when the first save or load ran, "
                    f"{len(now[key])} now. Prepare (and register_for_checkpointing) everything "
                    "before the first save_state/load_state/epochs/batches call"
                )

    def _sync_iteration(self) -> None:
        self.accelerator.project_configuration.iteration = self.store.next_index

    def close(self) -> None:
        """Wait for the uploads (``local=``), remove the signal handlers and give the
        accelerator its own methods back.

        Raises:
            StorageError: with ``local=``, an upload failed after its retries: the checkpoint
                is on this node's local tier only.
        """
        try:
            self.store.close()
            self.context.close()
        finally:
            for name, method in self._routed.items():
                if method is None:
                    self.accelerator.__dict__.pop(name, None)
                else:
                    setattr(self.accelerator, name, method)

    def __enter__(self) -> PreemptibleAccelerator:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close()
        if kind is None and self.accelerator.num_processes > 1:
            # Leave together: a process that goes on to `end_training` (which destroys the
            # gloo group) while another is still finishing its last collective can make that
            # one abort at exit ("terminate called without an active exception", exit -6).
            self.accelerator.wait_for_everyone()


class _LoopState:
    """The data position, saved with the state of each process.

    ``pass_rng`` holds the RNG states at the start of the pass in progress: the pass drew its
    order from them, and a resumed pass must draw the same one before it skips ``taken``.
    """

    def __init__(self, owner: PreemptibleAccelerator) -> None:
        self.owner = owner
        self.epoch = 0
        self.global_step = 0
        self.taken = 0
        self.pass_rng: dict[str, Any] | None = None
        self.loader: int | None = None

    def follow(self, dataloader: Any) -> int:
        loaders = self.owner.accelerator._dataloaders
        index = next((i for i, d in enumerate(loaders) if d is dataloader), None)
        if index is None:
            raise ConfigError(
                "batches() takes a data loader returned by this accelerator's prepare(); "
                f"got a {type(dataloader).__name__} it did not prepare"
            )
        if self.loader is not None and self.loader != index:
            raise ConfigError(
                f"batches() follows one training loader (prepared loader {self.loader}), got "
                f"prepared loader {index}; iterate evaluation loaders directly"
            )
        self.loader = index
        return index

    def end_pass(self) -> None:
        self.epoch += 1
        self.taken, self.pass_rng = 0, None

    def state_dict(self) -> dict[str, Any]:
        self.owner._check_unchanged()  # runs at every save, before anything is written
        acc = self.owner.accelerator
        return {
            "epoch": self.epoch,
            "global_step": self.global_step,
            "taken": self.taken,
            "pass_rng": self.pass_rng,
            "loader": -1 if self.loader is None else self.loader,
            "accelerator_step": int(acc.step),
            "loaders": [
                {"iteration": int(d.iteration), "generators": [g.get_state() for g in _gens(d)]}
                for d in acc._dataloaders
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        acc = self.owner.accelerator
        if len(state["loaders"]) != len(acc._dataloaders):
            raise ConfigError(
                f"the checkpoint has the position of {len(state['loaders'])} data loaders, this "
                f"run prepared {len(acc._dataloaders)}; prepare the same loaders in the same order"
            )
        for i, (loader, saved) in enumerate(zip(acc._dataloaders, state["loaders"], strict=True)):
            generators = _gens(loader)
            if len(generators) != len(saved["generators"]):
                raise ConfigError(
                    f"prepared data loader {i} draws from {len(generators)} generators, the one "
                    f"saved from {len(saved['generators'])}: build it as the saved run did "
                    "(the same sampler and generator= arguments)"
                )
            loader.iteration = int(saved["iteration"])
            for generator, rng in zip(generators, saved["generators"], strict=True):
                generator.set_state(rng)
        self.epoch = int(state["epoch"])
        self.global_step = int(state["global_step"])
        self.taken = int(state["taken"])
        self.pass_rng = state["pass_rng"]
        self.loader = None if state["loader"] < 0 else int(state["loader"])
        acc.step = int(state["accelerator_step"])


class _Store:
    """The checkpointer `Context` drives: each save is a `Checkpointer` root ``checkpoint_{i}``.

    Only the calls `Context` makes are here. The step inside each root is the loop's
    ``global_step``; ``i`` is Accelerate's save iteration. Folders that do not match
    ``checkpoint_<digits>``, or that hold no checkpoint of ours (Accelerate's own format), are
    never loaded nor deleted.
    """

    def __init__(
        self,
        root: str,
        *,
        total_limit: int | None,
        storage_options: dict[str, Any] | None,
        main_process: bool,
        processes: int,
        first_index: int,
        local: str | None = None,
    ) -> None:
        self.root = root.rstrip("/") if "://" in root else os.path.abspath(root)
        self.local = None if local is None else os.path.abspath(local)
        self._tiered: dict[str, Checkpointer] = {}  # url -> its two-tier store, while open
        self.total_limit = total_limit
        self.storage_options = dict(storage_options or {})
        self.main_process = main_process
        self.processes = processes
        self.next_index = first_index
        self.source: str | None = None  # a load_state(input_dir): read that, not the newest
        self.last_root: str | None = None
        self.restored_url: str | None = None  # the checkpoint the last restore loaded
        self._cost = CostTracker()

    @property
    def url(self) -> str:
        return self.root

    @property
    def cost(self) -> CheckpointCost:
        return self._cost.snapshot()

    def wait(self) -> None:
        """Saves are synchronous: nothing is ever in flight."""

    def _child(self, name: str) -> str:
        return f"{self.root}/{name}" if "://" in self.root else os.path.join(self.root, name)

    def _open(self, url: str) -> Checkpointer:
        return Checkpointer(url, keep=1, storage_options=self.storage_options or None)

    def _local_copy(self, url: str) -> str:
        """The local tier of ``url``: ``local/checkpoint_{i}`` for ``checkpoint_{i}``, else the
        folder's name and a hash of its URL (``save_state(output_dir)``)."""
        assert self.local is not None, "called with local= only"
        name = url.rstrip("/").rsplit("/", 1)[-1]
        if url == self._child(name) and _NAME.match(name):
            return os.path.join(self.local, name)
        digest = hashlib.sha256(url.encode()).hexdigest()[:12]
        return os.path.join(self.local, f"{re.sub(r'[^A-Za-z0-9._=-]', '_', name)}-{digest}")

    def _copies(self, url: str) -> list[Checkpointer]:
        """One-tier readers of ``url``: the local copy first (``local=``), then the remote."""
        remote = self._open(url)
        if self.local is None:
            return [remote]
        return [Checkpointer(self._local_copy(url), keep=1, collective=self._collective), remote]

    @property
    def _collective(self) -> bool:
        """Whether each process saves and loads its own state (several processes) or the one."""
        return self.processes > 1

    def _tiered_store(self, url: str) -> Checkpointer:
        """The two-tier store of ``url``, opened once and kept until its uploads are done."""
        assert self.local is not None, "called with local= only"
        store = self._tiered.get(url)
        if store is None:
            store = Checkpointer(
                url,
                keep=1,
                storage_options=self.storage_options or None,
                collective=self._collective,
                local=self._local_copy(url),
                local_keep=1,
            )
            self._tiered[url] = store
        return store

    def _folders(self) -> list[tuple[int, str]]:
        """``(i, url)`` of every ``checkpoint_{i}`` folder of either tier, oldest first."""
        names = set(_names(self.root, self.storage_options))
        if self.local is not None and os.path.isdir(self.local):
            names |= set(os.listdir(self.local))
        found = [(int(m.group(1)), n) for n in names if (m := _NAME.match(n))]
        return [(i, self._child(n)) for i, n in sorted(found)]

    # --- two tiers ----------------------------------------------------------------------------

    def close(self, *, wait_durable: bool = True) -> None:
        """Wait for the uploads (or not), stop the uploaders, then apply ``total_limit`` to
        what is durable now.

        Raises:
            StorageError: an upload failed after its retries (every uploader is closed).
        """
        tiered, self._tiered = self._tiered, {}
        failed: PreemptibleError | None = None
        for url, store in tiered.items():
            try:
                store.close(wait_durable=wait_durable)
            except PreemptibleError as e:
                log.error("%s is committed on the local tier only: %s", url, e)
                failed = failed or e
        if tiered and wait_durable and self.main_process and self.next_index > 0:
            self._retire(newest=self.next_index - 1)
        if failed is not None:
            raise failed

    def finish_after_notice(self, budget: float | None) -> None:
        """After a notice's save, committed locally: wait for the uploads for ``budget``
        seconds (None: as long as they take), then leave the rest unfinished."""
        if not self._tiered:
            return
        if not self.main_process:  # the main process alone uploads, and says how it went
            self.close(wait_durable=False)
            return
        deadline = None if budget is None else time.monotonic() + budget
        durable = True
        for url, store in self._tiered.items():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                durable = store.wait_durable(left) and durable
            except StorageError as e:
                durable = False
                log.error("%s is committed on the local tier only: %s", url, e)
        if durable:
            log.warning("the checkpoint saved on the notice is durable at %s", self.root)
        else:
            log.warning(
                "the checkpoint saved on the notice is committed on the local tier %s, not "
                "uploaded before the deadline: a restart on this node resumes from it and "
                "uploads it; one on another node resumes from the newest uploaded checkpoint",
                self.local,
            )
        self.close(wait_durable=False)

    def _close_idle(self, keep: str) -> None:
        """Close the uploaders with nothing left to upload: one thread per folder piles up."""
        for url, store in list(self._tiered.items()):
            if url == keep:
                continue
            try:
                idle = store.wait_durable(timeout=0)
            except StorageError as e:  # reported once; the local copy stays
                log.error("%s is committed on the local tier only: %s", url, e)
                idle = True
            if idle:
                del self._tiered[url]
                store.close(wait_durable=False)

    # --- save ---------------------------------------------------------------------------------

    def save(self, step: int, state: Any, *, blocking: bool = True) -> CheckpointInfo:
        """Commit ``state`` as ``checkpoint_{next_index}``, then apply ``total_limit``."""
        index = self.next_index
        info = self._save(self._child(f"checkpoint_{index}"), step, state, index)
        self.next_index = index + 1
        if self.main_process:
            self._retire(newest=index)
        return info

    def save_to(self, url: str, step: int, state: Any) -> CheckpointInfo:
        """A save to a root of the user's choice, outside the numbering and ``total_limit``."""
        return self._save(url, step, state, None)

    def _save(self, url: str, step: int, state: Any, index: int | None) -> CheckpointInfo:
        started = time.perf_counter()
        store = self._open(url) if self.local is None else self._tiered_store(url)
        info = store.save(step, state, metadata={"accelerate_iteration": index})
        elapsed = time.perf_counter() - started
        self._cost.record_stall(elapsed)
        self._cost.record_save(
            step=step, persist_seconds=elapsed, nbytes=info.bytes, at=time.time()
        )
        self.last_root = url
        log.info("saved step %d to %s in %.2f s", step, url, elapsed)
        self._close_idle(keep=url)
        return info

    def _retire(self, *, newest: int) -> None:
        """Delete committed checkpoints beyond ``total_limit`` and interrupted saves, older
        than ``newest`` only; failures are logged: the new checkpoint is safe already.

        With two tiers the newest checkpoint committed remotely is kept even beyond the limit
        until a newer one is (the remote then holds one more for a while), and a local copy
        goes once a newer checkpoint has committed and its own upload is done."""
        try:
            committed, durable, interrupted = [], [], []
            for i, url in self._folders():
                found = ignored = False
                copies = self._copies(url)
                for store in copies:
                    ours, foreign = store.scan()
                    found = found or bool(ours)
                    ignored = ignored or bool(foreign and all(x.collectable for x in foreign))
                    if ours and store is copies[-1]:  # the remote copy
                        durable.append(i)
                if found or i == newest:
                    committed.append(i)
                elif ignored and i < newest and url not in self._tiered:
                    interrupted.append(i)
            keep = len(committed) if self.total_limit is None else self.total_limit
            doomed = set(committed[: max(0, len(committed) - keep)]) | set(interrupted)
            if self.local is not None and durable:
                doomed.discard(max(durable))  # the remote keeps a complete checkpoint
            for i in sorted(doomed):
                log.info("total_limit: deleting %s", self._child(f"checkpoint_{i}"))
                self._delete_both(self._child(f"checkpoint_{i}"))
            if self.local is not None:
                self._retire_local(newest, [i for i in durable if i not in doomed])
            for name in _names(self.root, self.storage_options):
                if name.startswith(f"{_TRASH}checkpoint_"):  # a deletion cut short
                    shutil.rmtree(self._child(name), ignore_errors=True)
        except Exception as e:
            log.warning(
                "deleting old checkpoints under %s failed (retried next save): %r", self.root, e
            )

    def _retire_local(self, newest: int, durable: list[int]) -> None:
        """Delete the local copies of durable checkpoints older than ``newest``."""
        for i in durable:
            url = self._child(f"checkpoint_{i}")
            if i < newest and url not in self._tiered:
                shutil.rmtree(self._local_copy(url), ignore_errors=True)

    def _delete_both(self, url: str) -> None:
        store = self._tiered.pop(url, None)
        if store is not None:  # an upload in flight would write the folder again
            with contextlib.suppress(PreemptibleError):
                store.close()
        with contextlib.suppress(FileNotFoundError):
            self._delete(url)
        if self.local is not None:
            shutil.rmtree(self._local_copy(url), ignore_errors=True)

    def _delete(self, url: str) -> None:
        fs, path = fsspec.core.url_to_fs(url, **self.storage_options)
        if "://" not in url:  # a rename first: the folder vanishes at once, whole
            trash = os.path.join(
                os.path.dirname(path), f"{_TRASH}{os.path.basename(path)}-{uuid.uuid4().hex[:8]}"
            )
            os.rename(path, trash)
            path = trash
        fs.rm(path, recursive=True)

    # --- restore ------------------------------------------------------------------------------

    def restore(self, state: Any, step: int | None = None) -> int | None:
        """Restore the newest committed, valid ``checkpoint_{i}`` (with ``step`` if given)."""
        started = time.perf_counter()
        folders = self._folders()
        if folders:  # never reuse a number, even one of an interrupted save
            self.next_index = max(self.next_index, folders[-1][0] + 1)
        source, self.source = self.source, None
        restored: int | None = None
        if source is not None:
            restored = self._restore_from(source, state, step)
        corrupt: list[tuple[str, NoValidCheckpointError]] = []
        for _, url in reversed(folders if source is None else []):
            restored = self._try(url, state, step, corrupt)
            if restored is not None:
                break
        if restored is not None:
            self._cost.record_restore(time.perf_counter() - started)
        elif corrupt:
            raise _none_valid(self.root, corrupt)
        if self.local is not None and self.main_process:
            self._upload_leftovers(folders)
        return restored

    def _upload_leftovers(self, folders: list[tuple[int, str]]) -> None:
        """Open the two-tier store of each folder committed on the local tier only (its upload
        was cut off by the end of an earlier process): its uploader uploads it."""
        for _, url in folders:
            local, remote = self._copies(url)
            try:
                mine, there = local.latest(), remote.latest()
            except (PreemptibleError, OSError) as e:
                log.warning("could not compare the two copies of %s: %r", url, e)
                continue
            if mine is not None and (there is None or mine.step > there.step):
                self._tiered_store(url)

    def _try(
        self,
        url: str,
        state: Any,
        step: int | None,
        corrupt: list[tuple[str, NoValidCheckpointError]],
    ) -> int | None:
        copies = self._newest_copies(url)
        if not copies:
            log.warning("%s holds no committed checkpoint (an interrupted save?); skipped", url)
            return None
        for store, latest in copies:
            if step is not None and latest.step != step:
                continue
            self._check_processes(url, latest)
            try:
                restored = store.restore(state)  # a corrupt one is skipped with a warning
            except NoValidCheckpointError as e:
                log.warning("%s failed verification; falling back to the checkpoint before it", url)
                corrupt.append((store.url, e))
                continue
            self.restored_url = store.url
            return restored
        return None

    def _newest_copies(self, url: str) -> list[tuple[Checkpointer, CheckpointInfo]]:
        """The committed copies of ``url``, newest first, the local one first on a tie."""
        found = []
        for rank, store in enumerate(self._copies(url)):
            info = store.latest()
            if info is not None:
                found.append(((-info.step, rank), store, info))
        return [(store, info) for _, store, info in sorted(found, key=lambda f: f[0])]

    def _restore_from(self, url: str, state: Any, step: int | None) -> int:
        copies = self._newest_copies(url)
        if not copies:
            _refuse_foreign(url, self.storage_options)
            raise CheckpointNotFoundError(
                f"no committed checkpoint at {url}; give a folder written by "
                "PreemptibleAccelerator.save_state, or no input_dir for the newest one"
            )
        store, latest = copies[0]
        self._check_processes(url, latest)
        restored = store.restore(state, step=latest.step if step is None else step)
        assert restored is not None, "restore with a step raises rather than return None"
        self.restored_url = store.url
        return restored

    def _check_processes(self, url: str, info: CheckpointInfo) -> None:
        if info.world_size != self.processes:
            cpu = "ACCELERATE_USE_CPU=1 " if not torch.cuda.is_available() else ""
            raise ConfigError(
                f"{url} was saved by {info.world_size} process"
                f"{'es' if info.world_size > 1 else ''}, this run has {self.processes}: each "
                "process's data position and RNG states belong to its rank and would not "
                f"continue the same run. Resume with {info.world_size}: {cpu}accelerate launch "
                f"{'--multi_gpu ' if info.world_size > 1 else ''}--num_processes "
                f"{info.world_size} ... (the same command as the run that saved it)"
            )

    def list(self) -> list[CheckpointInfo]:
        return [info for _, url in self._folders() for info in self._copies(url)[-1].list()]


_END = object()


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _gens(loader: Any) -> list[torch.Generator]:
    """The generators a prepared loader draws its order from, each once."""
    found: list[torch.Generator] = []
    for candidate in (
        getattr(loader, "synchronized_generator", None),
        getattr(get_sampler(loader), "generator", None),
        getattr(loader, "generator", None),
    ):
        if isinstance(candidate, torch.Generator) and all(candidate is not g for g in found):
            found.append(candidate)
    return found


def _rng_states(loader: Any) -> dict[str, Any]:
    return {"global": RNGState().state_dict(), "loader": [g.get_state() for g in _gens(loader)]}


def _load_rng_states(loader: Any, states: dict[str, Any]) -> None:
    RNGState().load_state_dict(states["global"])
    for generator, rng in zip(_gens(loader), states["loader"], strict=True):
        generator.set_state(rng)


def _none_valid(
    root: str, corrupt: list[tuple[str, NoValidCheckpointError]]
) -> NoValidCheckpointError:
    """Every committed ``checkpoint_{i}`` failed: which steps, why, and how to start over."""
    steps = [s for _, e in corrupt for s in e.steps]
    problems = [f"{url}: {p}" for url, e in corrupt for p in e.problems]
    listed = "".join(f"\n  {p}" for p in problems)
    return NoValidCheckpointError(
        f"every committed checkpoint folder under {root} fails verification (steps "
        f"{', '.join(map(str, steps))}), so none was restored and nothing was changed:{listed}\n"
        "`preemptible ckpt verify FOLDER` shows each one. To start over from step 0, move "
        'those folders away, or pass on_no_valid_checkpoint="start_over" to '
        "PreemptibleAccelerator",
        steps=steps,
        problems=problems,
    )


def _check_one_node(processes: int) -> None:
    """Refuse ``local=`` on several nodes now, not at the first save (which may be a notice's):
    the processes of a two-tier save share one local folder. The first save checks the rest
    (one host, one folder) across the processes."""
    per_node = local_world_size()
    if per_node is not None and per_node < processes:
        raise ConfigError(
            f"local= needs every process on one node, but this run has {processes} processes "
            f"with {per_node} per node (LOCAL_WORLD_SIZE): the processes of a save share one "
            "local folder, which processes on other nodes cannot write. Run on one node "
            "(--num_machines=1), or drop local= and save to the checkpoint folder directly"
        )


def _check_launched_alone(processes: int) -> None:
    """Refuse a process that its launcher started as one of several but whose Accelerator runs
    alone: each of them would train the whole run by itself, and all would write to the same
    checkpoint folder. ``accelerate launch --multi_gpu`` does that on a machine without GPUs
    (torchrun starts the processes, but Accelerate picks no CPU back end unless asked)."""
    launched = os.environ.get("WORLD_SIZE", "")
    if not launched.isdigit() or int(launched) <= processes:
        return
    raise ConfigError(
        f"this process was started as one of {launched} (WORLD_SIZE={launched}), but its "
        f"Accelerator runs {processes} process{'es' if processes > 1 else ''}: each would "
        "train alone and write over the others' checkpoints. Without GPUs, Accelerate uses "
        "several CPU processes only when asked: run ACCELERATE_USE_CPU=1 accelerate launch "
        f"--multi_gpu --num_processes {launched} ..., or build Accelerator(cpu=True)"
    )


def _check_distributed_type(accelerator: Any) -> None:
    kind = accelerator.distributed_type
    if any(kind == getattr(DistributedType, name, None) for name in _UNSUPPORTED):
        raise ConfigError(
            f"PreemptibleAccelerator does not support {kind} yet: its state is sharded or owned "
            "by the engine, which saves it with its own format. Use DDP (multi-GPU or "
            "multi-CPU) or one process"
        )


def _checkpoint_root(config: Any, checkpoint_dir: str | os.PathLike[str] | None) -> str:
    if checkpoint_dir is not None:
        return os.fspath(checkpoint_dir)
    if config.automatic_checkpoint_naming and config.project_dir:
        return os.path.join(config.project_dir, "checkpoints")
    raise ConfigError(
        "PreemptibleAccelerator needs a place for its checkpoints: pass checkpoint_dir=..., or "
        "give the Accelerator ProjectConfiguration(project_dir=..., "
        "automatic_checkpoint_naming=True)"
    )


def _total_limit(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"ProjectConfiguration.total_limit must be a positive integer or None (keep all), "
            f"got {value!r}"
        )
    return value


def _no_engine_options(method: str, options: dict[str, Any]) -> None:
    if options:
        raise ConfigError(
            f"{method}() got {', '.join(sorted(options))}: options for the engine's own save "
            "(DeepSpeed, Megatron-LM) or map_location, which PreemptibleAccelerator does not "
            "take: tensors are loaded in place, onto the device they live on"
        )


def _names(url: str, storage_options: dict[str, Any]) -> list[str]:
    """The names directly under ``url`` (none if it does not exist)."""
    fs, path = fsspec.core.url_to_fs(url, **storage_options)
    try:
        return [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []


def _refuse_foreign(url: str, storage_options: dict[str, Any]) -> None:
    if any(_ACCELERATE_FILES.match(n) for n in _names(url, storage_options)):
        raise CheckpointFormatError(
            f"{url} was written by Accelerate's own save_state (pickle files); it is not read, "
            "since loading it would unpickle it. If you trust it, load it once with "
            "accelerate.Accelerator.load_state(accelerator, path), then save_state() again"
        )
