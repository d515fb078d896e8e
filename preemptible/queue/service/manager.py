"""The reference queue manager: submissions in, process groups out, decisions by the core.

One lock guards the jobs, the shell's state and the store; one thread (`_loop`) polls the runs
and runs the core's cycles, and the HTTP threads call the public methods. Every change is in
the state file before it is acknowledged.

The loop needs nothing the HTTP side hands out: no thread of its pools, no connection; its file
descriptors (the state file, open from the start; a job's log at launch; `/proc` at each poll)
are kept free by the server's connection limit (`connections.py`). A step that fails anyway
(a full disk, a `/proc` read refused) is retried at the next one; the failure is logged once per
outage (`log_limits.Outage`), not every 0.2 s, and counted in `/metrics`.

This module takes what teams and jobs say (submissions, cancels, cost reports, checkpoints)
and answers what they ask. The records and their state file are `book.py`; the jobs'
processes, from launch to reaping, are `runs.py`, which applies the core's decisions through
`queue.scheduler_loop.Shell`, the same code as the simulator's; a restart is `recovery.py`.
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
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from preemptible.errors import (
    JobNotFoundError,
    JobSpecError,
    JobStateError,
    RequestError,
)
from preemptible.queue import arrays
from preemptible.queue.core import (
    POLICIES,
    Policy,
    QueueConfig,
    Tier,
)
from preemptible.queue.core.fair_share import dominant_share, fair_share_value, weight_fractions
from preemptible.queue.core.model import elastic_range_problem
from preemptible.queue.core.negotiation import (
    Negotiated,
    grace_seconds,
    interval_hint_seconds,
    negotiate,
)
from preemptible.queue.scheduler_loop import Shell
from preemptible.queue.service import dependencies, kpis
from preemptible.queue.service.book import JobBook
from preemptible.queue.service.crash_points import crash_point
from preemptible.queue.service.executor import (
    ProcessExecutor,
)
from preemptible.queue.service.history import SignalHistory, SignalSample
from preemptible.queue.service.isolation import JOBS_FOLDER, PRIVATE_FILE, JobUser
from preemptible.queue.service.log_limits import Outage
from preemptible.queue.service.metrics import STEP_GAP_BUCKETS_S, DurationHistogram
from preemptible.queue.service.records import JobRecord
from preemptible.queue.service.recovery import recover
from preemptible.queue.service.runs import JobRuns, waiting_words
from preemptible.queue.service.steady_clock import SteadyClock
from preemptible.queue.service.store import GroupCommit, Store
from preemptible.queue.service.views import (
    CostView,
    EventView,
    JobState,
    JobView,
    NegotiationView,
    NoticeView,
    Principal,
    PrincipalKind,
    QueueView,
    StatsView,
    SubmitRequest,
    TokenOwner,
    WhyView,
    finite_or_none,
)

log = logging.getLogger("preemptible.queue")

HAND_ON_POLL_S = 0.02
"""How often the runs are polled while a job that acked its notice is on its way out."""
GATHER_S = 0.01
"""The loop's pause after each step, so that a burst of submissions makes one cycle."""
STATS_WINDOW_S = 86400.0
"""The four signals are computed over the last day."""
MTBP_WINDOW_S = 7 * 86400.0
"""The mean time between a queue's preemptions (the interval hint's M) is over this window."""


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
        clock: Callable[[], float] | None = None,
        poll_s: float = 0.2,
        cycle_every_s: float = 1.0,
        users: Mapping[str, JobUser] | None = None,
    ):
        state_dir = Path(state_dir).absolute()  # jobs and their runners run in other folders
        self.config = config
        self.store = store
        self.executor = executor
        self.clock = SteadyClock() if clock is None else clock
        self.poll_s = poll_s
        self.cycle_every_s = cycle_every_s
        self.shell = Shell(config, policy or POLICIES["preemptible"])
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.notice_sent = threading.Condition(self.lock)
        """Notified when a notice is sent and when the manager stops: what a notice long-poll
        waits for, so that the hundreds of polls do not wake at every change."""
        self.book = JobBook(store)
        self.jobs = self.book.jobs
        self.secret = _secret(Path(state_dir) / "secret")
        self.runs = JobRuns(
            config,
            self.book,
            self.shell,
            executor,
            url=url,
            log_dir=Path(state_dir) / JOBS_FOLDER,
            job_token=self._job_token,
            renegotiate=self._negotiate,
            changed=self.changed,
            users=users,
            notice_sent=self.notice_sent,
        )
        self.default_reason = "pending: waiting for the next cycle"
        self.cycle_seconds: deque[float] = deque(maxlen=1000)
        self.cycle_histogram = DurationHistogram()
        self.cycles_run = 0
        """Cycles of the core so far (each `Shell.cycles` call counts once)."""
        self.steps_run = 0
        """Steps of the loop so far, failed ones included."""
        self.step_failures = 0
        """Steps of the loop that raised (each retried at the next)."""
        self.step_gaps = DurationHistogram(STEP_GAP_BUCKETS_S)
        """Seconds from each step of the loop to the next: a gap longer than a second and a
        poll means a cycle was late."""
        self._last_step_at: float | None = None
        self._outage = Outage(log, "a step of the queue loop")
        self._finished_views = FinishedViews()
        self.wake_at: float | None = None
        """When the last cycle asked to run again although nothing changes before then."""
        self._next_cycle = 0.0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._seq = store.next_seq()
        self.commits = GroupCommit(store)
        self.history = SignalHistory(store)
        """The four signals, a sample a minute over the last day (the dashboard's trends)."""
        recover(self.book, self.runs, self.clock())
        self.history.load(self.clock())

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="queue-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self.changed:
            self._stopping = True
            self.changed.notify_all()
            self.notice_sent.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self.changed:
                if self._stopping:
                    return
                self._loop_step()
                self.changed.wait(timeout=self._poll_interval())
            time.sleep(GATHER_S)  # what woke the loop at once (a burst of submissions): one step

    def _loop_step(self) -> None:
        """One step of the loop thread: counted, timed from the last, and a failure logged once
        per outage (a bug or a refused resource must not stop the queue)."""
        started = time.monotonic()
        if self._last_step_at is not None:
            self.step_gaps.observe(started - self._last_step_at)
        self._last_step_at = started
        self.steps_run += 1
        try:
            self.step()
            # Here, not in `step`: a replay on a virtual clock samples nothing.
            self.history.maybe_sample(self.clock(), self.stats)
        except Exception:
            self.step_failures += 1
            self._outage.failed()
        else:
            self._outage.succeeded()

    def _poll_interval(self) -> float:
        """Seconds until the runs are polled again: soon while a job that acked its notice is
        leaving (its GPUs go on the moment it is gone), else `poll_s`."""
        return HAND_ON_POLL_S if self.runs.leaving_after_ack() else self.poll_s

    def _smaller_than_asked(self) -> bool:
        """Whether an elastic job runs below its request: a cycle may grow it."""
        running = self.shell.state.running.values()
        return any(r.gpus is not None and r.gpus < r.job.request.gpus for r in running)

    def step(self) -> None:
        """Poll the runs, then run a cycle if anything changed or a second has passed."""
        with self.lock:
            now = self.clock()
            self.runs.poll(now)
            if self.runs.dirty or now >= self._next_cycle:
                self.runs.dirty = False
                self._next_cycle = now + self.cycle_every_s
                self._cycle(now)

    def _cycle(self, now: float) -> None:
        state = self.shell.state
        if not state.pending and not state.nominated and not self._smaller_than_asked():
            return
        started = time.perf_counter()
        self.runs.rank_victims()
        results = self.shell.cycles(now, self.runs)
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
            if record is not None and record.state == JobState.PENDING:
                record.reason = reason
        if last.wake_at is not None:
            self._next_cycle = min(self._next_cycle, last.wake_at)

    # --- submissions --------------------------------------------------------------------------

    def submit(self, req: SubmitRequest, *, by: Principal | None = None) -> JobView:
        """Take a job, or an array of them (`req.array`: the answer is its first job); they are
        in the state file when this returns. `by` (the caller) is in their 'submitted' events,
        as in every event a caller asks for.

        Submissions that arrive together are committed together (`GroupCommit`), outside the
        manager's lock: a job is scheduled only once it is on disk.
        """
        self._check(req)
        spec = None if req.array is None else arrays.parse(req.array)
        count = 1 if spec is None else len(spec.indices)
        with self.lock:
            now = self.clock()
            first = self._seq
            self._seq += count
        after = self._dependencies(req)
        made = []
        for k in range(count):
            record = self._record(req, f"j{first + k}", now, after)
            if spec is not None:
                record.array_id = arrays.array_id(first)
                record.array_index = spec.indices[k]
                record.array_limit = spec.limit
                record.name = f"{record.name}[{record.array_index}]"
            made.append((first + k, record, _hash(self._job_token(record.id))))

        def write(db: Any) -> None:
            for seq, record, token_hash in made:
                doc = record.to_doc()
                self.store.insert_job(db, seq, record.id, req.queue, record.state, token_hash, doc)
                data: dict[str, Any] = {"gpus": req.gpus}
                if spec is not None:
                    data |= {"array": record.array_id, "index": record.array_index}
                self.book.event(db, now, "submitted", record, "submitted", data, by=by)

        self.commits.write(write)
        crash_point("submitted")
        with self.changed:
            for seq, record, token_hash in made:
                self.book.add(seq, record, token_hash)
                self.runs.line_up(record)
            self.changed.notify_all()
            return made[0][1].view()

    def _record(self, req: SubmitRequest, job_id: str, now: float, after: list[str]) -> JobRecord:
        """The record of a job `req` submits, pending (or held, or waiting for `after`)."""
        record = JobRecord(
            id=job_id,
            name=req.name or os.path.basename(req.command[0]),
            queue=req.queue,
            tier=Tier.parse(req.tier),
            gpus=req.gpus,
            cpus=req.cpus,
            memory_gb=req.memory_gb,
            gang=req.gang,
            estimate_s=req.estimate_s,
            command=list(req.command),
            env=dict(req.env),
            cwd=req.cwd,
            min_gpus=req.min_gpus,
            gpus_multiple=req.gpus_multiple,
            held=req.hold,
            after=list(after),
            max_restarts=(
                self.config.restart_limit(req.queue)
                if req.max_restarts is None
                else req.max_restarts
            ),
            hang_after_s=req.hang_after_s,
            submitted_at=now,
            pending_since=now,
        )
        record.grace_s = grace_seconds(0.0, self.config.preemption)
        if record.held:
            record.reason = "held: submitted held; release it to schedule it"
        elif record.after:
            record.reason = f"pending: waiting for {waiting_words(record.after)}"
        return record

    def _dependencies(self, req: SubmitRequest) -> list[str]:
        """The jobs `req` waits for, as "ID:CONDITION", each checked to exist; an array's id
        ("a7") stands for each of its jobs.

        Raises:
            JobNotFoundError: a dependency names no job.
        """
        found = []
        for given in req.after:
            job_id, condition = dependencies.parse(given)
            members = self.book.arrays.get(job_id)  # an array's id: each of its jobs
            for one in members or [self.book.get(job_id).id]:
                found.append(dependencies.spec(one, condition))
        return list(dict.fromkeys(found))

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
        limit = self.config.restart_limit(req.queue)
        if req.max_restarts is not None and req.max_restarts > limit:
            raise JobSpecError(
                f"asks for max_restarts {req.max_restarts} but queue {req.queue!r} allows "
                f"{limit}: ask for {limit} or fewer, or leave it out for {limit}"
            )
        self._check_range(req)

    def _check_range(self, req: SubmitRequest) -> None:
        """An elastic job's range (`min_gpus`..`gpus` on `gpus_multiple`) must make sense and
        fit the machine: else 422, with what to change."""
        cluster_gpus = self.config.cluster.gpus
        problem = elastic_range_problem(req.gpus, req.min_gpus, req.gpus_multiple, cluster_gpus)
        if problem is not None:
            raise JobSpecError(problem)

    # --- reading ------------------------------------------------------------------------------

    def get_job(self, job_id: str) -> JobView:
        with self.lock:
            return self.book.get(job_id).view()

    def job_queue(self, job_id: str) -> str:
        with self.lock:
            return self.book.get(job_id).queue

    def list_jobs(
        self,
        *,
        queue: str | None = None,
        state: JobState | None = None,
        after: str | None = None,
        limit: int | None = None,
        array: str | None = None,
    ) -> list[JobView]:
        """Jobs in submission order, of one queue, state or array, from the first submitted
        after the job `after`, at most `limit` (None: all).

        Raises:
            RequestError: `after` is not a job's id.
        """

        def keep(r: JobRecord) -> bool:
            return (
                (queue is None or r.queue == queue)
                and (state is None or r.state == state)
                and (array is None or r.array_id == array)
            )

        with self.lock:
            page = self.book.page(keep, after=after, limit=limit)
            views = [None if r.state.finished else r.view() for r in page]
        # A finished job's record never changes again: its view is made without the lock, which
        # a page of history (500 views, 5 ms) would otherwise hold from submissions and cycles,
        # and kept for the next page that shows it.
        return [
            v if v is not None else self._finished_views.get(r)
            for v, r in zip(views, page, strict=True)
        ]

    def why(self, job_id: str) -> WhyView:
        with self.lock:
            record = self.book.get(job_id)
            reason = record.reason
            clamped = [c.reason for c in self._terms(record).clamped]
        history = self.events(job_id=job_id, limit=100_000)
        return WhyView(
            id=job_id, state=record.state, reason=reason, history=history[::-1], clamped=clamped
        )

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
            EventView(
                id=row.id,
                at=row.at,
                kind=row.kind,
                job_id=row.job_id,
                queue=row.queue,
                reason=row.reason,
                data=row.data,
                by=_principal(row.by),
            )
            for row in rows
        ]

    def log_path(self, job_id: str, attempt: int | None = None) -> Path:
        with self.lock:
            record = self.book.get(job_id)
            k = record.attempts if attempt is None else attempt
        if k < 1 or k > record.attempts:
            raise JobNotFoundError(f"job {job_id} has no attempt {k} (it has {record.attempts})")
        return self.runs.attempt_path(job_id, k, "log")

    def job_for_token(self, token: str) -> TokenOwner | None:
        """The job whose own token this is, and its state. No lock: a dict lookup and an
        attribute read are atomic, and the API calls this on its event loop, which must never
        wait for a cycle."""
        job_id = self.book.by_token.get(_hash(token))
        record = None if job_id is None else self.jobs.get(job_id)
        if record is None:
            return None
        return TokenOwner(job_id=record.id, state=record.state)

    # --- what jobs tell the manager -----------------------------------------------------------

    def report_cost(
        self, job_id: str, cost: CostView, *, by: Principal | None = None
    ) -> NegotiationView:
        """A job's measured cost: the answer is its grace, minimum runtime and interval hint.

        The report's last checkpoint counts as one (less work at stake), never as the ack of a
        notice: only `checkpointed` says the job is exiting.
        """
        with self.changed:
            now = self.clock()
            record = self.book.get(job_id)
            if record.state.finished:
                raise JobStateError(f"job {job_id} has {record.state}; it reports nothing more")
            sent = dataclasses.replace(cost, observed_exit_seconds=None)
            record.cost = None if sent == CostView() else sent  # an empty report says nothing
            if cost.last_checkpoint_time is not None and record.state.has_process:
                self._note_checkpoint(record, cost.last_checkpoint_step, cost.last_checkpoint_time)
            st = self.shell.state
            if job_id in st.pending or job_id in st.running:
                st.refresh(record.core_job())
            with self.store.transaction() as db:
                answer = self._negotiate(db, record, now, by=by)
                self.store.update_job(db, job_id, record.state, record.to_doc())
            self.runs.dirty = True
            return answer

    def _terms(self, record: JobRecord) -> Negotiated:
        """What the core grants for the job's claimed cost and observed exit, with the caps
        that bound the claim (the record keeps the claim as the job sent it)."""
        cost = record.cost or CostView()
        return negotiate(
            cost.save_seconds_p95 or 0.0,
            cost.restore_seconds or 0.0,
            self.config.preemption,
            observed_exit_s=record.observed_exit_s,
        )

    def _negotiate(
        self, db: Any, record: JobRecord, now: float, *, by: Principal | None = None
    ) -> NegotiationView:
        """The job's terms from its claimed cost and its observed exit, stored in `record`;
        a 'negotiated' event when its grace or minimum runtime change (`by`: the job, when its
        report changed them; None when its observed exit did)."""
        cost = record.cost or CostView()
        save = cost.save_seconds_p95 or 0.0
        answer = self._terms(record)
        # The interval hint weighs what a checkpoint costs the loop: the stall, when the job
        # saves in the background, else the whole save.
        stall = cost.stall_seconds_p95 or save
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
            for clamp in answer.clamped:
                why += f"; {clamp.reason}"
            data = {
                "grace_s": answer.grace_s,
                "min_runtime_s": answer.min_runtime_s,
                "save_s": save,
                "restore_s": cost.restore_seconds,
                "observed_exit_s": record.observed_exit_s,
                "interval_hint_s": hint,
                "clamped": [
                    {
                        "claim": c.claim,
                        "claimed_s": c.claimed_s,
                        "counted_s": c.counted_s,
                        "setting": c.setting,
                    }
                    for c in answer.clamped
                ],
            }
            self.book.event(db, now, "negotiated", record, why, data, by=by)
            record.terms_logged = [answer.grace_s, answer.min_runtime_s]
        return NegotiationView(
            grace_s=answer.grace_s,
            min_runtime_s=answer.min_runtime_s,
            checkpoint_interval_hint_s=hint,
        )

    def checkpointed(
        self, job_id: str, *, step: int, at: float | None, by: Principal | None = None
    ) -> None:
        """A job committed a checkpoint; one committed after its notice was sent is the ack:
        the job is exiting with nothing left to save."""
        with self.changed:
            now = self.clock()
            record = self.book.get(job_id)
            if not record.state.has_process:
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
                self.book.event(db, now, "checkpointed", record, reason, {"step": step}, by=by)
            if acked:
                crash_point("acked")
            self.changed.notify_all()

    def progress(
        self,
        job_id: str,
        *,
        step: int,
        step_s: float | None,
        checkpoint: tuple[int, float] | None = None,
    ) -> None:
        """The job's step beat: what the hang watch measures (`JobRuns.beat`), with its newest
        checkpoint ((step, time)), kept in memory until the next store write (after a crash
        the restart is judged by it: `JobRuns.failed`)."""
        with self.lock:
            record = self.book.get(job_id)
            if not record.state.has_process:
                raise JobStateError(f"job {job_id} is {record.state}, not running")
            if checkpoint is not None:
                self._note_checkpoint(record, checkpoint[0], checkpoint[1])
            self.runs.beat(record, step, step_s, self.clock())

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
        with self.notice_sent:
            while True:
                notice = self.book.get(job_id).notice
                if notice is not None:
                    resize = notice.kind == "resize" and notice.gpu_ids is not None
                    return NoticeView(
                        reason=notice.reason,
                        grace_s=notice.grace_s,
                        deadline=notice.deadline,
                        kind=notice.kind,
                        gpus=len(notice.gpu_ids) if resize and notice.gpu_ids else None,
                    )
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return None
                self.notice_sent.wait(timeout=left)

    # --- hold and release ---------------------------------------------------------------------

    def hold(self, job_id: str, *, by: Principal | None = None) -> JobView:
        """Keep a pending job out of its queue until `release`; its place, priority and any
        restart back-off are kept.

        Raises:
            JobStateError: the job is not pending (a running job: cancel it, or let it run).
        """
        with self.changed:
            now = self.clock()
            record = self.book.get(job_id)
            if record.held:
                return record.view()
            if record.state != JobState.PENDING:
                raise JobStateError(
                    f"job {job_id} is {record.state}: only a pending job can be held (cancel a "
                    "running one, or let it run)"
                )
            self.runs.out_of_queue(record)
            record.held = True
            record.reason = "held: release it to schedule it"
            with self.store.transaction() as db:
                self.store.update_job(db, job_id, record.state, record.to_doc())
                self.book.event(db, now, "held", record, "held until released", by=by)
            self.runs.dirty = True
            self.changed.notify_all()
            return record.view()

    def release(self, job_id: str, *, by: Principal | None = None) -> JobView:
        """Put a held job back in its queue (or back to its restart back-off).

        Raises:
            JobStateError: the job is not held.
        """
        with self.changed:
            now = self.clock()
            record = self.book.get(job_id)
            if not record.held:
                raise JobStateError(f"job {job_id} is not held ({record.state})")
            record.held = False
            if record.restart_at is not None:
                record.reason = "restarting: released; waiting out its back-off"
            elif record.after:
                record.reason = f"pending: released; waiting for {waiting_words(record.after)}"
            else:
                record.reason = "pending: released"
            self.runs.line_up(record)
            with self.store.transaction() as db:
                self.store.update_job(db, job_id, record.state, record.to_doc())
                self.book.event(db, now, "released", record, "released", by=by)
            self.changed.notify_all()
            return record.view()

    # --- priority -----------------------------------------------------------------------------

    def set_tier(self, job_id: str, tier: str, *, by: Principal | None = None) -> JobView:
        """Move a pending job to another tier; it keeps its place (its submission time) in
        that tier's order. A team may submit at any tier, so this grants nothing a new
        submission would not.

        Raises:
            JobStateError: the job is not pending (its tier decides whom it may preempt).
            RequestError: `tier` is not a tier's name.
        """
        try:
            new = Tier.parse(tier)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        with self.changed:
            now = self.clock()
            record = self.book.get(job_id)
            if record.state != JobState.PENDING:
                raise JobStateError(
                    f"job {job_id} is {record.state}: only a pending job's tier can change "
                    "(a running one keeps the tier it was admitted at)"
                )
            if record.tier == new:
                return record.view()
            was = record.tier
            record.tier = new
            if job_id in self.shell.state.pending:  # its group in the core is by tier
                self.shell.state.withdraw(job_id)
                self.shell.submit(record.core_job())
            with self.store.transaction() as db:
                self.store.update_job(db, job_id, record.state, record.to_doc())
                why = f"tier {was.value} -> {new.value}"
                self.book.event(db, now, "priority", record, why, {"tier": new.value}, by=by)
            self.runs.dirty = True
            self.changed.notify_all()
            return record.view()

    # --- cancel -------------------------------------------------------------------------------

    def cancel(self, job_id: str, *, by: Principal | None = None) -> JobView:
        """Cancel a job: a pending one at once, a running one by a notice; `by` is in the
        notice's event and in the 'cancelled' one, whenever the job is gone."""
        with self.changed:
            now = self.clock()
            record = self.book.get(job_id)
            if record.state.finished:
                raise JobStateError(f"job {job_id} has already {record.state}")
            if record.state == JobState.PENDING:
                self.runs.out_of_line(record)
                self.runs.finish(record, now, JobState.CANCELLED, "cancelled while pending", by=by)
            elif record.state == JobState.RUNNING:
                record.cancel_requested = True
                record.cancelled_by = by
                grace = record.grace_s or grace_seconds(0.0, self.config.preemption)
                self.runs.send_notice(record, now, "cancelled: save and exit", grace, None, by=by)
                self.shell.state.mark_terminating(job_id, expected_end=now + grace)
            else:
                record.cancel_requested = True
                record.cancelled_by = by
                self.book.save(record)
            self.runs.dirty = True
            self.changed.notify_all()
            return record.view()

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
                "admissions": dict(self.runs.admissions),
                "preemptions": dict(self.runs.preemption_counts),
                "resizes": dict(self.runs.resize_counts),
                "failures": dict(self.runs.failure_counts),
                "hangs": dict(self.runs.hang_counts),
                "cycle_seconds": list(self.cycle_seconds),
                "cycle_histogram": self.cycle_histogram.snapshot(),
                "cycles": self.cycles_run,
                "loop_steps": self.steps_run,
                "loop_step_failures": self.step_failures,
                "loop_step_gaps": self.step_gaps.snapshot(),
                "signals": self.stats(),
            }

    def _mtbp(self, queue: str, now: float) -> float | None:
        """Mean time between preemptions of `queue` over the last week (None if none)."""
        times = self.runs.preempted_at[queue]
        while times and times[0] < now - MTBP_WINDOW_S:
            times.popleft()
        if not times:
            return None
        return (now - times[0]) / len(times)

    # --- helpers ------------------------------------------------------------------------------

    def _job_token(self, job_id: str) -> str:
        """The job's own token: derived from the manager's secret, so it is never stored."""
        return hmac.new(self.secret, job_id.encode(), hashlib.sha256).hexdigest()


class FinishedViews:
    """The views of the finished jobs listed last, the most recent `size`: a finished job's
    record never changes again, so its view is made once, not at every page that shows it
    (10 µs each, most of a page's cost). Thread-safe."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._views: OrderedDict[str, JobView] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, record: JobRecord) -> JobView:
        """The view of `record`, which has finished."""
        with self._lock:
            view = self._views.get(record.id)
            if view is not None:
                self._views.move_to_end(record.id)
                return view
        view = record.view()
        with self._lock:
            self._views[record.id] = view
            if len(self._views) > self.size:
                self._views.popitem(last=False)
        return view


def _moved(old: float, new: float) -> bool:
    """A change of terms worth an event: a tenth or more, and at least a second."""
    return abs(new - old) >= max(1.0, 0.1 * abs(old))


def _principal(by: tuple[str, str] | None) -> Principal | None:
    """Who asked for a stored event (None: the manager, or a kind this version does not know)."""
    if by is None:
        return None
    try:
        return Principal(kind=PrincipalKind(by[0]), name=by[1])
    except ValueError:
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
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)  # a leftover temp file keeps its mode through O_CREAT
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return secret
