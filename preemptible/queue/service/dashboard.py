"""What the dashboard shows, as plain data built from the manager's views.

Nothing here reads the manager's records: the overview is made of `queues()`, `stats()` and
`list_jobs()`, a job's page of `get_job()` and its audit log (`why()`), so the dashboard says
exactly what the API and the CLI say. A queue token sees its own queue's jobs in full and the
other queues only as counts: its listings are scoped as `/v1/jobs` scopes them
(`dashboard_api.py`), and here a GPU held by another queue shows that queue, not the job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preemptible.queue.service import logs
from preemptible.queue.service.views import (
    EventView,
    JobState,
    JobView,
    Principal,
    QueueView,
    SignalsView,
    StatsView,
)

ACTIVE_STATES = (JobState.PENDING, JobState.RUNNING, JobState.PREEMPTING)
LOG_TAIL_BYTES = 16 * 1024
"""How much of the end of a job's output its page shows."""
CHECKPOINTS_SHOWN = 20
"""A job's page lists its newest checkpoints only; the total is given too."""


# --- views ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ViewerView:
    """Who is looking: the admin, or a queue's token."""

    kind: str
    name: str


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuView:
    """One GPU of the machine and who holds it."""

    index: int
    queue: str | None
    """The queue of the job holding it; None when free."""
    state: JobState | None
    job_id: str | None
    """None when free, or held by a queue this viewer sees only as counts."""
    job_name: str | None
    tier: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueRowView:
    """A queue on the overview: quota, usage, lending, fair share, depth and its signals."""

    queue: QueueView
    lent_gpus: float
    """The part of its idle nominal quota other queues are borrowing now."""
    fair_share_rank: int
    """1 for the queue furthest below its weighted share: the first served within a tier."""
    preempting: int
    signals: SignalsView


@dataclass(frozen=True, kw_only=True, slots=True)
class DashboardView:
    """`GET /v1/dashboard`: everything the overview polls for, in one answer."""

    at: float
    """The server's clock: waits are measured against it, not the browser's."""
    viewer: ViewerView
    gpus: list[GpuView]
    queues: list[QueueRowView]
    overall: SignalsView
    max_wait_least_served_s: float
    window_s: float
    jobs: list[JobView]
    """The jobs the filters select, of the queues this viewer sees in full, at most `limit`."""
    jobs_matching: int
    """How many jobs the filters select (more than `jobs` holds when over the limit)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptView:
    """One run of a job, from its admission to its exit."""

    number: int
    started_at: float
    ended_at: float | None
    gpu_ids: list[int]
    outcome: str
    """running, requeued, completed, failed or cancelled."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NoticeSummaryView:
    """A notice and what came of it: the grace given against the time the job took."""

    at: float
    attempt: int
    reason: str
    grace_s: float
    took_s: float | None
    """From SIGTERM to exit; None while the job is still on its way out."""
    killed: bool | None
    acked: bool | None
    lost_gpu_s: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointView:
    at: float
    step: int | None
    after_notice: bool
    """True for the save that acked a notice ("saved, exiting")."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NegotiatedView:
    """New terms for the job, from its reported cost and its observed exits."""

    at: float
    grace_s: float
    min_runtime_s: float
    save_s: float | None
    observed_exit_s: float | None
    interval_hint_s: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class LogTailView:
    """The end of the current attempt's output, from a line boundary."""

    text: str
    size: int
    truncated: bool
    """True when the output is longer than what is shown."""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobDetailView:
    """`GET /v1/jobs/{id}/detail`: a job's page."""

    job: JobView
    attempts: list[AttemptView]
    notices: list[NoticeSummaryView]
    checkpoints: list[CheckpointView]
    """The newest `CHECKPOINTS_SHOWN`, oldest first."""
    checkpoints_total: int
    negotiations: list[NegotiatedView]
    lost_gpu_s: float
    timeline: list[EventView]
    """Its audit log, oldest first."""
    log: LogTailView
    at: float
    """The server's clock."""


# --- the overview --------------------------------------------------------------------------------


def viewer(principal: Principal) -> ViewerView:
    return ViewerView(kind=principal.kind.value, name=principal.name)


def sees_in_full(principal: Principal, queue: str) -> bool:
    """The admin sees every job; a queue token its own queue's."""
    return principal.may_act_for_queue(queue)


def gpu_map(gpus: int, holders: list[JobView], principal: Principal) -> list[GpuView]:
    """Every GPU of the machine, free or held, as this viewer may see it."""
    by_gpu: dict[int, JobView] = {g: job for job in holders for g in job.gpu_ids}
    cells = []
    for index in range(gpus):
        job = by_gpu.get(index)
        if job is None:
            cells.append(
                GpuView(index=index, queue=None, state=None, job_id=None, job_name=None, tier=None)
            )
            continue
        full = sees_in_full(principal, job.queue)
        cells.append(
            GpuView(
                index=index,
                queue=job.queue,
                state=job.state,
                job_id=job.id if full else None,
                job_name=job.name if full else None,
                tier=job.tier if full else None,
            )
        )
    return cells


