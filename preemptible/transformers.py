"""Hugging Face Trainer adapter: the Trainer's checkpoints on our atomic store, a save on notice.

`TrainerPreemptionCallback(trainer)` is the one object (`docs/ways-in/transformers.md`):

- Every checkpoint the Trainer makes (``save_steps``, ``save_strategy``, the last step) and the
  one a notice asks for go to a `Checkpointer` root instead of ``checkpoint-N`` folders: atomic
  commit, checksums, any fsspec URL, nothing pickled. The save is made where the Trainer saves
  (``Trainer._save_checkpoint``, after the step's logging and evaluation, which may draw random
  numbers), so a checkpoint holds what the Trainer's own would hold at that moment: weights,
  optimizer, scheduler, scaler, trainer state and callback states, and each rank's RNG states.
- At each step end the ranks agree on a notice (SIGTERM, SIGUSR1, SIGINT, the queue manager's,
  a cloud's); on one they save at that step's save point and exit with ``128 + signum``.
  Underneath, a `Context` does the notice handling, the agreement, the last save's plan, the
  exit, the cost file, the reporters and the queue manager's link: the decorator's own code.
- ``trainer.train(resume_from_checkpoint=callback.resume_path())`` resumes exactly.

Why the resume goes through ``resume_from_checkpoint``: ``Trainer.train`` keeps the data
position in local variables computed from it (the epochs and batches to skip), restores the RNG
states at the moment its loop needs them (after the first batches of a resumed epoch are
fetched), and rebuilds stateful callbacks from its ``trainer_state.json``. A callback cannot
reach any of that, and re-implementing it would follow every release. So `resume_path` restores
the newest valid checkpoint from the store (verified, falling back past corrupt ones, all ranks
agreeing on the step), writes its ``trainer_state.json`` into a folder private to the process,
and returns that folder; the Trainer's loaders (``_load_from_checkpoint``,
``_load_optimizer_and_scheduler``, ``_load_scaler``, ``_load_rng_state``), given that folder,
load the restored state in place, from memory, at the moments the Trainer calls them. Nothing is
pickled or unpickled, and no second copy of the state is written to disk. Rejected: writing a
whole Trainer checkpoint folder for the Trainer to read (a second copy of the state on disk per
process, and pickles), a ``Trainer`` subclass (it does not compose with ``SFTTrainer`` and the
like), and keeping the Trainer's own folder as bytes in the store (pickles in the store, a second
write on the notice's save).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import warnings
from typing import Any, NoReturn

import torch

from preemptible import (
    BackendNotInstalledError,
    Checkpointer,
    ConfigError,
    Context,
    PreemptibleWarning,
    RNGState,
    StateMismatchError,
    announce,
    forget_process_groups,
)

try:
    from transformers import Trainer, TrainerCallback
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_callback import ExportableState
    from transformers.trainer_utils import HubStrategy, SaveStrategy
    from transformers.training_args import ParallelMode
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise BackendNotInstalledError(
        "preemptible.transformers needs transformers: pip install 'preemptible[transformers]'",
        extra="transformers",
    ) from error

__all__ = ["TrainerPreemptionCallback"]

log = logging.getLogger("preemptible")

_FOLDER_PREFIX = ".preemptible-resume-"
_DEVICES = ("cpu", "cuda", "mps")  # the ones whose RNG state the Trainer saves as we do
# The Trainer's save point and resume loaders, which the callback takes over on its trainer.
_TAKEN = ("_save_checkpoint", "_load_from_checkpoint", "_load_optimizer_and_scheduler",
          "_load_scaler", "_load_rng_state")  # fmt: skip


class TrainerPreemptionCallback(TrainerCallback):
    """The Trainer's checkpoints on the atomic store, a save on notice, an exact resume.

    Made after the Trainer, which it joins as a callback:

        trainer = Trainer(model=model, args=args, train_dataset=train)
        preemption = TrainerPreemptionCallback(trainer, "s3://bucket/run1/ckpt")
        trainer.train(resume_from_checkpoint=preemption.resume_path())

    Every process runs the same lines. The Trainer's saves go to ``dirpath`` (``save_steps`` and
    ``save_strategy`` decide when, ``save_total_limit`` how many are kept; no ``checkpoint-N``
    folder is written), and a notice saves at the end of the step in progress and exits.

    Args:
        trainer: the ``transformers.Trainer`` (or a subclass) to make preemptible.
        dirpath: the checkpoint root, a path or fsspec URL; default ``output_dir/preemptible``.
        storage_options: fsspec options (credentials, ``endpoint_url``).
        exit_code: exit code after a notice's save (default ``128 + signum``).
        signals: the notices to handle (default SIGTERM, SIGUSR1, SIGINT).
        cost_file: where to write measured costs (default ``$PREEMPTIBLE_COST_FILE``).
        on_no_valid_checkpoint: when checkpoints exist and every one fails verification:
            ``"fail"`` (the default) raises `NoValidCheckpointError`, which names them;
            ``"start_over"`` moves them aside and `resume_path` returns None.

    Raises:
        ConfigError: a setting this adapter replaces or cannot honour: ``enable_jit_checkpoint``,
            ``load_best_model_at_end`` or ``save_strategy="best"``, a ``hub_strategy`` that
            pushes checkpoint folders, ``auto_find_batch_size``, DeepSpeed, FSDP, SageMaker or
            XLA, a device other than the CPU, CUDA or MPS, torch.distributed without DDP; a
            second callback on the same Trainer; an unknown ``on_no_valid_checkpoint``.
    """

    def __init__(
        self,
        trainer: Any,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        exit_code: int | None = None,
        signals: tuple[int, ...] | None = None,
        cost_file: str | os.PathLike[str] | None = None,
        on_no_valid_checkpoint: str = "fail",
    ) -> None:
        _check_trainer(trainer)
        if on_no_valid_checkpoint not in ("fail", "start_over"):
            raise ConfigError(
                f"on_no_valid_checkpoint must be 'fail' or 'start_over', got "
                f"{on_no_valid_checkpoint!r}"
            )
        args = trainer.args
        self.trainer = trainer
        self.dirpath = (
            os.path.join(args.output_dir, "preemptible") if dirpath is None else os.fspath(dirpath)
        )
        self.store = _CPUStore(
            self.dirpath, keep=_keep(args.save_total_limit), storage_options=storage_options
        )
        self._options: dict[str, Any] = {
            "exit_code": exit_code,
            "cost_file": cost_file,
            "on_no_valid_checkpoint": on_no_valid_checkpoint,
        }
        if signals is not None:
            self._options["signals"] = tuple(signals)
        self._context: Context | None = None
        self._stopping = False
        self._last_saved: int | None = None
        self._folder: str | None = None  # on disk until the Trainer has read it
        self._resume_from: str | None = None  # its path, which the Trainer's loaders are given
        self._resumed: dict[str, Any] | None = None  # the restored state, until it is loaded
        self._originals = {name: getattr(trainer, name) for name in _TAKEN}
        trainer._save_checkpoint = self._save_checkpoint
        trainer._load_from_checkpoint = self._load_weights
        trainer._load_optimizer_and_scheduler = self._load_optimizer_and_scheduler
        trainer._load_scaler = self._load_scaler
        trainer._load_rng_state = self._load_rng_state
        trainer.add_callback(self)

    @property
    def context(self) -> Context | None:
        """The `Context` underneath while training (from `resume_path` or the start of
        ``train`` to its end): its ``guard`` (``guard.request(reason)`` is a notice, as the
        queue manager's), ``cost`` and ``should_stop``; None otherwise."""
        return self._context

    # --- resuming ---------------------------------------------------------------------------

    def resume_path(self) -> str | None:
        """The newest valid checkpoint, as a folder for ``train(resume_from_checkpoint=...)``.

        Every process calls it, after the Trainer is made and right before ``train``. It starts
        the notice handling, restores the newest checkpoint that verifies (a corrupt one is
        skipped, with a `PreemptibleWarning`, for the one before it; all ranks agree on the
        step), keeps it in memory (on the CPU) for the Trainer to load in place, and writes its
        ``trainer_state.json`` into a folder private to this process, deleted once the Trainer
        has read it. A resume says "resuming from URL at step N" on stderr (`announce`).

        Returns:
            The folder, or None when there is no checkpoint yet (the first run).

        Raises:
            NoValidCheckpointError: checkpoints exist and every one fails verification (unless
                ``on_no_valid_checkpoint="start_over"``).
            ConfigError: the checkpoint was saved by another number of processes.
        """
        if self._context is not None:  # asked twice: the same answer
            return self._resume_from
        context = self._start()
        if context.resumed_from is not None and "shared" not in (self._resumed or {}):
            # Not rank 0: rank 0's part holds the state the ranks share.
            try:
                loaded = self.store.load(context.resumed_from, rank=0, map_location="cpu")
                loaded = loaded["trainer"]["shared"]
                assert self._resumed is not None, "set by the restore that just ran"
                self._resumed["shared"] = loaded
                self._write_folder(loaded["trainer_state"])
            except BaseException:
                self._close()
                raise
        if context.resumed_from is not None and self.trainer.args.process_index == 0:
            announce("resuming from %s at step %d", context.resumed_url, context.resumed_from)
        return self._folder

    def _start(self) -> Context:
        context = Context(checkpointer=self.store, async_save=False, **self._options)
        context.register(trainer=_TrainerState(self))
        self._context = context
        try:
            context.start()  # the guard, the queue link, the restore (all ranks agreeing)
        except BaseException:
            self._close()  # the signal handlers go with the failed start
            raise
        return context

    def _restored(self, state: dict[str, Any]) -> None:
        """Keep one rank's part of the checkpoint being restored, for the Trainer's loaders;
        rank 0's holds the state the ranks share."""
        saved, now = int(state["world_size"]), int(self.trainer.args.world_size)
        if saved != now:
            raise ConfigError(
                f"the checkpoint at step {state['step']} under {self.dirpath} was saved by "
                f"{saved} processes, this run has {now}: each process's RNG states and the "
                f"Trainer's data position belong to that number. Resume with {saved} processes"
            )
        self._resumed = state
        if "shared" in state:
            self._write_folder(state["shared"]["trainer_state"])

    def _write_folder(self, trainer_state: str) -> None:
        """The folder ``resume_from_checkpoint`` names: ``trainer_state.json``, which the
        Trainer reads itself; the rest it loads through the loaders below, from memory."""
        self._remove_folder()
        output_dir = self.trainer.args.output_dir
        os.makedirs(output_dir, exist_ok=True)
        self._folder = os.path.abspath(tempfile.mkdtemp(prefix=_FOLDER_PREFIX, dir=output_dir))
        self._resume_from = self._folder
        with open(os.path.join(self._folder, TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
            f.write(trainer_state)

    def _ours(self, checkpoint: str | None) -> bool:
        """Whether ``checkpoint`` is the folder `resume_path` returned."""
        return checkpoint is not None and os.path.abspath(checkpoint) == self._resume_from

    def _shared(self, checkpoint: str | None) -> dict[str, Any] | None:
        """The restored state the ranks share, if ``checkpoint`` is this callback's folder."""
        if not self._ours(checkpoint):
            return None
        assert self._resumed is not None, "the folder is written from a restored state"
        shared: dict[str, Any] = self._resumed["shared"]
        return shared

    # --- the Trainer's loaders, given the folder of `resume_path` ------------------------------

    def _load_weights(self, checkpoint: str, model: Any = None) -> None:
        shared = self._shared(checkpoint)
        if shared is None:  # a checkpoint-N folder of the Trainer's own
            self._originals["_load_from_checkpoint"](checkpoint, model)
            return
        weights = dict(shared["model"])
        for alias, source in shared["tied"].items():
            weights[alias] = weights[source]
        target = self.trainer.model if model is None else model
        result = target.load_state_dict(weights, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise StateMismatchError(
                f"the checkpoint under {self.dirpath} holds another model: missing "
                f"{result.missing_keys}, unexpected {result.unexpected_keys}"
            )

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        shared = self._shared(checkpoint)
        if shared is None:
            self._originals["_load_optimizer_and_scheduler"](checkpoint)
            return
        self.trainer.optimizer.load_state_dict(shared["optimizer"])
        self.trainer.lr_scheduler.load_state_dict(shared["scheduler"])

    def _load_scaler(self, checkpoint: str | None) -> None:
        shared = self._shared(checkpoint)
        if shared is None:
            self._originals["_load_scaler"](checkpoint)
            return
        scaler = getattr(self.trainer.accelerator, "scaler", None)
        if scaler is not None and "scaler" in shared:
            scaler.load_state_dict(shared["scaler"])

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if not self._ours(checkpoint):
            self._originals["_load_rng_state"](checkpoint)
            return
        if self._resumed is not None:  # the Trainer loads them once, at its loop's moment
            RNGState().load_state_dict(self._resumed["rng"])
            self._resumed = None

    def _remove_folder(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    # --- the Trainer's hooks ------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if getattr(self.trainer, "hp_search_backend", None) is not None:
            self._close()
            raise ConfigError(
                "TrainerPreemptionCallback does not support hyperparameter_search: each trial "
                "would resume from the others' checkpoints"
            )
        if self._context is None:
            if self.store.latest() is not None:
                raise ConfigError(
                    f"checkpoints exist under {self.dirpath}, but train() was not given "
                    "resume_from_checkpoint=preemption.resume_path(): training again from where "
                    "the Trainer starts would mix two runs in one root. Pass it, or give "
                    "TrainerPreemptionCallback another dirpath"
                )
            self._start()
        context = self._context
        assert context is not None, "started above or by resume_path"
        resumed = context.resumed_from
        if resumed is not None and state.global_step != resumed:
            self._close()
            raise ConfigError(
                f"resume_path() restored step {resumed}, but the Trainer starts at step "
                f"{state.global_step}: pass its folder to train(resume_from_checkpoint=...)"
            )
        if resumed is not None and 0 < state.max_steps <= state.global_step:
            self._close()
            self._end_process_group()
            context.already_complete(resumed, f"max_steps is {state.max_steps}")
        self._remove_folder()  # read: trainer_state.json, by now the only file the Trainer reads
        if self._resumed is not None:
            self._resumed.pop("shared", None)  # loaded: only the RNG states wait for their moment

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stopping:  # the step's save point did not save (a Trainer that skipped it)
            self._stop(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # One small all-reduce per step: any rank's notice stops every rank at this step. The
        # save waits for the step's save point, after its logging and evaluation.
        assert self._context is not None, "started at on_train_begin"
        if self._context.agree(state.global_step):
            self._stopping = True
            control.should_save = True

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stopping:
            self._stop(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stopping:
            self._stop(state.global_step)
        self._close()

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """In place of ``Trainer._save_checkpoint``: save to the store, on a notice then exit."""
        if self._context is None:
            raise ConfigError(
                "the Trainer saved outside train(); TrainerPreemptionCallback saves during training"
            )
        if trial is None:
            self.trainer.store_flos()  # as the Trainer's own save does first
        step = int(self.trainer.state.global_step)
        if self._stopping:
            self._stop(step)
        if self._last_saved != step:  # once per step, however many save points ask
            self._context.save(step)
            self._last_saved = step

    def _stop(self, step: int) -> NoReturn:
        """Save ``step`` (unless it is saved already) and exit with the notice's code; the
        `Context` says so, with the notice, the step and the root."""
        context = self._context
        assert context is not None, "a notice is agreed on during training only"
        try:
            context.stop(step)
        except SystemExit:
            self._close()
            self._end_process_group()
            raise

    def _close(self) -> None:
        """End this ``train()``'s run: wait for saves, remove the handlers; a later ``train()``
        starts afresh.

        The gloo groups of the agreement and the saves are let go too, so that the script's
        ``destroy_process_group`` (``accelerator.end_training()``) ends them at once: held until
        the interpreter's teardown, a gloo group's threads may abort the process there (SIGABRT,
        exit -6), which torchrun reports as a failed run.
        """
        self._remove_folder()
        self._resumed = self._resume_from = None
        context, self._context = self._context, None
        self._stopping = False
        if context is not None:
            context.close()
        forget_process_groups()

    def _end_process_group(self) -> None:
        """Destroy the process group before an exit that skips the end of the script: a process
        that exits with its gloo group alive may abort (SIGABRT) in the interpreter's teardown."""
        try:
            self.trainer.accelerator.state.destroy_process_group()
        except Exception as e:  # the exit code matters more than a clean teardown
            log.warning("could not destroy the process group before exiting: %r", e)
        forget_process_groups()


class _CPUStore(Checkpointer):
    """The store, restoring onto the CPU: the state waits in memory for the Trainer's loaders,
    which move it where the live state is, as the Trainer's own loads from disk do. Restored
    onto the GPU it came from, it would sit there beside the model until then."""

    def restore(
        self, state: Any, step: int | None = None, *, map_location: Any = None
    ) -> int | None:
        return super().restore(state, step, map_location=map_location or "cpu")


class _TrainerState:
    """The Trainer's whole state as the one object the `Context` saves and restores.

    Rank 0 saves what every rank holds alike (weights, optimizer, scheduler, scaler, trainer
    state), as the Trainer does; every rank saves its own RNG states. ``load_state_dict`` hands
    each rank's part to the callback, which keeps it for the Trainer's loaders.
    """

    def __init__(self, owner: TrainerPreemptionCallback) -> None:
        self.owner = owner

    def state_dict(self) -> dict[str, Any]:
        trainer = self.owner.trainer
        args = trainer.args
        state: dict[str, Any] = {
            "step": int(trainer.state.global_step),
            "world_size": int(args.world_size),
            "rng": RNGState().state_dict(),
        }
        if args.process_index == 0:
            weights, tied = _untied(trainer.model.state_dict())
            shared = {
                "model": weights,
                "tied": tied,
                "optimizer": trainer.optimizer.state_dict(),
                "scheduler": trainer.lr_scheduler.state_dict(),
                "trainer_state": _trainer_state_json(trainer),
            }
            scaler = getattr(trainer.accelerator, "scaler", None)
            if scaler is not None:
                shared["scaler"] = scaler.state_dict()
            state["shared"] = shared
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.owner._restored(state)


def _untied(weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The weights without the second names of tied ones (GPT-2's output layer is its input
    embedding: saving it twice would double the largest tensor), and the names dropped, each
    with the name it is kept under."""
    kept: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, tensor in weights.items():
        view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.dtype,
                tuple(tensor.shape), tuple(tensor.stride()), tensor.device)  # fmt: skip
        if view in seen and tensor.numel():
            tied[name] = seen[view]
        else:
            seen[view] = name
            kept[name] = tensor
    return kept, tied


def _trainer_state_json(trainer: Any) -> str:
    """``trainer_state.json`` as ``Trainer._save_checkpoint`` writes it now, with the states of
    the stateful callbacks (early stopping's patience, the control flags) taken now."""
    state = dataclasses.asdict(trainer.state)
    callbacks = [
        cb
        for cb in [*trainer.callback_handler.callbacks, trainer.control]
        if isinstance(cb, ExportableState)
    ]
    exported: dict[str, Any] = {}
    for cb in callbacks:
        name = type(cb).__name__
        if name not in exported:
            exported[name] = cb.state()
        elif isinstance(exported[name], list):
            exported[name].append(cb.state())
        else:
            exported[name] = [exported[name], cb.state()]
    state["stateful_callbacks"] = exported
    return json.dumps(state, indent=2, sort_keys=True) + "\n"


def _keep(save_total_limit: Any) -> int | None:
    if save_total_limit is None:
        return None
    if not isinstance(save_total_limit, int) or save_total_limit < 1:
        raise ConfigError(
            f"save_total_limit must be a positive integer or None (keep all), got "
            f"{save_total_limit!r}"
        )
    return save_total_limit


def _check_trainer(trainer: Any) -> None:
    """Refuse what the callback replaces or cannot honour, saying what to change."""
    if not isinstance(trainer, Trainer):
        raise ConfigError(
            f"TrainerPreemptionCallback takes the transformers.Trainer to make preemptible, got "
            f"{type(trainer).__name__}: TrainerPreemptionCallback(trainer, dirpath)"
        )
    if any(isinstance(cb, TrainerPreemptionCallback) for cb in trainer.callback_handler.callbacks):
        raise ConfigError("this Trainer has a TrainerPreemptionCallback already; one is enough")
    args = trainer.args
    if args.enable_jit_checkpoint:
        raise ConfigError(
            "enable_jit_checkpoint=True and TrainerPreemptionCallback both save on SIGTERM; the "
            "callback replaces it (every rank agreeing on the step, an atomic and checksummed "
            "save at the end of the step, no fixed wait). Set enable_jit_checkpoint=False"
        )
    if args.load_best_model_at_end or args.save_strategy == SaveStrategy.BEST:
        raise ConfigError(
            "load_best_model_at_end and save_strategy='best' read the best model back from the "
            "Trainer's own checkpoint-N folder, which TrainerPreemptionCallback replaces with its "
            "store; save the best model yourself (an evaluation callback), or drop them"
        )
    if args.push_to_hub and args.hub_strategy != HubStrategy.END:
        raise ConfigError(
            f"hub_strategy={HubStrategy(args.hub_strategy).value!r} pushes the Trainer's "
            "checkpoint-N folders, which TrainerPreemptionCallback replaces with its store; use "
            "hub_strategy='end'"
        )
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        raise ConfigError(
            "TrainerPreemptionCallback does not support DeepSpeed or FSDP yet: their state is "
            "sharded and saved by the engine in its own format. Use DDP or one process"
        )
    if args.parallel_mode not in (
        ParallelMode.NOT_PARALLEL,
        ParallelMode.NOT_DISTRIBUTED,
        ParallelMode.DISTRIBUTED,
    ):
        raise ConfigError(
            f"TrainerPreemptionCallback does not support {args.parallel_mode.value} training; use "
            "DDP or one process"
        )
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise ConfigError(
            f"torch.distributed is initialized but the Trainer does not run DDP (parallel mode "
            f"{args.parallel_mode.value}): each process would train alone. On CPUs, pass "
            "use_cpu=True to TrainingArguments"
        )
    if args.device.type not in _DEVICES:
        raise ConfigError(
            f"TrainerPreemptionCallback saves the RNG states of the CPU and CUDA, not of "
            f"{args.device.type}; run on CPU or CUDA"
        )
    missing = [name for name in _TAKEN if not callable(getattr(trainer, name, None))]
    if missing:
        raise ConfigError(
            f"this transformers version has no Trainer.{', Trainer.'.join(missing)}, which "
            "TrainerPreemptionCallback takes over (the save point and the resume's loaders); "
            "use transformers 5.0 or newer"
        )
    if args.auto_find_batch_size:
        raise ConfigError(
            "auto_find_batch_size=True may change the batch size between a run and its resume, "
            "which then trains on other batches; set per_device_train_batch_size yourself"
        )
    if not getattr(args.accelerator_config, "use_seedable_sampler", True):
        warnings.warn(
            "use_seedable_sampler=False: the order of a resumed epoch is drawn afresh, so a "
            "resumed run trains on other batches than an uninterrupted one would",
            PreemptibleWarning,
            stacklevel=3,
        )
