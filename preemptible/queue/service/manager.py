"""The reference queue manager: submissions in, process groups out, decisions by the core.

One lock guards the jobs, the shell's state and the store; one thread (`_loop`) polls the runs
and runs the core's cycles, and the HTTP threads call the public methods. Every change is in
the state file before it is acknowledged, and a restart recovers: pending jobs wait again,
running ones are adopted again (pid and process start time, so a recycled pid is not taken for
the job), and jobs that vanished while the manager was down are requeued with the reason.

A run is the executor's business (`executor.py`); what the core decides is applied through
`queue.scheduler_loop.Shell`, the same code as the simulator's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from preemptible.errors import JobNotFoundError, JobStateError, QueueError, RequestError
from preemptible.queue.core import (
    POLICIES,
    Job,
    Policy,
    Preempt,
    QueueConfig,
    RunningJob,
    Tier,
)
from preemptible.queue.core.fair_share import dominant_share, fair_share_value, weight_fractions
from preemptible.queue.core.model import Admit
from preemptible.queue.core.negotiation import (
    grace_seconds,
    interval_hint_seconds,
    negotiate,
)
from preemptible.queue.scheduler_loop import Leaving, Shell
from preemptible.queue.service import kpis
from preemptible.queue.service.executor import (
    Exit,
    ExitKind,
    LaunchSpec,
    ProcessExecutor,
    ProcessHandle,
    recorded_exit,
)
from preemptible.queue.service.history import SignalHistory, SignalSample
from preemptible.queue.service.metrics import DurationHistogram
from preemptible.queue.service.records import JobRecord, Notice
from preemptible.queue.service.store import GroupCommit, Store
from preemptible.queue.service.views import (
    CostView,
    EventView,
    JobState,
    JobView,
    NegotiationView,
    NoticeView,
    QueueView,
    StatsView,
    SubmitRequest,
    WhyView,
    finite_or_none,
)

log = logging.getLogger("preemptible.queue")

ACK_EXIT_S = 5.0
"""After a job says it has saved and is exiting, it gets this long before SIGKILL."""
HAND_ON_POLL_S = 0.02
"""How often the runs are polled while a job that acked its notice is on its way out."""
GATHER_S = 0.01
"""The loop's pause after each step, so that a burst of submissions makes one cycle."""
STATS_WINDOW_S = 86400.0
MTBP_WINDOW_S = 7 * 86400.0
"""The mean time between a queue's preemptions (the interval hint's M) is over this window."""
"""The four signals are computed over the last day."""
RUNNING_STATES = (JobState.RUNNING.value, JobState.PREEMPTING.value)