def lent_gpus(queues: list[QueueView], gpus: int) -> dict[str, float]:
    """The GPUs of each queue's idle nominal quota that other queues borrow now.

    Borrowers take first what no quota claims (the machine's GPUs beyond the sum of the
    nominal quotas); the rest comes out of idle quotas, shared in proportion to how much of
    each is idle. A queue without a nominal limit lends nothing.
    """
    borrowed = sum(q.borrowed_gpus for q in queues)
    nominal = [q.nominal_gpus for q in queues if q.nominal_gpus is not None]
    unclaimed = max(0.0, gpus - sum(nominal))
    idle = {
        q.name: max(0.0, q.nominal_gpus - q.used_gpus) if q.nominal_gpus is not None else 0.0
        for q in queues
    }
    from_quotas = max(0.0, borrowed - unclaimed)
    total_idle = sum(idle.values())
    if from_quotas <= 0 or total_idle <= 0:
        return dict.fromkeys(idle, 0.0)
    part = min(1.0, from_quotas / total_idle)
    return {name: spare * part for name, spare in idle.items()}


def fair_share_ranks(queues: list[QueueView]) -> dict[str, int]:
    """1 for the queue with the lowest fair-share value (furthest below its share)."""
    ordered = sorted(queues, key=lambda q: (q.fair_share, q.name))
    return {q.name: i + 1 for i, q in enumerate(ordered)}


def queue_rows(
    queues: list[QueueView], stats: StatsView, preempting: list[JobView], gpus: int
) -> list[QueueRowView]:
    lent = lent_gpus(queues, gpus)
    ranks = fair_share_ranks(queues)
    leaving: dict[str, int] = {}
    for job in preempting:
        leaving[job.queue] = leaving.get(job.queue, 0) + 1
    return [
        QueueRowView(
            queue=q,
            lent_gpus=lent[q.name],
            fair_share_rank=ranks[q.name],
            preempting=leaving.get(q.name, 0),
            signals=stats.queues[q.name],
        )
        for q in queues
    ]


# --- a job's page --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Story:
    """What a walk through a job's audit log has found so far."""

    attempts: list[AttemptView] = field(default_factory=list)
    notices: list[NoticeSummaryView] = field(default_factory=list)
    open_notice: EventView | None = None
    checkpoints: list[CheckpointView] = field(default_factory=list)
    negotiations: list[NegotiatedView] = field(default_factory=list)


def job_detail(
    job: JobView, history: list[EventView], log: LogTailView, now: float
) -> JobDetailView:
    """A job's page from its view and its events (any order)."""
    events = sorted(history, key=lambda e: e.id)
    story = _Story()
    for event in events:
        _read(story, event)
    if story.open_notice is not None:  # told, not gone yet
        story.notices.append(_notice(story, story.open_notice, None))
    checkpoints = story.checkpoints
    return JobDetailView(
        job=job,
        attempts=story.attempts,
        notices=story.notices,
        checkpoints=checkpoints[-CHECKPOINTS_SHOWN:],
        checkpoints_total=len(checkpoints),
        negotiations=story.negotiations,
        lost_gpu_s=sum(n.lost_gpu_s or 0.0 for n in story.notices),
        timeline=events,
        log=log,
        at=now,
    )


_ENDINGS = ("requeued", "completed", "failed", "cancelled")


def _read(story: _Story, event: EventView) -> None:
    data = event.data
    if event.kind == "admitted":
        gpu_ids = [int(g) for g in data.get("gpus", []) if isinstance(g, int | float)]
        number = len(story.attempts) + 1
        story.attempts.append(
            AttemptView(
                number=number,
                started_at=event.at,
                ended_at=None,
                gpu_ids=gpu_ids,
                outcome="running",
            )
        )
    elif event.kind == "notice":
        story.open_notice = event
    elif event.kind == "checkpointed":
        notice = story.open_notice
        story.checkpoints.append(
            CheckpointView(
                at=event.at,
                step=_int(data.get("step")),
                after_notice=notice is not None and event.at >= notice.at,
            )
        )
    elif event.kind == "negotiated":
        story.negotiations.append(
            NegotiatedView(
                at=event.at,
                grace_s=float(data.get("grace_s") or 0.0),
                min_runtime_s=float(data.get("min_runtime_s") or 0.0),
                save_s=_float(data.get("save_s")),
                observed_exit_s=_float(data.get("observed_exit_s")),
                interval_hint_s=_float(data.get("interval_hint_s")),
            )
        )
    elif event.kind in _ENDINGS:
        _end_attempt(story, event)


def _end_attempt(story: _Story, event: EventView) -> None:
    running = story.attempts[-1] if story.attempts else None
    if running is None or running.ended_at is not None:
        return  # cancelled while pending: no attempt to end
    story.attempts[-1] = dataclasses.replace(running, ended_at=event.at, outcome=event.kind)
    if "took_s" in event.data:  # the exit after a notice (a requeue, or a cancel)
        # A job found gone at a restart is requeued without a notice event: its requeue says it.
        story.notices.append(_notice(story, story.open_notice or event, event))
    story.open_notice = None


def _notice(story: _Story, notice: EventView, exit_event: EventView | None) -> NoticeSummaryView:
    data = exit_event.data if exit_event is not None else {}
    return NoticeSummaryView(
        at=notice.at,
        attempt=len(story.attempts),
        reason=notice.reason,
        grace_s=float(notice.data.get("grace_s") or data.get("grace_s") or 0.0),
        took_s=_float(data.get("took_s")),
        killed=_bool(data.get("killed")),
        acked=_bool(data.get("acked")),
        lost_gpu_s=_float(data.get("lost_gpu_s")),
    )


def tail_log(path: Path | None, limit: int = LOG_TAIL_BYTES) -> LogTailView:
    """The last `limit` bytes of a job's output, from the first whole line."""
    if path is None:
        return LogTailView(text="", size=0, truncated=False)
    text, size, truncated = logs.tail(path, limit)
    return LogTailView(text=text, size=size, truncated=truncated)


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None
