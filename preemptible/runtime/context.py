"""`Context` and the `@preemptible` decorator: a training loop that survives preemption.

The loop body stays the user's; the context acts only at step boundaries, where the state is
consistent:

1. When ``steps()`` starts: install the guard, restore the newest valid checkpoint (after the
   user's ``register`` calls and seeding, so restored RNG states win), continue at ``step + 1``;
   if that was the last step, exit 0 at once (`AlreadyComplete`). Committed checkpoints that
   all fail verification stop the job (`NoValidCheckpointError`) unless it asks to start over.
2. After each step: agree with the other ranks (one small all-reduce) on "stop?" and "save?".
3. On a notice: wait for a save in flight, save synchronously, report, exit ``128 + signum``.
   Under the queue manager the notice may come from its notice endpoint before the signal,
   and the job tells the manager it is exiting once the save has committed (`queue_link`);
   in a cloud, from its metadata server (`notices`), and Azure is told once it has committed.
   A resize notice is handled the same way (`resize_to` says the new size); the manager
   restarts the job at that size, and the restore continues it there.
4. On periodic saves: save in the background (or not, ``async_save=False``).
5. When the loop ends: a final save; the decorated function's result is returned.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, ParamSpec, TypeVar

from preemptible._env_names import COST_FILE_ENV, NOTICES_ENV
from preemptible.checkpoint import CheckpointCost, Checkpointer
from preemptible.errors import ConfigError, NoValidCheckpointError, PreemptibleError
from preemptible.runtime.cost_file import write_cost_file
from preemptible.runtime.deadline import GRACE_SAFETY, GraceCheck
from preemptible.runtime.elastic import StepAgreement
from preemptible.runtime.env import RunEnv, check_signal_setup
from preemptible.runtime.interval import SaveSchedule
from preemptible.runtime.last_save import LAST_SAVE_ORDER, LastSave, LastSavePlan, plan_last_save
from preemptible.runtime.notices import CloudNotices, parse_notices
from preemptible.runtime.queue_link import NoticeKind, QueueLink, QueueNotice, Terms
from preemptible.runtime.reporters import Reporters
from preemptible.runtime.reporters import from_env as reporters_from_env
from preemptible.runtime.rng import RNGState
from preemptible.runtime.signals import DEFAULT_SIGNALS, PreemptionGuard

log = logging.getLogger("preemptible")

RESERVED_KEY = "_preemptible"

P = ParamSpec("P")
R = TypeVar("R")

ON_NO_VALID_CHECKPOINT = ("fail", "start_over")


class AlreadyComplete(SystemExit):
    """The restored checkpoint is the loop's last step: there is nothing left to run.

    Raised by `Context.steps` (and the adapters' loops) when a finished job is started again,
    after the SDK has logged "already complete at step N". It is a `SystemExit` with status 0,
    so the program ends successfully without running the code after its loop (which would see
    no step run). Catch it to run that code anyway.
    """

    def __init__(self, step: int, detail: str = "") -> None:
        super().__init__(0)
        self.step = step
        self.message = f"already complete at step {step}" + (f": {detail}" if detail else "")


class Context:
    """What a preemptible training function gets: registration, steps, and the save machinery.

    Args:
        checkpoint_dir: checkpoint root (local path or fsspec URL).
        every_steps: save after every N completed steps.
        every_seconds: save when this long has passed since the last save.
        interval: ``"auto"`` for the Young/Daly interval ``sqrt(2 C M)`` (see `interval`).
        keep: checkpoints to keep.
        async_save: periodic saves run in the background; notice saves are always synchronous.
        exit_code: exit code after a notice save (default ``128 + signum``).
        mtbf_seconds: mean time between preemptions for ``interval="auto"``.
        signals: the notices to handle.
        notices: the clouds whose metadata servers to watch for preemption notices:
            ``"aws,gcp,azure"`` (or a list), ``"auto"`` or ``"none"``; default
            ``$PREEMPTIBLE_NOTICES``, else none. Polled on local rank 0 (one poller per node);
            see `preemptible.runtime.notices`.
        storage_options: fsspec options for the checkpoint root.
        cost_file: where to write measured costs (default ``$PREEMPTIBLE_COST_FILE``).
        checkpointer: use this `Checkpointer` instead of building one.
        queue_link: the link to the queue manager; default: the one its variables describe
            (``$PREEMPTIBLE_QUEUE_URL``...), on rank 0 only, or none.
        reporters: where else the cost goes (pod annotations, SLURM comment, Prometheus);
            default: what the environment offers (`preemptible.runtime.reporters.from_env`),
            rank 0 only.
        grace_safety: warn when the grace period is shorter than this many saves (p95), at
            start and after each save, saying which setting to change.
        on_no_valid_checkpoint: when committed checkpoints exist but every one fails
            verification: ``"fail"`` (the default) raises `NoValidCheckpointError`, which names
            them; ``"start_over"`` moves them aside with a warning and starts at step 0.
        local: a local directory for a faster first tier: saves commit there and are uploaded
            to ``checkpoint_dir`` in the background (`Checkpointer`'s ``local``).
        local_keep: how many checkpoints the local tier keeps.
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        *,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        interval: str | None = None,
        keep: int | None = 3,
        async_save: bool = True,
        exit_code: int | None = None,
        mtbf_seconds: float | None = None,
        signals: tuple[int, ...] = DEFAULT_SIGNALS,
        notices: str | Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        cost_file: str | os.PathLike[str] | None = None,
        checkpointer: Checkpointer | None = None,
        queue_link: QueueLink | None = None,
        reporters: Reporters | None = None,
        grace_safety: float = GRACE_SAFETY,
        on_no_valid_checkpoint: str = "fail",
        local: str | os.PathLike[str] | None = None,
        local_keep: int = 2,
    ):
        if interval not in (None, "auto"):
            raise ConfigError(f"interval must be None or 'auto', got {interval!r}")
        if on_no_valid_checkpoint not in ON_NO_VALID_CHECKPOINT:
            raise ConfigError(
                f"on_no_valid_checkpoint must be 'fail' or 'start_over', got "
                f"{on_no_valid_checkpoint!r}"
            )
        self.on_no_valid_checkpoint = on_no_valid_checkpoint
        if checkpointer is None:
            if checkpoint_dir is None:
                raise ConfigError("give a checkpoint_dir (or a Checkpointer)")
            checkpointer = Checkpointer(
                checkpoint_dir,
                keep=keep,
                storage_options=storage_options,
                local=local,
                local_keep=local_keep,
            )
        self.checkpointer = checkpointer
        self.schedule = SaveSchedule(
            every_steps=every_steps,
            every_seconds=every_seconds,
            auto=interval == "auto",
            mtbf_seconds=mtbf_seconds,
        )
        self.async_save = async_save
        self.guard = PreemptionGuard(signals)
        self.run_env = RunEnv.from_env()
        if queue_link is None and self.run_env.rank == 0:
            queue_link = QueueLink.from_env(os.environ)
        self.queue_link = queue_link
        selection = parse_notices(notices if notices is not None else os.environ.get(NOTICES_ENV))
        self.cloud_notices: CloudNotices | None = None
        if selection and self.run_env.local_rank == 0:
            self.cloud_notices = CloudNotices(selection, os.environ)
        if reporters is None and self.run_env.rank == 0:
            reporters = reporters_from_env(os.environ)
        self.reporters = reporters
        self.resumed_from: int | None = None
        self.resumed_url: str | None = None
        self.restore_seconds: float | None = None
        self.step: int | None = None
        self._exit_code = exit_code
        self._cost_file = cost_file or os.environ.get(COST_FILE_ENV)
        self._registered: dict[str, Any] = {}
        self._rng = RNGState()
        self._agreement = StepAgreement()
        self._last_saved_step: int | None = None
        self._last_save_at = time.monotonic()
        self._save_requested = False
        self._unreported: Any = None  # a background save whose cost is not reported yet
        self._should_stop = False
        self._resize_heard: int | None = None  # set by the notice watcher (rank 0)
        self._resize_to: int | None = None  # agreed by all ranks at the stop
        self._started = False
        self._in_step = False
        self._warned_setup = False
        self._grace_check = GraceCheck(grace_safety)

    # --- registration and state ---------------------------------------------------------------

    def register(self, **stateful: Any) -> None:
        """Add objects to checkpoint: anything with state_dict/load_state_dict, tensors, dicts."""
        if self._started:
            raise ConfigError("register() must be called before steps() starts")
        for name in stateful:
            if name == RESERVED_KEY:
                raise ConfigError(f"{RESERVED_KEY!r} is reserved for preemptible's own state")
        self._registered.update(stateful)

    def _state(self) -> dict[str, Any]:
        return {**self._registered, RESERVED_KEY: {"rng": self._rng}}

    @property
    def should_stop(self) -> bool:
        """True once all ranks have agreed to stop at this step boundary."""
        return self._should_stop

    @property
    def resize_to(self) -> int | None:
        """The world size the queue manager asked for, once all ranks have agreed to stop for a
        resize notice (every rank sees it, at the step boundary where they stop); None
        otherwise. The job then saves and exits, and is restarted at that size."""
        return self._resize_to

    @property
    def cost(self) -> CheckpointCost:
        return self.checkpointer.cost

    @property
    def terms(self) -> Terms | None:
        """What the queue manager granted for this job's measured cost: grace, minimum runtime,
        interval hint (None without a manager, or before its first answer)."""
        return self.queue_link.terms if self.queue_link is not None else None

    def save_now(self) -> None:
        """Save at the end of the current step (between steps: save the last completed one now)."""
        if self.step is not None and self._in_step:
            self._save_requested = True
        elif self.step is not None:
            self._save(self.step, blocking=True)

    # --- the loop -----------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """Yield ``start .. total-1``, where ``start`` follows the restored checkpoint.

        Raises:
            AlreadyComplete: the restored checkpoint is step ``total - 1`` or later: the loop
                has nothing left to run (a finished job started again). It exits with status 0
                after logging "already complete at step N".
            NoValidCheckpointError: every committed checkpoint fails verification (see
                ``on_no_valid_checkpoint``).
        """
        if total < 0:
            raise ConfigError(f"total must be >= 0, got {total}")
        self._begin()
        start = 0 if self.resumed_from is None else self.resumed_from + 1
        if self.resumed_from is not None and start >= total:
            self.already_complete(self.resumed_from, f"the loop runs steps 0 to {total - 1}")
        for step in range(start, total):
            self.step = step
            self._in_step = True
            yield step
            self._in_step = False
            self._at_boundary(step)
        if self.step is not None:
            self._save_final(self.step)

    # --- for loops that steps() does not run (framework adapters) ----------------------------

    def start(self) -> int | None:
        """What `steps` does first, for a loop it does not run: install the guard, start the
        queue link, restore the newest checkpoint (all ranks agreeing on its step).

        Returns:
            The restored step (`resumed_from`), or None on a first run.

        Raises:
            ConfigError: already started (by this or by `steps`).
        """
        self._begin()
        return self.resumed_from

    def step_done(self, step: int) -> None:
        """Step ``step`` is complete: save if the schedule says so, or, once the ranks agree on
        a notice, checkpoint it and exit (``SystemExit``, as `steps` does). All ranks call it
        with the same step."""
        self.step = step
        self._at_boundary(step)

    def agree(self, step: int) -> bool:
        """`step_done` without the stop, for a framework that saves later in its step (after
        its logging and evaluation, which may draw random numbers): the ranks agree, a save
        the schedule asks for is made, and on a notice it returns True (`should_stop`) and
        does nothing more; the caller then calls `stop` at its save point. All ranks call it
        with the same step."""
        self.step = step
        return self._agreed_to_stop(step)

    def stop(self, step: int) -> NoReturn:
        """Checkpoint ``step`` and exit with the notice's code, as `step_done` does on a notice;
        called after `agree` returned True, on every rank.

        Raises:
            ConfigError: no notice was agreed on (`agree` did not return True).
        """
        if not self._should_stop:
            raise ConfigError("stop() follows an agree() that returned True")
        self.step = step
        self._stop(step)

    def already_complete(self, step: int, detail: str) -> NoReturn:
        """The restored checkpoint, at ``step``, is the last the loop needs (``detail`` says
        why): log "already complete at step N" (rank 0) and exit 0 by raising `AlreadyComplete`.
        `steps` calls it; a loop it does not run calls it where it finds nothing left to do."""
        where = f"the checkpoint at {self.resumed_url}" if self.resumed_url else "the checkpoint"
        done = AlreadyComplete(step, f"{where} ends the run ({detail}); nothing left to run")
        if self.run_env.rank == 0:
            log.warning("%s", done.message)
        raise done

    def save(self, step: int) -> None:
        """Checkpoint ``step`` now, blocking, and report what it cost."""
        self.step = step
        self._save(step, blocking=True)

    def state(self) -> dict[str, Any]:
        """Everything a checkpoint holds: the registered objects and the RNG states."""
        return self._state()

    def report(self) -> None:
        """Send the measured cost to the cost file, the queue manager and the reporters now
        (after a save this Context did not make)."""
        self._report()

    def _begin(self) -> None:
        if self._started:
            raise ConfigError("steps() can run once per Context")
        self._started = True
        if not self.guard.installed:
            self.guard.install()
        if self.queue_link is not None:
            self.queue_link.start(on_notice=self._queue_notice, on_terms=self._queue_terms)
        if self.cloud_notices is not None:
            self.cloud_notices.start(self._cloud_notice)
        started = time.perf_counter()
        invalid: NoValidCheckpointError | None = None
        try:
            restored = self.checkpointer.restore(self._state())
        except NoValidCheckpointError as e:  # nothing was loaded; the ranks decide together
            restored, invalid = None, e
        # Ranks may disagree (one rank's shard was corrupt and it fell back): use the oldest.
        agreed, newest, none_valid = self._agreement.restored(restored, invalid is not None)
        if none_valid:
            self._no_valid_checkpoint(invalid, newest)
        elif agreed != restored:
            if agreed is None:
                raise PreemptibleError(
                    "some ranks found no checkpoint to restore while others did; the checkpoint "
                    f"root {self.checkpointer.url} is not shared by all ranks"
                )
            restored = self.checkpointer.restore(self._state(), step=agreed)
        self.resumed_from = restored
        if self.resumed_from is not None:
            self.restore_seconds = time.perf_counter() - started
            self._last_saved_step = self.resumed_from
            self._resumed(self.resumed_from)
        self._last_save_at = time.monotonic()

    def _no_valid_checkpoint(
        self, invalid: NoValidCheckpointError | None, newest: int | None
    ) -> None:
        """Some rank found committed checkpoints and none valid: fail, or start over."""
        url = self.checkpointer.url
        if newest is not None:  # other ranks have loaded a checkpoint: no clean start over
            if invalid is not None:
                raise invalid
            raise PreemptibleError(
                f"another rank found no valid checkpoint under {url} while this one restored "
                f"step {newest}: that rank's files fail verification (its error names them; "
                f"`preemptible ckpt verify {url}` checks every rank's). Move the corrupt "
                "checkpoints away and start the job again"
            )
        if self.on_no_valid_checkpoint != "start_over":
            if invalid is not None:
                raise invalid
            raise PreemptibleError(
                f"another rank found no valid checkpoint under {url} (its error names them); "
                'pass on_no_valid_checkpoint="start_over" to start over from step 0'
            )
        if invalid is None or self.run_env.rank != 0:
            return  # one rank moves them aside, before its first save
        log.warning(
            "no valid checkpoint under %s (steps %s fail verification): starting over from step "
            '0, as on_no_valid_checkpoint="start_over" asks; moving them aside',
            url,
            ", ".join(map(str, invalid.steps)),
        )
        if isinstance(self.checkpointer, Checkpointer):  # an adapter's store numbers its own
            for step in invalid.steps:
                self.checkpointer.discard_if_corrupt(step)

    def _resumed(self, step: int) -> None:
        """Say where the run resumed from (rank 0), and, before the first save of this run,
        check the grace against the restored checkpoint's save time, the best estimate of the
        next one."""
        if self.run_env.rank != 0:
            return
        info = next((i for i in reversed(self.checkpointer.list()) if i.step == step), None)
        self.resumed_url = info.url if info is not None else self.checkpointer.url
        log.info(
            "resumed from step %d at %s in %.2f s", step, self.resumed_url, self.restore_seconds
        )
        if info is not None and info.save_seconds > 0:
            self._check_grace(info.save_seconds, f"the save of step {step}, in an earlier run")

    def _queue_notice(self, notice: QueueNotice) -> None:
        """The manager's notice (from the watcher thread): stop at the next step boundary."""
        if notice.kind is NoticeKind.RESIZE:
            self._resize_heard = notice.gpus  # before the request: the boundary reads it after
        self.guard.request(f"queue manager: {notice.reason}", deadline=notice.deadline)

    def _cloud_notice(self, reason: str, deadline: float | None) -> None:
        """A cloud's notice (from its watcher thread): stop at the next step boundary."""
        self.guard.request(reason, deadline=deadline)

    def _queue_terms(self, terms: Terms) -> None:
        """The manager's answer to a cost report (from the reporter thread)."""
        self.guard.set_grace(
            terms.grace_s,
            "queue manager",
            fix='grace_max = "{n}s" or more in the queue config\'s [preemption] (the manager '
            "grants no more; ask its admin)",
        )
        self.schedule.hint_seconds = terms.interval_hint_s

    def _at_boundary(self, step: int) -> None:
        if self._agreed_to_stop(step):
            self._stop(step)

    def _agreed_to_stop(self, step: int) -> bool:
        """The boundary's work but the stop: the agreement, and a save the schedule asks for."""
        if self.queue_link is not None:
            self.queue_link.progress(step)  # the manager's hang watch
        if self._unreported is not None and self._unreported.done():
            self._unreported = None
            self._report()  # a background save finished: its cost is known now
        stall_p95 = None
        if self.schedule.auto:  # only the Young/Daly interval needs the measured stall
            stall = self.cost.stall
            stall_p95 = stall.p95 if stall.count else None
        due = self._save_requested or self.schedule.should_save(
            step, now=time.monotonic(), last_save_at=self._last_save_at, stall_p95=stall_p95
        )
        requested = self.guard.requested
        stop, save, resize_to = self._agreement.agree(requested, due, self._resize_heard)
        self._save_requested = False
        if stop:
            self._resize_to = resize_to
            self._should_stop = True
            return True
        if save:
            self._save(step, blocking=not self.async_save)
        return False

    def _save(self, step: int, *, blocking: bool) -> None:
        result = self.checkpointer.save(step, self._state(), blocking=blocking)
        self._last_saved_step = step
        self._last_save_at = time.monotonic()
        # The save waited for the one before it: report that one now, or, when saves take
        # longer than the interval between them, no boundary would ever see one done.
        earlier, self._unreported = self._unreported, None
        if blocking or (earlier is not None and earlier.done()):
            self._report()
        if not blocking:
            self._unreported = result

    def _save_final(self, step: int) -> None:
        """Make sure ``step`` is committed, whatever happened to the background save before."""
        try:
            self.checkpointer.wait()
            lost = False
        except PreemptibleError as e:
            log.error("a background save failed (%s); saving step %d synchronously", e, step)
            lost = True
        if lost or self._last_saved_step != step:
            self._save(step, blocking=True)
        else:
            self._report()

    def _stop(self, step: int) -> NoReturn:
        """Checkpoint the completed ``step`` (when the deadline leaves time for it, `last_save`)
        and leave with the notice's exit code."""
        resize_to = self._resize_to
        if resize_to is not None and self.run_env.rank == 0:
            log.warning("resize to %d GPUs: saving at step %d", resize_to, step)
        plan = self._plan_last_save(step)
        if plan is not None and self.run_env.rank == 0:
            log.warning("%s", plan.describe())
        saved = plan is None or plan.choice is not LastSave.NONE
        with self.guard.final_save():
            if saved:
                self._save_final(step)
                if self.queue_link is not None:  # committed: the GPUs may go on now
                    self.queue_link.ack(step, resize_to=resize_to)
                else:  # the next attempt may run on another node: it reads the remote tier
                    self._wait_durable(step, plan)
            if self.cloud_notices is not None:  # done with this VM: the cloud may take it now
                self.cloud_notices.committed(step)
        code = self._exit_code if self._exit_code is not None else self.guard.exit_code()
        code = code or 128 + signal.SIGTERM  # a programmatic notice is a preemption too
        received = self.guard.received_at
        waited = f" {time.time() - received:.2f} s after the notice" if received else ""
        what = "preempted" if resize_to is None else f"resizing to {resize_to} GPUs"
        if received:
            waited += f" ({self.guard.reason})"
        if saved:
            where = self.checkpointer.url
            log.warning(
                "%s: checkpointed step %d%s in %s; exiting with %d", what, step, waited, where, code
            )
        else:
            last = self._last_saved_step
            on = "no checkpoint" if last is None else f"the checkpoint of step {last}"
            log.warning("%s: not saved%s; resumes from %s; exiting with %d", what, waited, on, code)
        raise SystemExit(code)

    def _wait_durable(self, step: int, plan: LastSavePlan | None) -> None:
        """Two tiers: wait for the upload of the last save until the deadline, no longer.

        Not under the queue manager: its next attempt runs on this machine and reads the local
        tier (and uploads what is missing), so the job acks at the local commit and leaves."""
        if self._tiers is None:
            return
        budget = plan.upload_budget_s if plan is not None else self.guard.remaining()
        try:
            durable = self._tiers.wait_durable(timeout=budget)
        except PreemptibleError as e:
            durable = False
            log.error("uploading step %d failed: %s", step, e)
        if not durable and self.run_env.rank == 0:
            log.warning(
                "step %d is committed locally, not remotely (the upload did not finish before "
                "the deadline): this node's next start resumes from it and uploads it; another "
                "node resumes from step %s",
                step,
                self._tiers.durable_step,
            )
        elif durable:
            self._report()  # the upload's time is measured now

    @property
    def _tiers(self) -> Checkpointer | None:
        """The checkpointer when it has two tiers (`Checkpointer`'s ``local``), else None."""
        store = self.checkpointer
        return store if isinstance(store, Checkpointer) and store.remote is not None else None

    def _plan_last_save(self, step: int) -> LastSavePlan | None:
        """What the last save can be in the time the deadline leaves, all ranks agreeing (the
        most cautious choice of any rank wins); None when ``step`` is saved already."""
        if self._last_saved_step == step:
            return None  # committed or in flight: `_save_final` waits for it
        cost = self.cost
        plan = plan_last_save(
            self.guard.remaining(),
            local_save_s=cost.save.p95 if cost.save.count else None,
            upload_s=cost.upload.p95 if cost.upload.count else None,
            two_tiers=self._tiers is not None,
        )
        agreed = self._agreement.most_cautious(LAST_SAVE_ORDER.index(plan.choice))
        return dataclasses.replace(plan, choice=LAST_SAVE_ORDER[agreed])

    def _report(self) -> None:
        cost = self.cost
        if self._cost_file:
            try:
                write_cost_file(self._cost_file, cost)
            except OSError as e:
                log.warning("could not write the cost file %s: %r", self._cost_file, e)
        if self.queue_link is not None and cost.save.count:
            self.queue_link.report(cost)  # not before a save is measured: 0 s would be a lie
        if self.reporters is not None and cost.save.count:
            self.reporters.report(cost)  # returns at once: they run on their own thread
        if cost.save.count:
            self._check_grace(cost.save.p95, f"p95 of {cost.save.count} saves")
        if not self._warned_setup:
            self._warned_setup = True
            for warning in check_signal_setup(self.run_env, cost.save.p95):
                log.warning(warning)

    def _check_grace(self, save_seconds: float, measured: str) -> None:
        if self.run_env.rank != 0:
            return  # every rank has the same grace: one warning is enough
        warning = self._grace_check(self.guard.grace, save_seconds, measured=measured)
        if warning is not None:
            log.warning(warning)

    def close(self) -> None:
        """Wait for a save in flight (and its upload, with two tiers), remove the signal
        handlers, stop talking to the manager."""
        try:
            self.checkpointer.wait()
            if isinstance(self.checkpointer, Checkpointer):  # an adapter's store has no tiers
                # After a notice the upload had its time (`_wait_durable`): the deadline rules.
                self.checkpointer.close(wait_durable=not self._should_stop)
                if self._tiers is not None and self.cost.upload.count:
                    self._report()  # the last upload's time is known now
        finally:
            if self.guard.installed:
                self.guard.uninstall()
            if self.queue_link is not None:
                self.queue_link.close()
            if self.cloud_notices is not None:
                self.cloud_notices.close()
            if self.reporters is not None:
                self.reporters.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def preemptible(
    checkpoint_dir: str | os.PathLike[str],
    *,
    every_steps: int | None = None,
    every_seconds: float | None = None,
    keep: int | None = 3,
    async_save: bool = True,
    exit_code: int | None = None,
    interval: str | None = None,
    **context_options: Any,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Make a training function preemption-safe; it receives a `Context` as first argument.

    ``@preemptible("runs/exp1", every_steps=500)`` then ``train()`` runs ``train(ctx)``.
    Extra keyword options go to `Context`.
    """

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> R:
            ctx = Context(
                checkpoint_dir,
                every_steps=every_steps,
                every_seconds=every_seconds,
                keep=keep,
                async_save=async_save,
                exit_code=exit_code,
                interval=interval,
                **context_options,
            )
            with ctx:
                try:
                    return fn(ctx, *args, **kwargs)
                except AlreadyComplete as done:
                    # An exit with status 0 needs no traceback, and this one holds fn's frames,
                    # so the objects of the training function (a DistributedDataParallel model)
                    # outlived the process group the script destroys in its `finally`, and a rank
                    # aborted (SIGABRT) in about 1 run of 6. Without it they go first.
                    raise done.with_traceback(None) from None

        return run

    return decorate