class QueueManager:
    """The queue of one machine's GPUs: thread-safe; `start` runs its loop in a thread."""

    def __init__(
        self,
        config: QueueConfig,
        store: Store,
        executor: ProcessExecutor,
        *,
        state_dir: Path,
        url: str = "",
        policy: Policy | None = None,
        clock: Callable[[], float] = time.time,
        poll_s: float = 0.2,
        cycle_every_s: float = 1.0,
    ):
        self.config = config
        self.store = store
        self.executor = executor
        self.url = url
        self.clock = clock
        self.poll_s = poll_s
        self.cycle_every_s = cycle_every_s
        self.shell = Shell(config, policy or POLICIES["preemptible"])
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.jobs: dict[str, JobRecord] = {}
        self.by_token: dict[str, str] = {}
        self.free_gpus = set(range(config.cluster.gpus))
        self.log_dir = Path(state_dir) / "jobs"
        self.secret = _secret(Path(state_dir) / "secret")
        self.last_reasons: dict[str, str] = {}
        self.default_reason = "pending: waiting for the next cycle"
        self.cycle_seconds: deque[float] = deque(maxlen=1000)
        self.cycle_histogram = DurationHistogram()
        self.cycles_run = 0
        """Cycles of the core so far (each `Shell.cycles` call counts once)."""
        self.wake_at: float | None = None
        """When the last cycle asked to run again although nothing changes before then."""
        self.admissions: Counter[str] = Counter()
        self.preemption_counts: Counter[tuple[str, str]] = Counter()
        self.preempted_at: dict[str, deque[float]] = {q.name: deque() for q in config.queues}
        """When each queue's jobs were requeued after a notice, oldest first, the last week."""
        self._dirty = True
        self._next_cycle = 0.0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._seq = store.next_seq()
        self.commits = GroupCommit(store)
        self.history = SignalHistory(store)
        """The four signals, a sample a minute over the last day (the dashboard's trends)."""
        self._recover()
        self.history.load(self.clock())

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="queue-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self.changed:
            self._stopping = True
            self.changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self.changed:
                if self._stopping:
                    return
                try:
                    self.step()
                    # Here, not in `step`: a replay on a virtual clock samples nothing.
                    self.history.maybe_sample(self.clock(), self.stats)
                except Exception:  # a bug must not stop the queue: log it, go on
                    log.exception("queue loop step failed")
                self.changed.wait(timeout=self._poll_interval())
            time.sleep(GATHER_S)  # what woke the loop at once (a burst of submissions): one step

    def _poll_interval(self) -> float:
        """Seconds until the runs are polled again: soon while a job that acked its notice is
        leaving (its GPUs go on the moment it is gone), else `poll_s`."""
        for job_id in self.shell.state.running:
            notice = self.jobs[job_id].notice
            if notice is not None and notice.acked_at is not None:
                return HAND_ON_POLL_S
        return self.poll_s

    def step(self) -> None:
        """Poll the runs, then run a cycle if anything changed or a second has passed."""
        with self.lock:
            now = self.clock()
            self._poll_runs(now)
            if self._dirty or now >= self._next_cycle:
                self._dirty = False
                self._next_cycle = now + self.cycle_every_s
                self._cycle(now)

    def _cycle(self, now: float) -> None:
        if not self.shell.state.pending and not self.shell.state.nominated:
            return
        started = time.perf_counter()
        results = self.shell.cycles(now, _LiveRuns(self))
        took = time.perf_counter() - started
        self.cycle_seconds.append(took)
        self.cycle_histogram.observe(took)
        self.cycles_run += 1
        last = results[-1]
        self.wake_at = last.wake_at
        self.default_reason = last.default_reason
        # Why each job waits is the last cycle's word: kept in memory only (a restart's first
        # cycle says it again); writing it would cost every cycle an fsync under the lock.
        for job_id, reason in dict(last.pending).items():
            record = self.jobs.get(job_id)
            if record is not None and record.state == JobState.PENDING.value:
                record.reason = reason
        if last.wake_at is not None:
            self._next_cycle = min(self._next_cycle, last.wake_at)

    # --- submissions --------------------------------------------------------------------------

    def submit(self, req: SubmitRequest) -> JobView:
        """Take a job; it is in the state file when this returns.

        Submissions that arrive together are committed together (`GroupCommit`), outside the
        manager's lock: the job is scheduled only once it is on disk.
        """
        self._check(req)
        with self.lock:
            now = self.clock()
            seq = self._seq
            self._seq += 1
        job_id = f"j{seq}"
        record = JobRecord(
            id=job_id,
            name=req.name or os.path.basename(req.command[0]),
            queue=req.queue,
            tier=Tier.parse(req.tier).value,
            gpus=req.gpus,
            cpus=req.cpus,
            memory_gb=req.memory_gb,
            gang=req.gang,
            estimate_s=req.estimate_s,
            command=list(req.command),
            env=dict(req.env),
            cwd=req.cwd,
            submitted_at=now,
            pending_since=now,
        )
        record.grace_s = grace_seconds(0.0, self.config.preemption)
        token_hash = _hash(self._job_token(job_id))
        doc = record.to_doc()

        def write(db: Any) -> None:
            self.store.insert_job(db, seq, job_id, req.queue, record.state, token_hash, doc)
            self._event(db, now, "submitted", record, "submitted", {"gpus": req.gpus})

        self.commits.write(write)
        with self.changed:
            self.jobs[job_id] = record
            self.by_token[token_hash] = job_id
            self.shell.submit(record.core_job())
            self._dirty = True
            self.changed.notify_all()
            return record.view()

    def _check(self, req: SubmitRequest) -> None:
        names = {q.name for q in self.config.queues}
        if req.queue not in names:
            raise RequestError(
                f"no queue named {req.queue!r}; queues: {', '.join(sorted(names)) or 'none'}"
            )
        if not req.command or not req.command[0]:
            raise RequestError("command is empty: give the program and its arguments")
        cl = self.config.cluster
        if req.gpus > cl.gpus:
            raise RequestError(f"asks for {req.gpus} GPUs but the machine has {cl.gpus}")
        if cl.cpus and req.cpus > cl.cpus:
            raise RequestError(f"asks for {req.cpus:g} CPUs but the machine has {cl.cpus:g}")
        if cl.memory_gb and req.memory_gb > cl.memory_gb:
            raise RequestError(
                f"asks for {req.memory_gb:g} GB but the machine has {cl.memory_gb:g} GB"
            )
        try:
            Tier.parse(req.tier)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        if req.cwd is not None and not Path(req.cwd).is_dir():
            raise RequestError(f"cwd {req.cwd!r} is not a directory on this machine")

    # --- reading ------------------------------------------------------------------------------

    def _get(self, job_id: str) -> JobRecord:
        record = self.jobs.get(job_id)
        if record is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        return record

    def get_job(self, job_id: str) -> JobView:
        with self.lock:
            return self._get(job_id).view()

    def job_queue(self, job_id: str) -> str:
        with self.lock:
            return self._get(job_id).queue

    def list_jobs(
        self, *, queue: str | None = None, state: JobState | None = None
    ) -> list[JobView]:
        with self.lock:
            return [
                r.view()
                for r in self.jobs.values()
                if (queue is None or r.queue == queue) and (state is None or r.state == state)
            ]

    def why(self, job_id: str) -> WhyView:
        with self.lock:
            record = self._get(job_id)
            reason = record.reason
        history = self.events(job_id=job_id, limit=100_000)
        return WhyView(id=job_id, state=record.job_state, reason=reason, history=history[::-1])

    def events(
        self,
        *,
        since: int = 0,
        queue: str | None = None,
        job_id: str | None = None,
        limit: int = 1000,
    ) -> list[EventView]:
        rows = self.store.events(since=since, queue=queue, job_id=job_id, limit=limit)
        return [
            EventView(id=i, at=at, kind=k, job_id=j, queue=q, reason=r, data=d)
            for i, at, k, j, q, r, d in rows
        ]

    def log_path(self, job_id: str, attempt: int | None = None) -> Path:
        with self.lock:
            record = self._get(job_id)
            k = record.attempts if attempt is None else attempt
        if k < 1 or k > record.attempts:
            raise JobNotFoundError(f"job {job_id} has no attempt {k} (it has {record.attempts})")
        return self._attempt_path(job_id, k, "log")

    def job_for_token(self, token: str) -> str | None:
        """The job whose own token this is. No lock: one dict lookup is atomic, and the API
        calls this on its event loop, which must never wait for a cycle."""
        return self.by_token.get(_hash(token))

    # --- what jobs tell the manager -----------------------------------------------------------

    def report_cost(self, job_id: str, cost: CostView) -> NegotiationView:
        """A job's measured cost: the answer is its grace, minimum runtime and interval hint.

        The report's last checkpoint counts as one (less work at stake), never as the ack of a
        notice: only `checkpointed` says the job is exiting.
        """
        with self.changed:
            now = self.clock()
            record = self._get(job_id)
            if record.job_state.finished:
                raise JobStateError(f"job {job_id} has {record.state}; it reports nothing more")
            record.cost = {k: v for k, v in dataclasses.asdict(cost).items() if v is not None}
            record.cost.pop("observed_exit_seconds", None)
            if cost.last_checkpoint_time is not None and record.state in RUNNING_STATES:
                self._note_checkpoint(record, cost.last_checkpoint_step, cost.last_checkpoint_time)
            st = self.shell.state
            if job_id in st.pending or job_id in st.running:
                st.refresh(record.core_job())
            with self.store.transaction() as db:
                answer = self._negotiate(db, record, now)
                self.store.update_job(db, job_id, record.state, record.to_doc())
            self._dirty = True
            return answer

    def _negotiate(self, db: Any, record: JobRecord, now: float) -> NegotiationView:
        """The job's terms from its claimed cost and its observed exit, stored in `record`;
        a 'negotiated' event when its grace or minimum runtime change."""
        save = float(record.cost.get("save_seconds_p95") or 0.0)
        answer = negotiate(
            save,
            float(record.cost.get("restore_seconds") or 0.0),
            self.config.preemption,
            observed_exit_s=record.observed_exit_s,
        )
        # The interval hint weighs what a checkpoint costs the loop: the stall, when the job
        # saves in the background, else the whole save.
        stall = float(record.cost.get("stall_seconds_p95") or 0.0) or save
        hint = interval_hint_seconds(stall, self._mtbp(record.queue, now))
        logged = record.terms_logged
        changed = (
            logged is None
            or _moved(logged[0], answer.grace_s)
            or _moved(logged[1], answer.min_runtime_s)
        )
        record.grace_s, record.min_runtime_s = answer.grace_s, answer.min_runtime_s
        record.interval_hint_s = hint
        if changed:
            why = f"grace {answer.grace_s:g} s, minimum runtime {answer.min_runtime_s:g} s"
            if record.observed_exit_s is not None:
                why += f" (it took {record.observed_exit_s:.3g} s to exit when told)"
            data = {
                "grace_s": answer.grace_s,
                "min_runtime_s": answer.min_runtime_s,
                "save_s": save,
                "observed_exit_s": record.observed_exit_s,
                "interval_hint_s": hint,
            }
            self._event(db, now, "negotiated", record, why, data)
            record.terms_logged = [answer.grace_s, answer.min_runtime_s]
        return NegotiationView(
            grace_s=answer.grace_s,
            min_runtime_s=answer.min_runtime_s,
            checkpoint_interval_hint_s=hint,
        )

    def checkpointed(self, job_id: str, *, step: int, at: float | None) -> None:
        """A job committed a checkpoint; one committed after its notice was sent is the ack:
        the job is exiting with nothing left to save."""
        with self.changed:
            now = self.clock()
            record = self._get(job_id)
            if record.state not in RUNNING_STATES:
                raise JobStateError(f"job {job_id} is {record.state}, not running")
            when = self._note_checkpoint(record, step, now if at is None else at)
            notice = record.notice
            acked = notice is not None and notice.acked_at is None and when >= notice.sent_at
            if acked:
                assert notice is not None
                notice.acked_at = now
            with self.store.transaction() as db:
                self.store.update_job(db, job_id, record.state, record.to_doc())
                reason = "saved after the notice: exiting" if acked else "saved"
                self._event(db, now, "checkpointed", record, reason, {"step": step})
            self.changed.notify_all()

    def _note_checkpoint(self, record: JobRecord, step: int | None, at: float) -> float:
        """The job's newest committed checkpoint (never in the future); when it was."""
        when = min(float(at), self.clock())
        if record.last_checkpoint_at is not None and when < record.last_checkpoint_at:
            return when  # an older report arriving late
        record.last_checkpoint_at = when
        record.last_checkpoint_step = step
        if record.id in self.shell.state.running:
            self.shell.state.checkpointed(record.id, when)
        return when

    def wait_notice(self, job_id: str, wait_s: float) -> NoticeView | None:
        """The job's notice, waiting up to `wait_s` for one (a long poll)."""
        deadline = time.monotonic() + max(0.0, wait_s)
        with self.changed:
            while True:
                notice = self._get(job_id).notice
                if notice is not None:
                    return NoticeView(
                        reason=notice.reason, grace_s=notice.grace_s, deadline=notice.deadline
                    )
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return None
                self.changed.wait(timeout=left)

    # --- cancel -------------------------------------------------------------------------------

    def cancel(self, job_id: str) -> JobView:
        with self.changed:
            now = self.clock()
            record = self._get(job_id)
            if record.job_state.finished:
                raise JobStateError(f"job {job_id} has already {record.state}")
            if record.state == JobState.PENDING.value:
                self.shell.state.withdraw(job_id)
                self._finish(record, now, JobState.CANCELLED, "cancelled while pending")
            elif record.state == JobState.RUNNING.value:
                record.cancel_requested = True
                grace = record.grace_s or grace_seconds(0.0, self.config.preemption)
                self._send_notice(record, now, "cancelled: save and exit", grace, None)
                self.shell.state.mark_terminating(job_id, expected_end=now + grace)
            else:
                record.cancel_requested = True
                self._save(record)
            self._dirty = True
            self.changed.notify_all()
            return record.view()

    # --- runs ---------------------------------------------------------------------------------

    def _start(self, admit: Admit, running: RunningJob, now: float) -> None:
        record = self.jobs[running.job.id]
        record.gpu_ids = sorted(self.free_gpus)[: record.gpus]
        self.free_gpus.difference_update(record.gpu_ids)
        record.attempts += 1
        record.state = JobState.RUNNING.value
        record.reason = admit.reason
        record.started_at = now
        record.waits.append([now, now - record.pending_since])
        record.runs.append([now, -1.0])
        record.handle = None
        record.launch_error = None
        record.exit_code = None
        if not record.grace_s:
            record.grace_s = grace_seconds(running.job.save_s, self.config.preemption)
        with self.store.transaction() as db:  # the intent first: a crash now is recoverable
            self.store.update_job(db, record.id, record.state, record.to_doc())
            self._event(db, now, "admitted", record, admit.reason, {"gpus": record.gpu_ids})
        self.admissions[record.queue] += 1
        try:
            handle = self.executor.launch(self._launch_spec(record))
        except QueueError as exc:
            record.launch_error = str(exc)
        else:
            record.handle = dataclasses.asdict(handle)
        self._save(record)

    def _launch_spec(self, record: JobRecord) -> LaunchSpec:
        k = record.attempts
        env = dict(record.env)
        env.update(
            PREEMPTIBLE_QUEUE_URL=self.url,
            PREEMPTIBLE_JOB_ID=record.id,
            PREEMPTIBLE_TOKEN=self._job_token(record.id),
            PREEMPTIBLE_GRACE_SECONDS=f"{record.grace_s:g}",
            PREEMPTIBLE_COST_FILE=str(self._attempt_path(record.id, 0, "cost.json")),
            PREEMPTIBLE_ATTEMPT=str(k),
        )
        self._attempt_path(record.id, k, "log").parent.mkdir(parents=True, exist_ok=True)
        return LaunchSpec(
            job_id=record.id,
            attempt=k,
            command=list(record.command),
            cwd=record.cwd,
            env=env,
            gpu_ids=list(record.gpu_ids),
            log_path=self._attempt_path(record.id, k, "log"),
            status_path=self._attempt_path(record.id, k, "status"),
        )

    def _attempt_path(self, job_id: str, attempt: int, what: str) -> Path:
        if attempt == 0:
            return self.log_dir / job_id / what
        return self.log_dir / job_id / f"attempt-{attempt}.{what}"

    def _notice(self, notice: Preempt, running: RunningJob, now: float) -> Leaving:
        record = self.jobs[notice.job_id]
        self.preemption_counts[(record.queue, notice.kind)] += 1
        self._send_notice(record, now, notice.reason, notice.grace_s, notice.for_job)
        return Leaving(at=now + _expected_exit_s(running.job, notice.grace_s))

    def _send_notice(
        self, record: JobRecord, now: float, reason: str, grace_s: float, for_job: str | None
    ) -> None:
        record.notice = Notice(
            reason=reason, grace_s=grace_s, sent_at=now, deadline=now + grace_s, for_job=for_job
        )
        record.state = JobState.PREEMPTING.value
        record.reason = reason
        with self.store.transaction() as db:
            self.store.update_job(db, record.id, record.state, record.to_doc())
            self._event(db, now, "notice", record, reason, {"grace_s": grace_s, "for": for_job})
        if record.handle is not None:
            self.executor.terminate(ProcessHandle(**record.handle))
            # Stored once sent: a manager that dies before this line sends it again at restart.
            record.notice.signalled_at = now
            self._save(record)
        self.changed.notify_all()

    def _poll_runs(self, now: float) -> None:
        for record in [self.jobs[job_id] for job_id in self.shell.state.running]:
            if record.handle is None:
                if record.launch_error is not None:
                    self._exited(
                        record,
                        Exit(exit_code=127, signal=None, ended_at=now, how=ExitKind.EXITED),
                        now,
                    )
                continue
            handle = ProcessHandle(**record.handle)
            ended = self.executor.poll(handle)
            if ended is not None:
                self._exited(record, ended, now)
                continue
            notice = record.notice
            if notice is None or notice.killed_at is not None:
                continue
            acked_out = notice.acked_at is not None and now >= notice.acked_at + ACK_EXIT_S
            if now >= notice.deadline or acked_out:
                notice.killed_at = now
                self.executor.kill(handle)
                self._save(record)

    def _exited(self, record: JobRecord, ended: Exit, now: float) -> None:
        """A run is over: free its GPUs, and requeue it (preempted) or finish it."""
        at = ended.ended_at if ended.ended_at is not None else now
        self.shell.release(record.id, now)
        self.free_gpus.update(record.gpu_ids)
        record.gpu_ids = []
        record.handle = None
        record.exit_code = ended.exit_code
        if record.runs:
            record.runs[-1][1] = at
        notice = record.notice
        record.notice = None
        self._dirty = True
        if notice is None or (ended.exit_code == 0 and not record.cancel_requested):
            done = ended.exit_code == 0
            state = JobState.COMPLETED if done else JobState.FAILED
            why = record.launch_error or self._exit_words(ended)
            self._finish(record, now, state, why)
            return
        # From the SIGTERM: a notice sent only at a restart must not count the downtime.
        took = max(0.0, at - (notice.signalled_at or notice.sent_at))
        record.observed_exit_s = took
        lost = record.gpus * _lost_seconds(record, notice, at)
        data = {
            "grace_s": notice.grace_s,
            "took_s": round(took, 3),
            "lost_gpu_s": round(lost, 3),
            "killed": notice.killed_at is not None,
            "acked": notice.acked_at is not None,
        }
        if record.cancel_requested:
            self._finish(record, now, JobState.CANCELLED, "stopped on request", data)
            return
        record.preemptions += 1
        record.last_preempted_at = notice.sent_at
        record.losses.append([now, lost])
        self.preempted_at[record.queue].append(now)
        record.state = JobState.PENDING.value
        record.pending_since = now
        record.reason = f"requeued: {notice.reason}"
        with self.store.transaction() as db:
            self._event(db, now, "requeued", record, notice.reason, data)
            self._negotiate(db, record, now)  # its exit is a measurement: the grace follows it
            self.store.update_job(db, record.id, record.state, record.to_doc())
        self.shell.submit(record.core_job())

    @staticmethod
    def _exit_words(ended: Exit) -> str:
        if ended.how == "killed":
            return "killed (SIGKILL)"
        if ended.how == "lost":
            return "its process vanished"
        return f"exited with {ended.exit_code}"

    def _finish(
        self,
        record: JobRecord,
        now: float,
        state: JobState,
        reason: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        record.state = state.value
        record.reason = f"{state.value}: {reason}"
        record.finished_at = now
        record.cancel_requested = False
        with self.store.transaction() as db:
            self.store.update_job(db, record.id, record.state, record.to_doc())
            self._event(db, now, state.value, record, reason, data)

    # --- recovery -----------------------------------------------------------------------------

    def _recover(self) -> None:
        now = self.clock()
        for job_id, token_hash, doc in self.store.load_jobs():
            self.jobs[job_id] = JobRecord.from_doc(doc)
            self.by_token[token_hash] = job_id
        lost_at = sorted((t, r.queue) for r in self.jobs.values() for t, _ in r.losses)
        for at, queue in lost_at:
            self.preempted_at[queue].append(at)
        self.shell.restore_usage(
            (
                (record.core_job(), start, None if end < 0 else end)
                for record in self.jobs.values()
                for start, end in record.runs
            ),
            now,
        )
        for record in self.jobs.values():
            if record.state == JobState.PENDING.value:
                self.shell.submit(record.core_job())
            elif record.state in RUNNING_STATES:
                self._readopt(record, now)

    def _readopt(self, record: JobRecord, now: float) -> None:
        status_path = self._attempt_path(record.id, record.attempts, "status")
        handle = ProcessHandle(**record.handle) if record.handle else None
        if handle is None:
            handle = _find_runner(status_path)
            if handle is not None:
                record.handle = dataclasses.asdict(handle)
        if handle is not None and self.executor.alive(handle):
            self.free_gpus.difference_update(record.gpu_ids)
            running = RunningJob(
                job=record.core_job(),
                started_at=record.started_at or now,
                last_checkpoint_at=record.last_checkpoint_at,
                terminating=record.state == JobState.PREEMPTING.value,
            )
            self.shell.adopt(running, now)
            why = "still running: adopted again"
            notice = record.notice
            if notice is not None and notice.signalled_at is None and notice.killed_at is None:
                # The manager died between storing the notice and sending it: without this the
                # job would get SIGKILL at the deadline, never having been told to save.
                self.executor.terminate(handle)
                notice.signalled_at = now
                notice.deadline = max(notice.deadline, now + notice.grace_s)
                why += "; its notice, never sent, sent now with its whole grace"
            with self.store.transaction() as db:
                self.store.update_job(db, record.id, record.state, record.to_doc())
                self._event(db, now, "recovered", record, why)
            return
        # Without a handle and with no runner left, the launch was never made, or the manager
        # died before saving its handle and the attempt has ended since: then its status file
        # says how (else a job that had completed would run again).
        ended = self.executor.poll(handle) if handle is not None else recorded_exit(status_path)
        running = RunningJob(job=record.core_job(), started_at=record.started_at or now)
        self.shell.adopt(running, now)
        self.free_gpus.difference_update(record.gpu_ids)
        if ended is None or ended.how is not ExitKind.EXITED:
            # Gone without an exit status while nobody watched: it must run again.
            ended = Exit(exit_code=None, signal=None, ended_at=now, how=ExitKind.LOST)
            if record.notice is None:
                record.notice = Notice(
                    reason="its process was gone when the manager restarted",
                    grace_s=0.0,
                    sent_at=now,
                    deadline=now,
                )
        self._exited(record, ended, now)

    # --- the queues and the signals -----------------------------------------------------------

    def queues(self) -> list[QueueView]:
        with self.lock:
            st = self.shell.state
            usage = self.shell.tracker.averages()
            weights = weight_fractions(self.config.queues)
            views = []
            for q in self.config.queues:
                a = st.alloc[q.name]
                share = dominant_share(a.gpus, a.cpus, a.memory_gb, self.config.cluster)
                views.append(
                    QueueView(
                        name=q.name,
                        weight=q.weight,
                        nominal_gpus=finite_or_none(q.nominal.gpus),
                        borrowing_limit_gpus=finite_or_none(q.borrowing_limit.gpus),
                        used_gpus=a.gpus,
                        borrowed_gpus=max(0.0, a.gpus - q.nominal.gpus),
                        pending=sum(1 for j in st.pending.values() if j.queue == q.name),
                        running=len(st.running_by_queue[q.name]),
                        fair_share=fair_share_value(usage.get(q.name, 0.0), share, weights[q.name]),
                    )
                )
            return views

    def stats(self) -> StatsView:
        with self.lock:
            now = self.clock()
            return kpis.compute(
                list(self.jobs.values()),
                queues=[q.name for q in self.config.queues],
                gpus=self.config.cluster.gpus,
                now=now,
                window_s=STATS_WINDOW_S,
            )

    def signal_history(self, since: float) -> list[SignalSample]:
        """The samples of the four signals taken after `since` (epoch seconds), oldest first."""
        with self.lock:
            return self.history.since(since)

    def metrics_snapshot(self) -> dict[str, Any]:
        with self.lock:
            depth = Counter(j.queue for j in self.shell.state.pending.values())
            return {
                "queue_depth": {q.name: depth.get(q.name, 0) for q in self.config.queues},
                "admissions": dict(self.admissions),
                "preemptions": dict(self.preemption_counts),
                "cycle_seconds": list(self.cycle_seconds),
                "cycle_histogram": self.cycle_histogram.snapshot(),
                "signals": self.stats(),
            }

    def _mtbp(self, queue: str, now: float) -> float | None:
        """Mean time between preemptions of `queue` over the last week (None if none)."""
        times = self.preempted_at[queue]
        while times and times[0] < now - MTBP_WINDOW_S:
            times.popleft()
        if not times:
            return None
        return (now - times[0]) / len(times)

    # --- helpers ------------------------------------------------------------------------------

    def _job_token(self, job_id: str) -> str:
        """The job's own token: derived from the manager's secret, so it is never stored."""
        return hmac.new(self.secret, job_id.encode(), hashlib.sha256).hexdigest()

    def _save(self, record: JobRecord) -> None:
        with self.store.transaction() as db:
            self.store.update_job(db, record.id, record.state, record.to_doc())

    def _event(
        self,
        db: Any,
        now: float,
        kind: str,
        record: JobRecord,
        reason: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.store.add_event(
            db, at=now, kind=kind, job_id=record.id, queue=record.queue, reason=reason, data=data
        )


class _LiveRuns:
    """`shell.Runs` for real processes: admissions launch, notices signal."""

    def __init__(self, manager: QueueManager):
        self.manager = manager

    def started(self, admit: Admit, running: RunningJob, now: float) -> None:
        self.manager._start(admit, running, now)

    def noticed(self, notice: Preempt, running: RunningJob, now: float) -> Leaving:
        return self.manager._notice(notice, running, now)


def _moved(old: float, new: float) -> bool:
    """A change of terms worth an event: a tenth or more, and at least a second."""
    return abs(new - old) >= max(1.0, 0.1 * abs(old))


def _lost_seconds(record: JobRecord, notice: Notice, exited_at: float) -> float:
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


def _find_runner(status_path: Path) -> ProcessHandle | None:
    """The runner of an attempt whose launch the manager did not live to record: found by
    the status path on its command line (only at recovery, so a scan of /proc is fine)."""
    wanted = str(status_path).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if wanted in argv and b"--status" in argv:
            ticks = int(stat.rsplit(")", 1)[1].split()[19])
            return ProcessHandle(
                pid=int(entry.name), start_ticks=ticks, status_path=str(status_path)
            )
    return None


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _secret(path: Path) -> bytes:
    """The manager's secret (job tokens derive from it), created once, readable by it alone."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    secret = secrets.token_bytes(32)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return secret
