"""The jobs' processes: launched on admission, told on notice, killed past their deadline, reaped.

`JobRuns` is the manager's `scheduler_loop.Runs`: the core decides, the shell applies, and this
turns an admission into a process group on its GPUs and a notice into SIGTERM, then SIGKILL at
the deadline (or soon after a job says it has saved). When a run ends it frees the GPUs and
either requeues the job (it was told to go: the loss is charged, the terms renegotiated) or
finishes it. An elastic job told to resize saves and exits like a preempted one, and is
launched again at once on its new GPUs, never through its queue (`resized`).

Every change is in the state file before it is acted on, so a manager that dies
at any line recovers (`recovery.py`). It runs under the manager's lock, never alone.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preemptible._env_names import (
    ARRAY_ID_ENV,
    ARRAY_INDEX_ENV,
    ATTEMPT_ENV,
    BEAT_ENV,
    COST_FILE_ENV,
    GPUS_ENV,
    GRACE_ENV,
    JOB_ID_ENV,
    TOKEN_ENV,
    URL_ENV,
)
from preemptible.errors import QueueError
from preemptible.queue.core import Job, Preempt, QueueConfig, RunningJob
from preemptible.queue.core.model import Admit, Resize
from preemptible.queue.core.negotiation import grace_seconds
from preemptible.queue.core.topology import Topology
from preemptible.queue.scheduler_loop import Leaving, Shell
from preemptible.queue.service import dependencies
from preemptible.queue.service.book import JobBook
from preemptible.queue.service.crash_points import crash_point
from preemptible.queue.service.executor import Exit, ExitKind, LaunchSpec, ProcessExecutor
from preemptible.queue.service.isolation import JobUser
from preemptible.queue.service.records import JobRecord, SentNotice
from preemptible.queue.service.views import JobState, Principal

ACK_EXIT_S = 5.0
"""After a job says it has saved and is exiting, it gets this long before SIGKILL."""
FAILURES_KEPT = 5
"""A job's record keeps its last few failures (`JobRecord.failures`)."""
TAIL_LINES = 20
"""Lines of a failed attempt's output kept with its failure."""
TAIL_BYTES = 65536
"""How much of the end of a failed attempt's output is read for its tail and first error."""
TAIL_LINE_CHARS = 300
ERROR_CHARS = 160
"""The first error line is cut to this in reasons."""


@dataclass(slots=True)
class Progress:
    """What the running attempt's step beats said (`JobRuns.beat`): kept in memory only; a
    restarted manager watches again from the next beat."""

    step: int
    advanced_at: float
    """When the step last moved on (the manager's clock)."""
    slowest_s: float
    """The longest step the job reported in this attempt."""


Renegotiate = Callable[[Any, JobRecord, float], object]
"""(transaction, record, now): the job's terms again, after its exit was measured."""


