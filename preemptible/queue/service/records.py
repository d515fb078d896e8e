"""The manager's record of one job, as kept in memory and stored as JSON in the state file."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from preemptible.queue.core import Job, Resources, Tier
from preemptible.queue.core.negotiation import effective_save_s
from preemptible.queue.service.executor import ProcessHandle
from preemptible.queue.service.views import CostView, JobState, JobView, Principal, PrincipalKind

_COST_FIELDS = tuple(
    f.name for f in dataclasses.fields(CostView) if f.name != "observed_exit_seconds"
)


@dataclass(kw_only=True, slots=True)
class SentNotice:
    """A notice the manager sent to a running job: it should save and exit by `deadline`.

    (The job's side of it is `preemptible.runtime.signals.Notice`.)"""

    reason: str
    grace_s: float
    sent_at: float
    deadline: float
    for_job: str | None = None
    """The job the capacity is freed for (None when the job is cancelled)."""
    acked_at: float | None = None
    """When the job said it had saved and is exiting (`checkpointed` after the notice)."""
    signalled_at: float | None = None
    """When SIGTERM was sent; None while only decided (a restarted manager then sends it)."""
    killed_at: float | None = None
    """When the manager sent SIGKILL (the deadline passed, or the ack's exit window)."""
    kind: str = "preempt"
    """"preempt" (requeued, or cancelled) or "resize" (restarted at once on `gpu_ids`)."""
    gpu_ids: list[int] | None = None
    """A resize's GPUs for the restart (a grow holds the new ones from the notice on)."""
    resize_kind: str | None = None
    """"shrink" or "grow", for a resize."""
    restart: bool = False
    """The job hung: its exit is a failure, restarted like a crash (`JobRuns.failed`)."""


@dataclass(kw_only=True, slots=True)
class JobRecord:
    """Everything the manager knows of one job; `to_doc`/`from_doc` round-trip it as JSON."""

    id: str
    name: str
    queue: str
    tier: Tier
    gpus: int
    cpus: float
    memory_gb: float
    gang: bool | None
    estimate_s: float | None
    command: list[str]
    env: dict[str, str]
    cwd: str | None
    submitted_at: float
    state: JobState = JobState.PENDING
    reason: str = "pending: submitted"
    pending_since: float = 0.0
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    cost: CostView | None = None
    """The last cost report, as the job sent it (`observed_exit_seconds` is never set here:
    what the manager saw is `observed_exit_s`)."""
    observed_exit_s: float | None = None
    """How long the job last took from SIGTERM to exit."""
    grace_s: float = 0.0
    min_runtime_s: float = 0.0
    terms_logged: list[float] | None = None
    """[grace, minimum runtime] of the last 'negotiated' event (small moves log nothing)."""
    interval_hint_s: float | None = None
    last_preempted_at: float | None = None
    preemptions: int = 0
    last_checkpoint_at: float | None = None
    last_checkpoint_step: int | None = None
    handle: ProcessHandle | None = None
    """The executor's handle of the current attempt (None before launch or after exit)."""
    gpu_ids: list[int] = field(default_factory=list)
    launch_error: str | None = None
    notice: SentNotice | None = None
    cancel_requested: bool = False
    cancelled_by: Principal | None = None
    """Who asked for the cancel, named in the 'cancelled' event once the job has exited."""
    runs: list[list[float]] = field(default_factory=list)
    """[start, end, GPUs] of every attempt (end = -1 while it runs; records written before
    elastic jobs have no GPUs: the request's)."""
    waits: list[list[float]] = field(default_factory=list)
    """[time it started, seconds it waited before] of every attempt."""
    losses: list[list[float]] = field(default_factory=list)
    """[time, GPU-seconds lost] of every preemption."""
    resize_losses: list[list[float]] = field(default_factory=list)
    """[time, GPU-seconds lost] of every resize (its save and restart), apart from `losses`."""
    min_gpus: int | None = None
    """An elastic job's smallest size (None: rigid)."""
    gpus_multiple: int = 1
    last_resized_at: float | None = None
    resizes: int = 0
    """Shrinks and grows so far (not preemptions)."""
    max_restarts: int | None = None
    """The restarts after a failure it may have: what it asked for, else its queue's limit
    when it was submitted (None in records older than restarts: the queue's limit)."""
    hang_after_s: float | None = None
    """The job's own hang bound (None: the `[restarts]` table's rule)."""
    restarts: int = 0
    """Restarts after a failure (a crash or a hang) so far."""
    stalled: int = 0
    """Failures in a row that made no progress (`JobRuns.failed`): a crash loop at
    `crash_loop_after`."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    """The last few failures, oldest first: when, how it ended, its step, its output's tail."""
    restart_at: float | None = None
    """A pending job waiting out its back-off after a failure: in no queue before this."""
    checkpoint_at_start: int | None = None
    """`last_checkpoint_step` when the current attempt started (did it make progress?)."""
    held: bool = False
    """A pending job kept out of its queue until released (`QueueManager.hold`)."""
    after: list[str] = field(default_factory=list)
    """Its dependencies not met yet, "ID:CONDITION" (`dependencies.py`): in no queue before."""
    array_id: str | None = None
    """The array it belongs to (`queue/arrays.py`); None for a job submitted alone."""
    array_index: int | None = None
    array_limit: int | None = None
    """At most this many of its array in their queue or running at once (`JobRuns.poll`)."""

    @property
    def reported_cost(self) -> bool:
        """Whether the job has reported its cost: then it saves on notice."""
        return self.cost is not None

    def to_doc(self) -> dict[str, Any]:
        """The record as JSON values; the cost keeps only the fields the job sent."""
        doc = dataclasses.asdict(self)
        doc["tier"] = self.tier.value
        doc["state"] = self.state.value
        cost = {} if self.cost is None else dataclasses.asdict(self.cost)
        doc["cost"] = {k: cost[k] for k in _COST_FIELDS if cost.get(k) is not None}
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> JobRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in doc.items() if k in fields}
        values["tier"] = Tier.parse(doc["tier"])
        values["state"] = JobState(doc.get("state", JobState.PENDING))
        notice, cost, handle = doc.get("notice"), doc.get("cost"), doc.get("handle")
        by = doc.get("cancelled_by")
        values["cancelled_by"] = (
            Principal(kind=PrincipalKind(by["kind"]), name=by["name"]) if by else None
        )
        values["notice"] = SentNotice(**notice) if notice else None
        values["cost"] = (
            CostView(**{k: cost[k] for k in _COST_FIELDS if k in cost}) if cost else None
        )
        values["handle"] = ProcessHandle(**handle) if handle else None
        return cls(**values)

    def core_job(self) -> Job:
        """The job as the scheduling core sees it, with its measured cost checked against
        what was observed (`negotiation.effective_save_s`)."""
        cost = self.cost or CostView()
        claimed = cost.save_seconds_p95 or 0.0
        return Job(
            id=self.id,
            queue=self.queue,
            request=Resources(gpus=self.gpus, cpus=self.cpus, memory_gb=self.memory_gb),
            tier=self.tier,
            submitted_at=self.submitted_at,
            gang=self.gang,
            estimate_s=self.estimate_s,
            save_s=effective_save_s(claimed, self.observed_exit_s),
            restore_s=cost.restore_seconds or 0.0,
            checkpoint_on_notice=self.reported_cost,
            last_preempted_at=self.last_preempted_at,
            preemptions=self.preemptions,
            min_gpus=self.min_gpus,
            gpus_multiple=self.gpus_multiple,
            last_resized_at=self.last_resized_at,
        )

    @property
    def size(self) -> int:
        """GPUs of the current attempt: fewer than `gpus` for an elastic job running smaller
        (its request while it holds none)."""
        return len(self.gpu_ids) if self.gpu_ids else self.gpus

    def view(self) -> JobView:
        """The job as the API shows it (a copy: the record may change after)."""
        c = self.cost
        cost = dataclasses.replace(c or CostView(), observed_exit_seconds=self.observed_exit_s)
        return JobView(
            id=self.id,
            name=self.name,
            queue=self.queue,
            tier=self.tier,
            gpus=self.gpus,
            cpus=self.cpus,
            memory_gb=self.memory_gb,
            state=self.state,
            reason=self.reason,
            submitted_at=self.submitted_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            attempts=self.attempts,
            exit_code=self.exit_code,
            grace_s=self.grace_s,
            min_runtime_s=self.min_runtime_s,
            cost=cost,
            command=list(self.command),
            gpu_ids=list(self.gpu_ids),
            min_gpus=self.min_gpus,
            gpus_multiple=self.gpus_multiple,
            resizes=self.resizes,
            restarts=self.restarts,
            max_restarts=self.max_restarts,
            held=self.held,
            after=list(self.after),
            array_id=self.array_id,
            array_index=self.array_index,
            array_limit=self.array_limit,
        )
