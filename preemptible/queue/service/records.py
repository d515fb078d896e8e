"""The manager's record of one job, as kept in memory and stored as JSON in the state file."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from preemptible.queue.core import Job, Resources, Tier
from preemptible.queue.core.negotiation import effective_save_s
from preemptible.queue.service.views import CostView, JobState, JobView


@dataclass(kw_only=True, slots=True)
class Notice:
    """A notice sent to a running job: it should save and exit by `deadline`."""

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


@dataclass(kw_only=True, slots=True)
class JobRecord:
    """Everything the manager knows of one job; `to_doc`/`from_doc` round-trip it as JSON."""

    id: str
    name: str
    queue: str
    tier: str
    gpus: int
    cpus: float
    memory_gb: float
    gang: bool | None
    estimate_s: float | None
    command: list[str]
    env: dict[str, str]
    cwd: str | None
    submitted_at: float
    state: str = JobState.PENDING.value
    reason: str = "pending: submitted"
    pending_since: float = 0.0
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    cost: dict[str, Any] = field(default_factory=dict)
    """The last cost report (the cost file's fields)."""
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
    handle: dict[str, Any] | None = None
    """The executor's handle of the current attempt (None before launch or after exit)."""
    gpu_ids: list[int] = field(default_factory=list)
    launch_error: str | None = None
    notice: Notice | None = None
    cancel_requested: bool = False
    runs: list[list[float]] = field(default_factory=list)
    """[start, end] of every attempt (end = -1 while it runs)."""
    waits: list[list[float]] = field(default_factory=list)
    """[time it started, seconds it waited before] of every attempt."""
    losses: list[list[float]] = field(default_factory=list)
    """[time, GPU-seconds lost] of every preemption."""

    @property
    def job_state(self) -> JobState:
        return JobState(self.state)

    def to_doc(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> JobRecord:
        notice = doc.get("notice")
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in doc.items() if k in fields}
        values["notice"] = Notice(**notice) if notice else None
        return cls(**values)

    def core_job(self) -> Job:
        """The job as the scheduling core sees it, with its measured cost checked against
        what was observed (`negotiation.effective_save_s`)."""
        claimed = float(self.cost.get("save_seconds_p95") or 0.0)
        return Job(
            id=self.id,
            queue=self.queue,
            request=Resources(gpus=self.gpus, cpus=self.cpus, memory_gb=self.memory_gb),
            tier=Tier.parse(self.tier),
            submitted_at=self.submitted_at,
            gang=self.gang,
            estimate_s=self.estimate_s,
            save_s=effective_save_s(claimed, self.observed_exit_s),
            restore_s=float(self.cost.get("restore_seconds") or 0.0),
            checkpoint_on_notice=bool(self.cost),
            last_preempted_at=self.last_preempted_at,
            preemptions=self.preemptions,
        )

    def view(self) -> JobView:
        cost = self.cost
        return JobView(
            id=self.id,
            name=self.name,
            queue=self.queue,
            tier=self.tier,
            gpus=self.gpus,
            cpus=self.cpus,
            memory_gb=self.memory_gb,
            state=self.job_state,
            reason=self.reason,
            submitted_at=self.submitted_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            attempts=self.attempts,
            exit_code=self.exit_code,
            grace_s=self.grace_s,
            min_runtime_s=self.min_runtime_s,
            cost=CostView(
                save_seconds_p95=cost.get("save_seconds_p95"),
                stall_seconds_p95=cost.get("stall_seconds_p95"),
                restore_seconds=cost.get("restore_seconds"),
                bytes=cost.get("bytes"),
                last_checkpoint_step=cost.get("last_checkpoint_step"),
                last_checkpoint_time=cost.get("last_checkpoint_time"),
                observed_exit_seconds=self.observed_exit_s,
            ),
            command=list(self.command),
            gpu_ids=list(self.gpu_ids),
        )