class JobRuns:
    """Start, notice, poll and reap the runs of the manager's jobs (under the manager's lock)."""

    def __init__(
        self,
        config: QueueConfig,
        book: JobBook,
        shell: Shell,
        executor: ProcessExecutor,
        *,
        url: str,
        log_dir: Path,
        job_token: Callable[[str], str],
        renegotiate: Renegotiate,
        changed: threading.Condition,
        notice_sent: threading.Condition,
        users: Mapping[str, JobUser] | None = None,
    ):
        self.config = config
        self.book = book
        self.shell = shell
        self.executor = executor
        self.url = url
        self.log_dir = log_dir
        self.job_token = job_token
        self.renegotiate = renegotiate
        self.changed = changed
        self.users = dict(users or {})
        """Queue name -> the user its jobs run as; a queue not here runs them as the manager."""
        self.notice_sent = notice_sent
        self.free_gpus = set(range(config.cluster.gpus))
        self.topology = config.topology or Topology.flat(config.cluster.gpus)
        """Which GPUs a job gets (`topology.py`): the lowest free ids when none is known."""
        self.admissions: Counter[str] = Counter()
        self.preemption_counts: Counter[tuple[str, str]] = Counter()
        self.failure_counts: Counter[tuple[str, str]] = Counter()
        """(queue, what followed) -> failed attempts since the manager started (`failed`)."""
        self.hang_counts: Counter[tuple[str, str]] = Counter()
        """(queue, "step") -> hangs noticed since the manager started."""
        self.resize_counts: Counter[tuple[str, str]] = Counter()
        """(queue, "shrink" or "grow") -> resizes sent since the manager started."""
        self.preempted_at: dict[str, deque[float]] = {q.name: deque() for q in config.queues}
        """When each queue's jobs were requeued after a notice, oldest first."""
        self.dirty = True
        """A run started or ended since the last cycle: the next step runs one."""
        self.restarting: dict[str, float] = {}
        """Job id -> when it goes back to its queue, after a failure (`failed`)."""
        self.waiting: set[str] = set()
        """Pending jobs whose dependencies are not all met: in no queue (`dependencies.py`)."""
        self.array_backlog: dict[str, set[str]] = {}
        """Array id -> its pending jobs beyond its limit: in no queue (`queue/arrays.py`)."""
        self.progress: dict[str, Progress] = {}
        """Job id -> its running attempt's step beats (`beat`), for the hang watch."""

    # --- scheduler_loop.Runs ------------------------------------------------------------------

    def started(self, admit: Admit, running: RunningJob, now: float) -> None:
        """Launch an admitted job on free GPUs; the intent is stored before the launch."""
        record = self.book.jobs[running.job.id]
        record.gpu_ids = self.topology.pick(self.free_gpus, running.size)
        self.free_gpus.difference_update(record.gpu_ids)
        record.waits.append([now, now - record.pending_since])
        if not record.grace_s:
            record.grace_s = grace_seconds(running.job.save_s, self.config.preemption)
        self._start_attempt(record, now, admit.reason, "admitted", {"gpus": record.gpu_ids})
        self.admissions[record.queue] += 1

    def _start_attempt(
        self, record: JobRecord, now: float, reason: str, kind: str, data: dict[str, Any]
    ) -> None:
        """Launch the record's next attempt on its `gpu_ids`; the intent is stored first."""
        record.attempts += 1
        record.state = JobState.RUNNING
        record.reason = reason
        record.started_at = now
        record.checkpoint_at_start = record.last_checkpoint_step
        self.progress.pop(record.id, None)
        record.runs.append([now, -1.0, float(len(record.gpu_ids))])
        record.handle = None
        record.launch_error = None
        record.exit_code = None
        with self.book.store.transaction() as db:  # the intent first: a crash is recoverable
            self.book.store.update_job(db, record.id, record.state, record.to_doc())
            self.book.event(db, now, kind, record, reason, data)
        crash_point("admitted")
        try:
            handle = self.executor.launch(self.launch_spec(record))
        except QueueError as exc:
            record.launch_error = str(exc)
        else:
            record.handle = handle
            crash_point("launched")
        self.book.save(record)

    def noticed(self, notice: Preempt, running: RunningJob, now: float) -> Leaving:
        """Send the core's notice; the job is expected to leave after its save (or grace)."""
        record = self.book.jobs[notice.job_id]
        self.preemption_counts[(record.queue, notice.kind)] += 1
        self.send_notice(record, now, notice.reason, notice.grace_s, notice.for_job)
        return Leaving(at=now + _expected_exit_s(running.job, notice.grace_s))

    def resized(self, resize: Resize, running: RunningJob, now: float) -> None:
        """Tell an elastic job to save and restart on `resize.gpus` GPUs (`ResizingRuns`).

        A grow takes its new GPUs now (the core counts them held from the notice on); a shrink
        keeps those in its fullest island (`Topology.keep`) and gives up the others once it has
        exited."""
        record = self.book.jobs[resize.job_id]
        if resize.kind == "grow":
            more = max(0, resize.gpus - len(record.gpu_ids))
            extra = self.topology.grow(record.gpu_ids, self.free_gpus, more)
            self.free_gpus.difference_update(extra)
            gpu_ids = sorted([*record.gpu_ids, *extra])
        else:
            gpu_ids = self.topology.keep(record.gpu_ids, resize.gpus)
        self.resize_counts[(record.queue, resize.kind)] += 1
        # As the core's state has it: a grow counts from its notice, a shrink from its notice
        # until it has saved, then from its restart (`_restart_resized`).
        record.last_resized_at = now
        self.send_notice(
            record,
            now,
            resize.reason,
            resize.grace_s,
            resize.for_job,
            resize=(resize.kind, gpu_ids),
        )

    # --- one run ------------------------------------------------------------------------------

    def launch_spec(self, record: JobRecord) -> LaunchSpec:
        """The process of the record's current attempt, with the variables the SDK reads."""
        k = record.attempts
        env = dict(record.env)
        env.update(
            {
                URL_ENV: self.url,
                JOB_ID_ENV: record.id,
                TOKEN_ENV: self.job_token(record.id),
                GRACE_ENV: f"{record.grace_s:g}",
                COST_FILE_ENV: str(self.attempt_path(record.id, 0, "cost") / "cost.json"),
                ATTEMPT_ENV: str(k),
                GPUS_ENV: str(len(record.gpu_ids)),
                BEAT_ENV: f"{self.config.restarts.beat_s:g}",
            }
        )
        command = [arg.replace("{gpus}", env[GPUS_ENV]) for arg in record.command]
        if record.array_id is not None:
            env.update({ARRAY_ID_ENV: record.array_id, ARRAY_INDEX_ENV: str(record.array_index)})
            command = [arg.replace("{index}", env[ARRAY_INDEX_ENV]) for arg in command]
        return LaunchSpec(
            job_id=record.id,
            attempt=k,
            command=command,
            cwd=record.cwd,
            env=env,
            gpu_ids=list(record.gpu_ids),
            log_path=self.attempt_path(record.id, k, "log"),
            status_path=self.attempt_path(record.id, k, "status"),
            run_as=self.users.get(record.queue),
            own_dir=self.attempt_path(record.id, 0, "cost"),
        )

    def attempt_path(self, job_id: str, attempt: int, what: str) -> Path:
        """A file of one attempt (attempt 0: of the job, such as the folder of its cost file,
        the only one the job may write)."""
        if attempt == 0:
            return self.log_dir / job_id / what
        return self.log_dir / job_id / f"attempt-{attempt}.{what}"

    def send_notice(
        self,
        record: JobRecord,
        now: float,
        reason: str,
        grace_s: float,
        for_job: str | None,
        *,
        by: Principal | None = None,
        resize: tuple[str, list[int]] | None = None,
        restart: bool = False,
    ) -> None:
        """Store the notice, then SIGTERM the job's group (a restart sends one never sent);
        `by` asked for it (a cancel), None when a cycle decided it. `resize`: ("shrink" or
        "grow", the GPUs it restarts on) for a resize, which leaves the job running.
        `restart`: the job hung; its exit is a failure (`failed`)."""
        self._drop_grown(record)  # a cancel that overrides a grow: its new GPUs go back
        record.notice = SentNotice(
            reason=reason,
            grace_s=grace_s,
            sent_at=now,
            deadline=now + grace_s,
            for_job=for_job,
            restart=restart,
        )
        data: dict[str, Any] = {"grace_s": grace_s, "for": for_job}
        if restart:
            data["hung"] = True
        if resize is None:
            record.state = JobState.PREEMPTING
        else:
            record.notice.kind = "resize"
            record.notice.resize_kind, record.notice.gpu_ids = resize
            data.update({"resize": resize[0], "from": record.size, "to": len(resize[1])})
        record.reason = reason
        with self.book.store.transaction() as db:
            self.book.store.update_job(db, record.id, record.state, record.to_doc())
            self.book.event(db, now, "notice", record, reason, data, by=by)
        crash_point("noticed")
        if record.handle is not None:
            self.executor.terminate(record.handle)
            # Stored once sent: a manager that dies before this line sends it again at restart.
            record.notice.signalled_at = now
            self.book.save(record)
        self.changed.notify_all()
        self.notice_sent.notify_all()

    def rank_victims(self) -> None:
        """Before a cycle: mark the running jobs whose going would free a whole NVLink island,
        for the core to take first among victims that lose as much (`ClusterState.victim_rank`).
        Nothing to mark on a machine without islands."""
        ranks = self.shell.state.victim_rank
        ranks.clear()
        if not self.topology.known:
            return
        for job_id in self.shell.state.running:
            held = self.book.jobs[job_id].gpu_ids
            ranks[job_id] = 0 if self.topology.frees_an_island(held, self.free_gpus) else 1

    def leaving_after_ack(self) -> bool:
        """Whether a job that acked its notice is on its way out (its GPUs go on when gone)."""
        for job_id in self.shell.state.running:
            notice = self.book.jobs[job_id].notice
            if notice is not None and notice.acked_at is not None:
                return True
        return False

    def poll(self, now: float) -> None:
        """Reap the runs that ended; SIGKILL those past their deadline or their ack's window;
        tell those that hang to go; put the failed jobs whose back-off is over back in line,
        and as many of each array's waiting jobs as its limit lets in."""
        for job_id, at in list(self.restarting.items()):
            if at <= now:
                del self.restarting[job_id]
                record = self.book.jobs[job_id]
                record.restart_at = None
                self.line_up(record)
        for job_id in sorted(self.waiting):
            self._check_dependencies(self.book.jobs[job_id], now)
        for record in [self.book.jobs[job_id] for job_id in self.shell.state.running]:
            handle = record.handle
            if handle is None:
                if record.launch_error is not None:
                    self.exited(
                        record,
                        Exit(exit_code=127, signal=None, ended_at=now, how=ExitKind.EXITED),
                        now,
                    )
                continue
            ended = self.executor.poll(handle)
            if ended is not None:
                self.exited(record, ended, now)
                continue
            notice = record.notice
            if notice is None:
                self._watch_for_hang(record, now)
                continue
            if notice.killed_at is not None:
                continue
            acked_out = notice.acked_at is not None and now >= notice.acked_at + ACK_EXIT_S
            if now >= notice.deadline or acked_out:
                notice.killed_at = now
                self.executor.kill(handle)
                why = (
                    f"still running {ACK_EXIT_S:g} s after it said it had saved"
                    if acked_out and now < notice.deadline
                    else f"still running at its notice's deadline ({notice.grace_s:g} s)"
                )
                with self.book.store.transaction() as db:
                    self.book.store.update_job(db, record.id, record.state, record.to_doc())
                    self.book.event(db, now, "killed", record, f"SIGKILL: {why}", None)
        for array_id in sorted(self.array_backlog):  # after the reaping: their slots are free
            self._line_up_array(array_id)

    # --- where a pending job waits -----------------------------------------------------------

    def line_up(self, record: JobRecord) -> None:
        """Put a pending job where it waits: its queue, or out of it while it waits out a
        restart back-off (`restart_at`) or its dependencies (`after`), or while held (`release`
        lines it up again). Every way into a queue goes through here."""
        if record.after:
            self.waiting.add(record.id)
        if record.restart_at is not None:
            self.restarting[record.id] = record.restart_at
        elif record.held or record.after:
            pass
        elif record.array_id is not None and record.array_limit is not None:
            self.array_backlog.setdefault(record.array_id, set()).add(record.id)
            record.reason = (
                f"pending: array {record.array_id} runs at most {record.array_limit} at once"
            )
        else:
            self.shell.submit(record.core_job())
        self.dirty = True

    def out_of_line(self, record: JobRecord) -> None:
        """Take a pending job out of wherever it waits (a cancel): its queue, its back-off, its
        dependencies, its array's backlog, its hold."""
        self.restarting.pop(record.id, None)
        self.waiting.discard(record.id)
        self.out_of_queue(record)
        record.held = False
        record.restart_at = None

    def out_of_queue(self, record: JobRecord) -> None:
        """Take a pending job out of its queue, or its array's backlog (a hold: its back-off and
        its dependencies still count)."""
        if record.id in self.shell.state.pending:
            self.shell.state.withdraw(record.id)
        if record.array_id is not None:
            backlog = self.array_backlog.get(record.array_id, set())
            backlog.discard(record.id)
            if not backlog:
                self.array_backlog.pop(record.array_id, None)

    # --- arrays -------------------------------------------------------------------------------

    def _line_up_array(self, array_id: str) -> None:
        """Put an array's waiting jobs in their queue, lowest index first, while fewer than its
        limit are in their queue, running, or waiting out a back-off."""
        backlog = self.array_backlog[array_id]
        members = [self.book.jobs[job_id] for job_id in self.book.arrays[array_id]]
        limit = members[0].array_limit or len(members)
        state = self.shell.state
        active = sum(
            1
            for r in members
            if r.id in state.pending or r.id in state.running or r.id in self.restarting
        )
        free = limit - active
        if free <= 0:
            return
        for record in sorted((self.book.jobs[i] for i in backlog), key=_array_index)[:free]:
            backlog.discard(record.id)
            record.reason = "pending: submitted"
            self.shell.submit(record.core_job())
            self.dirty = True
        if not backlog:
            del self.array_backlog[array_id]

    # --- dependencies -------------------------------------------------------------------------

    def _check_dependencies(self, record: JobRecord, now: float) -> None:
        """Drop the dependencies now met; cancel the job if one never will be; put it in its
        queue once none is left (unless it is held)."""
        left = []
        for given in record.after:
            job_id, condition = dependencies.parse(given)
            other = self.book.jobs[job_id]
            verdict = dependencies.state_of(other, condition)
            if verdict is dependencies.Dependency.NEVER:
                self.waiting.discard(record.id)
                why = (
                    f"its dependency {job_id} {other.state.value} before it could "
                    f"{'start' if condition == 'started' else 'succeed'} (it waited for "
                    f"{dependencies.words(job_id, condition)})"
                )
                self.finish(record, now, JobState.CANCELLED, why, {"after": given})
                self.dirty = True
                return
            if verdict is dependencies.Dependency.WAITING:
                left.append(given)
        if left == record.after:
            return
        met = [d for d in record.after if d not in left]
        record.after = left
        if left:
            record.reason = f"pending: waiting for {waiting_words(left)}"
        else:
            self.waiting.discard(record.id)
            record.reason = "pending: its dependencies are met"
            self.line_up(record)
        with self.book.store.transaction() as db:
            self.book.store.update_job(db, record.id, record.state, record.to_doc())
            why = f"{', '.join(met)} met" + ("" if left else ": it joins its queue")
            self.book.event(db, now, "dependency", record, why, {"met": met, "left": left})

    # --- hangs --------------------------------------------------------------------------------

    def beat(self, record: JobRecord, step: int, step_s: float | None, now: float) -> None:
        """The job's SDK reports its step (and its slowest step since the last beat)."""
        seen = self.progress.get(record.id)
        slowest = max(step_s or 0.0, seen.slowest_s if seen is not None else 0.0)
        if seen is None or step != seen.step:
            self.progress[record.id] = Progress(step=step, advanced_at=now, slowest_s=slowest)
        else:
            seen.slowest_s = slowest

    def hang_bound(self, record: JobRecord) -> tuple[float, str] | None:
        """How long the job's step may stand still, and why that long; None: not watched
        (it has reported no step in this attempt)."""
        seen = self.progress.get(record.id)
        if seen is None:
            return None
        rules = self.config.restarts
        if record.hang_after_s is not None:
            return record.hang_after_s, "its hang_after"
        if rules.hang_after_s is not None:
            return rules.hang_after_s, "the queue's hang_after"
        learned = rules.hang_factor * seen.slowest_s
        if learned <= rules.hang_min_s:
            return rules.hang_min_s, "hang_min"
        return learned, f"{rules.hang_factor:g}x its slowest step, {seen.slowest_s:.3g} s"

    def _watch_for_hang(self, record: JobRecord, now: float) -> None:
        """A job whose step stands still past its bound is told to save and exit; at the
        deadline it is killed, and its exit is a failure (restarted, `failed`)."""
        if record.state != JobState.RUNNING or record.handle is None:
            return
        bound = self.hang_bound(record)
        seen = self.progress.get(record.id)
        if bound is None or seen is None or now - seen.advanced_at <= bound[0]:
            return
        limit, why = bound
        reason = (
            f"hung: step {seen.step} has not advanced for {now - seen.advanced_at:.0f} s "
            f"(bound {limit:.3g} s: {why})"
        )
        grace = record.grace_s or grace_seconds(0.0, self.config.preemption)
        self.hang_counts[(record.queue, "step")] += 1
        self.send_notice(record, now, reason, grace, None, restart=True)
        self.shell.state.mark_terminating(record.id, expected_end=now + grace)

    def exited(self, record: JobRecord, ended: Exit, now: float) -> None:
        """A run is over: free its GPUs, and requeue it (preempted) or finish it; an elastic
        job that saved on its resize notice starts again at once on its new GPUs."""
        at = ended.ended_at if ended.ended_at is not None else now
        seen = self.progress.pop(record.id, None)
        size = record.size
        notice = record.notice
        resizing = notice is not None and notice.kind == "resize" and notice.gpu_ids is not None
        acked = notice is not None and notice.acked_at is not None
        if resizing and acked and ended.exit_code != 0 and not record.cancel_requested:
            assert notice is not None
            self._restart_resized(record, notice, at, now)
            return
        self.shell.release(record.id, now)
        self._drop_grown(record)
        self.free_gpus.update(record.gpu_ids)
        record.gpu_ids = []
        record.handle = None
        record.exit_code = ended.exit_code
        if record.runs:
            record.runs[-1][1] = at
        record.notice = None
        self.dirty = True
        if ended.exit_code == 0 and not record.cancel_requested:
            self.finish(record, now, JobState.COMPLETED, _exit_words(ended))
            return
        if notice is None or (notice.restart and not record.cancel_requested):
            self.failed(record, ended, now, hung=notice, seen=seen)
            return
        # From the SIGTERM: a notice sent only at a restart must not count the downtime.
        took = max(0.0, at - (notice.signalled_at or notice.sent_at))
        record.observed_exit_s = took
        lost = size * _lost_seconds(record, notice, at)
        data = {
            "grace_s": notice.grace_s,
            "took_s": round(took, 3),
            "lost_gpu_s": round(lost, 3),
            "killed": notice.killed_at is not None,
            "acked": notice.acked_at is not None,
        }
        if record.cancel_requested:
            by = record.cancelled_by
            self.finish(record, now, JobState.CANCELLED, "stopped on request", data, by=by)
            return
        record.preemptions += 1
        record.last_preempted_at = notice.sent_at
        record.losses.append([now, lost])
        self.preempted_at[record.queue].append(now)
        record.state = JobState.PENDING
        record.pending_since = now
        why = notice.reason
        if resizing:
            # It exited without saving on its resize notice (it does not support one): it is
            # preempted instead, and its next attempt starts from its queue.
            self.preemption_counts[(record.queue, "resize_refused")] += 1
            why = (
                f"it exited without saving on its notice to {notice.resize_kind} to "
                f"{len(notice.gpu_ids or ())} GPUs, so it was preempted instead ({notice.reason})"
            )
        record.reason = f"requeued: {why}"
        with self.book.store.transaction() as db:
            self.book.event(db, now, "requeued", record, why, data)
            self.renegotiate(db, record, now)  # its exit is a measurement: the grace follows
            self.book.store.update_job(db, record.id, record.state, record.to_doc())
        self.line_up(record)

    # --- failures -----------------------------------------------------------------------------

    def restart_limit(self, record: JobRecord) -> int:
        """The restarts the job gets: what it asked for, within its queue's limit."""
        limit = self.config.restart_limit(record.queue)
        return limit if record.max_restarts is None else min(limit, record.max_restarts)

    def failed(
        self,
        record: JobRecord,
        ended: Exit,
        now: float,
        *,
        hung: SentNotice | None = None,
        seen: Progress | None = None,
    ) -> None:
        """The attempt failed: it exited non-zero without a notice, or hung (`hung`, its
        notice); `seen`: what its step beats said. Restart it from its checkpoint after a
        back-off, unless it has no restart left, failed to launch, or is in a crash loop:
        failures in a row that made no progress (no checkpoint newer than the attempt's first,
        or the same failing step)."""
        how = record.launch_error or _exit_words(ended)
        words = how if hung is None else f"{hung.reason}; {how}"
        failure = self._failure(record, ended, now, words, seen)
        if failure["error"] is not None and hung is None:
            words = f"{words} ({failure['error'][:ERROR_CHARS]})"
            failure["exit"] = words
        previous = record.failures[-1] if record.failures else None
        record.failures = [*record.failures, failure][-FAILURES_KEPT:]
        newer = record.last_checkpoint_step is not None and (
            record.checkpoint_at_start is None
            or record.last_checkpoint_step > record.checkpoint_at_start
        )
        same_step = (
            previous is not None
            and failure["step"] is not None
            and failure["step"] == previous.get("step")
        )
        record.stalled = 0 if newer and not same_step else record.stalled + 1
        limit = self.restart_limit(record)
        rules = self.config.restarts
        outcome = "restarted"
        if record.launch_error is not None or limit == 0:
            outcome, why = "not_restarted", words
        elif record.stalled >= rules.crash_loop_after:
            outcome, why = "crash_loop", _crash_loop(record, failure, same_step)
        elif record.restarts >= limit:
            outcome, why = (
                "no_restart_left",
                f"{words}; no restart left ({limit} used: max_restarts)",
            )
        self.failure_counts[(record.queue, outcome)] += 1
        if outcome != "restarted":
            self.finish(record, now, JobState.FAILED, why, failure)
            return
        record.restarts += 1
        wait = rules.backoff(max(1, record.stalled))
        record.state = JobState.PENDING
        record.pending_since = now
        record.restart_at = now + wait
        self.line_up(record)
        why = f"{words}; restart {record.restarts} of {limit} in {wait:g} s"
        if record.last_checkpoint_step is not None:  # the job resumes from its own newest
            why += f" (last checkpoint reported: step {record.last_checkpoint_step})"
        record.reason = f"restarting: {why}"
        data = {**failure, "restart": record.restarts, "of": limit, "in_s": wait}
        with self.book.store.transaction() as db:
            self.book.store.update_job(db, record.id, record.state, record.to_doc())
            self.book.event(db, now, "restarting", record, why, data)

    def _failure(
        self, record: JobRecord, ended: Exit, now: float, words: str, seen: Progress | None
    ) -> dict[str, Any]:
        """What is kept of a failed attempt: enough for `queue why` to say what happened."""
        tail, error = output_tail(self.attempt_path(record.id, record.attempts, "log"))
        return {
            "at": now,
            "attempt": record.attempts,
            "exit": words,
            "exit_code": ended.exit_code,
            "signal": ended.signal,
            "step": None if seen is None else seen.step,
            "checkpoint_step": record.last_checkpoint_step,
            "error": error,
            "tail": tail,
        }

    def _restart_resized(
        self, record: JobRecord, notice: SentNotice, at: float, now: float
    ) -> None:
        """The job saved on its resize notice and exited: launch it again at once on its new
        GPUs (a shrink's others are free from now on, for the job it was shrunk for first)."""
        new = list(notice.gpu_ids or ())
        old = list(record.gpu_ids)
        if notice.resize_kind == "shrink":
            self.shell.shrunk(record.id, len(new), now)
        self.free_gpus.update(set(old) - set(new))
        if record.runs:
            record.runs[-1][1] = at
        took = max(0.0, at - (notice.signalled_at or notice.sent_at))
        lost = len(old) * _lost_seconds(record, notice, at)
        record.resize_losses.append([now, lost])
        record.resizes += 1
        if notice.resize_kind == "shrink":
            record.last_resized_at = now  # as `Shell.shrunk` has it; a grow's is its notice
        record.observed_exit_s = took
        record.notice = None
        record.gpu_ids = new
        self.dirty = True
        data = {
            "resize": notice.resize_kind,
            "from": len(old),
            "to": len(new),
            "took_s": round(took, 3),
            "lost_gpu_s": round(lost, 3),
            "gpus": new,
        }
        why = notice.reason.removeprefix("resized: ")  # the core's reason says it once
        reason = f"resized from {len(old)} to {len(new)} GPUs: {why}"
        self._start_attempt(record, now, reason, "resized", data)

    def _drop_grown(self, record: JobRecord) -> None:
        """Give back the GPUs a grow took for a restart that will not happen."""
        notice = record.notice
        if notice is not None and notice.kind == "resize" and notice.resize_kind == "grow":
            self.free_gpus.update(set(notice.gpu_ids or ()) - set(record.gpu_ids))
            notice.gpu_ids = list(record.gpu_ids)

    def finish(
        self,
        record: JobRecord,
        now: float,
        state: JobState,
        reason: str,
        data: dict[str, Any] | None = None,
        *,
        by: Principal | None = None,
    ) -> None:
        """The job is over for good: completed, failed or cancelled, with the reason (and who
        cancelled it)."""
        crash_point("finishing")
        record.state = state
        record.reason = f"{state.value}: {reason}"
        record.finished_at = now
        record.cancel_requested = False
        with self.book.store.transaction() as db:
            self.book.store.update_job(db, record.id, record.state, record.to_doc())
            self.book.event(db, now, state.value, record, reason, data, by=by)


