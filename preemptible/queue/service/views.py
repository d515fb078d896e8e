"""What the queue manager answers, as plain data: the HTTP layer turns these into JSON.

`QueueManager` (manager.py) returns these; `api.py` has a pydantic model for each with the same
fields, so the OpenAPI schema describes exactly what the manager says.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class JobState(enum.StrEnum):
    """A job's states (docs/maintainers/design.md): preempting goes back to pending once it has
    exited.
    """

    PENDING = "pending"
    RUNNING = "running"
    PREEMPTING = "preempting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)

    @property
    def has_process(self) -> bool:
        """Running or preempting: a process of the job is alive, or should be."""
        return self in (JobState.RUNNING, JobState.PREEMPTING)


class PrincipalKind(enum.StrEnum):
    """What a token stands for."""

    ADMIN = "admin"
    QUEUE = "queue"
    JOB = "job"


@dataclass(frozen=True, kw_only=True, slots=True)
class Principal:
    """An authenticated caller: the admin, a queue (by name) or a job (by id); in the audit
    log, who asked for a change (`auth.py` finds it from the token)."""

    kind: PrincipalKind
    name: str
    """"admin", the queue's name or the job's id."""

    def may_act_for_queue(self, queue: str) -> bool:
        """True for the admin and for the queue's own token."""
        return self.kind is PrincipalKind.ADMIN or (
            self.kind is PrincipalKind.QUEUE and self.name == queue
        )

    def describe(self) -> str:
        """Words for error messages ("the token of queue 'team-a'")."""
        if self.kind is PrincipalKind.ADMIN:
            return "the admin token"
        return f"the token of {self.kind.value} {self.name!r}"


ADMIN = Principal(kind=PrincipalKind.ADMIN, name="admin")


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenOwner:
    """The job a job's own token belongs to, and its state (`job_for_token`): once the job
    has finished, its token is refused."""

    job_id: str
    state: JobState