# A line that reports an error: "RuntimeError: ...", "[rank1]: torch.OutOfMemoryError: ...",
# "Segmentation fault", "Fatal Python error: ...".
_ERROR_LINE = re.compile(
    r"(?:^|\]:\s*)(?:[A-Za-z_][\w.]*(?:Error|Exception):"
    r"|Segmentation fault|Fatal Python error|Killed\b|Aborted\b)"
)


def _array_index(record: JobRecord) -> int:
    return record.array_index or 0


def waiting_words(after: list[str]) -> str:
    """ "j3 to succeed and j4 to start", for a reason."""
    return " and ".join(dependencies.words(*dependencies.parse(d)) for d in after)


def output_tail(path: Path) -> tuple[list[str], str | None]:
    """The last lines of an attempt's output (stdout and stderr together) and the first line in
    them that reports an error, each shortened. The first error is what a launcher's report
    buries (torchrun prints some 60 lines after a worker's own error). A job's output is
    untrusted: at most `TAIL_BYTES` are read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
    except OSError:
        return [], None
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # the first may be cut
    kept = [line.rstrip()[:TAIL_LINE_CHARS] for line in lines if line.strip()]
    error = next((line for line in kept if _ERROR_LINE.search(line)), None)
    return kept[-TAIL_LINES:], error


def _crash_loop(record: JobRecord, failure: dict[str, Any], same_step: bool) -> str:
    """Why a job is failed as a crash loop, in words: what made its last failure one without
    progress."""
    if same_step:
        where = f"failing after step {failure['step']} each time"
    elif record.last_checkpoint_step is None:
        where = "no checkpoint ever"
    else:
        where = f"no checkpoint newer than step {record.last_checkpoint_step}"
    return (
        f"crash loop: {record.stalled} failures in a row without progress ({where}); "
        f"not restarted. Last: {failure['exit']}"
    )


def _exit_words(ended: Exit) -> str:
    if ended.how == "killed":
        return "killed (SIGKILL)"
    if ended.how == "lost":
        return "its process vanished"
    return f"exited with {ended.exit_code}"


def _lost_seconds(record: JobRecord, notice: SentNotice, exited_at: float) -> float:
    """Seconds of the run a preemption wasted: from its last committed checkpoint to its exit;
    for a job that acked (saved after the notice, nothing left at stake), from the notice to
    that save: the step in flight and the save. Its exit after the ack wastes no work."""
    start = record.started_at or exited_at
    since = record.last_checkpoint_at
    if since is None or since < start:
        since = start
    if notice.acked_at is not None and since >= notice.sent_at:
        return max(0.0, since - notice.sent_at)
    return max(0.0, exited_at - since)


def _expected_exit_s(job: Job, grace_s: float) -> float:
    """How long a noticed job should take to leave: a job that saves on notice (it reported
    its cost) takes its save, the claim checked against what was observed; any other may take
    the whole grace. Backfill plans with it, as the simulator does."""
    if job.checkpoint_on_notice:
        return min(grace_s, job.save_s)
    return grace_s