@dataclass(frozen=True, kw_only=True, slots=True)
class SubmitRequest:
    """`POST /v1/jobs`: what a team asks to run."""

    queue: str
    command: list[str]
    gpus: int = 0
    tier: str = "normal"
    cpus: float = 0.0
    memory_gb: float = 0.0
    gang: bool | None = None
    estimate_s: float | None = None
    name: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    min_gpus: int | None = None
    """An elastic job's smallest size (None: rigid); `gpus` is its largest."""
    gpus_multiple: int = 1
    """An elastic job's size is a multiple of this."""
    max_restarts: int | None = None
    """Restarts after a crash or a hang (None: the queue's limit; more is refused)."""
    hang_after_s: float | None = None
    """Seconds the job's step may stand still before it is restarted as hung (None: the
    manager's rule, learned from its step times)."""
    hold: bool = False
    """Submit it held: it waits, out of its queue, until released."""
    after: list[str] = field(default_factory=list)
    """Jobs it waits for, each "ID" or "ID:ok" (succeeded), "ID:any" (finished) or
    "ID:started"; one that can no longer happen cancels it."""
    array: str | None = None
    """Submit an array of jobs, e.g. "0-99%8" (`arrays.py`): indices 0 to 99, at most 8 in
    their queue or running at once."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CostView:
    """The job's last reported cost (the cost file's fields) and what was observed."""

    save_seconds_p95: float | None = None
    stall_seconds_p95: float | None = None
    restore_seconds: float | None = None
    upload_seconds_p95: float | None = None
    """Two tiers: the upload after the local commit (`save_seconds_p95`); not negotiated."""
    bytes: int | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_time: float | None = None
    observed_exit_seconds: float | None = None
    """The longest time the job took from SIGTERM to exit, as the manager saw it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobView:
    """A job as `GET /v1/jobs/{id}` shows it."""

    id: str
    name: str
    queue: str
    tier: str
    gpus: int
    cpus: float
    memory_gb: float
    state: JobState
    reason: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    exit_code: int | None
    grace_s: float
    min_runtime_s: float
    cost: CostView
    command: list[str]
    gpu_ids: list[int] = field(default_factory=list)
    """The GPUs of the current attempt (CUDA_VISIBLE_DEVICES), empty when not running: fewer
    than `gpus` for an elastic job running smaller."""
    min_gpus: int | None = None
    """An elastic job's smallest size; None for a rigid job."""
    gpus_multiple: int = 1
    resizes: int = 0
    """How often it was shrunk or grown (not counted in its preemptions)."""
    restarts: int = 0
    """How often it was restarted after a crash or a hang."""
    max_restarts: int | None = None
    """The restarts it may have (its own ask, or its queue's limit; never above the queue's
    limit now)."""
    held: bool = False
    """Pending and held: not scheduled until released."""
    after: list[str] = field(default_factory=list)
    """Its dependencies not met yet ("ID:ok", "ID:any" or "ID:started")."""
    array_id: str | None = None
    """The array it belongs to ("a7"), None for a job submitted alone."""
    array_index: int | None = None
    """Its index in the array ($PREEMPTIBLE_ARRAY_INDEX)."""
    array_limit: int | None = None
    """Its array's limit: at most this many in their queue or running at once."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WhyView:
    """`GET /v1/jobs/{id}/why`: the core's reasons, newest first."""

    id: str
    state: JobState
    reason: str
    history: list[EventView]
    """This job's events (submitted, admitted, notice, exited, requeued...), newest first."""
    clamped: list[str] = field(default_factory=list)
    """The job's claimed costs that its terms count as less, and the setting that capped each,
    e.g. "claimed restore 604800 s, counted as 1800 s (max_claimed_restore)"; empty when no
    cap binds its last report (`negotiation.Clamped`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NegotiationView:
    """`POST /v1/jobs/{id}/cost`: what the manager grants for the reported cost."""

    grace_s: float
    min_runtime_s: float
    checkpoint_interval_hint_s: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class NoticeView:
    """A notice: save and exit by `deadline` (epoch seconds). `kind` "preempt" (the job
    goes back to its queue, or is cancelled) or "resize" (it restarts at once on `gpus`)."""

    reason: str
    grace_s: float
    deadline: float
    kind: str = "preempt"
    gpus: int | None = None
    """The size it restarts at, for a resize."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EventView:
    """One entry of the audit log."""

    id: int
    at: float
    kind: str
    """submitted, admitted, notice, checkpointed, exited, requeued, completed, failed,
    cancelled, recovered."""
    job_id: str | None
    queue: str | None
    reason: str
    data: dict[str, Any] = field(default_factory=dict)
    by: Principal | None = None
    """Who asked for it (the admin, a queue's token, a job's token); None: the manager itself
    (a cycle's admission or notice, an exit, a restart)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SignalsView:
    """The four signals of docs/maintainers/design.md over the window, for one queue or overall."""

    p95_wait_s: float
    max_wait_s: float
    utilization: float
    goodput: float
    preemptions: int
    preemptions_per_hour: float
    lost_gpu_s: float
    lost_gpu_s_per_preemption: float
    jobs: int
    resizes: int = 0
    """Shrinks and grows of elastic jobs (not preemptions)."""
    resize_lost_gpu_s: float = 0.0
    """GPU-seconds their saves and restarts cost."""


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueView:
    """`GET /v1/queues`: a queue's quota, usage and fair-share position."""

    name: str
    weight: float
    nominal_gpus: float | None
    """None: no nominal quota limit."""
    borrowing_limit_gpus: float | None
    """None: may borrow without limit."""
    used_gpus: float
    borrowed_gpus: float
    pending: int
    running: int
    fair_share: float
    """Its fair-share value now: 1.0 is exactly its weighted share."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StatsView:
    """`GET /v1/stats`: the four signals per queue and overall, over `window_s`."""

    window_s: float
    overall: SignalsView
    queues: dict[str, SignalsView]
    max_wait_least_served_s: float


def finite_or_none(value: float) -> float | None:
    """A limit as JSON can say it: None for the configuration's infinity (no limit)."""
    return value if math.isfinite(value) else None
