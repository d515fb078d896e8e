"""The queue manager's HTTP API (docs/maintainers/design.md, "Service"): routes and models.

The routes of `/v1` for jobs, queues, notices, costs and events. This module owns the requests'
and answers' shapes (pydantic models that mirror `views.py`, field for field) and asks who may
do what of `access.py`; who is calling and the error shape are the shared edge
(`http_edge.py`), and `app.py` assembles the app. Everything it knows about jobs it asks the
manager; it keeps no state of its own.

Every error, whatever raised it (the manager, validation, routing, a body too large, a bug),
answers `{"error": {"code", "message"}}`, and every status a route can answer is documented in
its OpenAPI `responses`, which a schemathesis test checks. Routes are plain `def`, so FastAPI
runs them in its thread pool; the notice long-poll runs in a thread pool of its own, as large as
the connections the server takes (each poll holds one), so that jobs waiting for notices never
starve the other routes and a poll never waits for a thread; one job may have `notice_polls` of
them waiting at once ([service]), and is answered 429 beyond.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
from fastapi import APIRouter, Query, Request
from fastapi.datastructures import URL
from fastapi.responses import Response
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    TypeAdapter,
    WithJsonSchema,
)

from preemptible._version import __version__
from preemptible.errors import JobNotFoundError
from preemptible.queue import arrays
from preemptible.queue.core.model import Tier
from preemptible.queue.service.access import (
    check_job_access,
    check_may_submit,
    check_own_job,
    check_team_or_admin,
    queue_scope,
)
from preemptible.queue.service.http_edge import (
    Anonymous,
    Caller,
    Manager,
    charge_listing,
    error_responses,
)
from preemptible.queue.service.limits import RateLimitedError, WaitSlots
from preemptible.queue.service.logs import read_log_slice
from preemptible.queue.service.metrics import CONTENT_TYPE, ApiMetrics
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
)

MAX_INT = 2**53 - 1
"""The largest integer a field or parameter takes: the largest JSON carries exactly (a
JavaScript number), well within what SQLite and a file offset hold."""
MAX_NOTICE_WAIT_S = 60.0
"""A notice long-poll waits at most this long, whatever `wait` asks."""
DEFAULT_PAGE = 500
"""Jobs or events in one answer of a listing unless `limit` says otherwise (about 240 KiB of
jobs); `Link: <...>; rel="next"` says where the next page is."""
MAX_PAGE = 1000
"""The most jobs or events one answer holds, whatever `limit` asks."""
DEFAULT_LOG_CHUNK = 256 * 1024
MAX_LOG_CHUNK = 1024 * 1024


# --- models: requests ---------------------------------------------------------------------------
# Numbers are JSON numbers: "2" is refused (pydantic's lax mode would take it), 2.0 is the
# integer 2 (JSON Schema says so), and no field takes NaN or infinity.


def _json_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return value


_NUMBER = BeforeValidator(_json_number)  # after the Field, so the schema keeps the bounds
_NO_NUL = r"^[^\x00]*$"  # execve and environment strings cannot hold NUL
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
Arg = Annotated[str, StringConstraints(max_length=4096, pattern=_NO_NUL)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=_ENV_NAME)]
Env = Annotated[
    dict[EnvName, Arg],
    Field(max_length=128),
    # pydantic writes key constraints as patternProperties, which let any other key through;
    # propertyNames says what is checked.
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 128,
            "propertyNames": {"minLength": 1, "maxLength": 256, "pattern": _ENV_NAME},
            "additionalProperties": {"type": "string", "maxLength": 4096, "pattern": _NO_NUL},
        }
    ),
]
Directory = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=_NO_NUL)]
_YEAR_S = 365 * 86400.0
_WEEK_S = 7 * 86400.0


AfterSpec = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}(:(ok|any|started))?$")]
"""A dependency: a job's id, and optionally ":ok", ":any" or ":started"."""
ArraySpecText = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[0-9,:%-]+$")
]
"""Indices and ranges ("0-99", "1,3,10-20:2"), then optionally "%LIMIT"."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SubmitBody(_Request):
    """`POST /v1/jobs`: the fields of `views.SubmitRequest`."""

    queue: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=_NO_NUL)]
    command: Annotated[list[Arg], Field(min_length=1, max_length=256)]
    gpus: Annotated[int, Field(ge=0, le=1024), _NUMBER] = 0
    tier: Tier = Tier.NORMAL
    cpus: Annotated[float, Field(ge=0, le=65536), _NUMBER] = 0.0
    memory_gb: Annotated[float, Field(ge=0, le=1 << 20), _NUMBER] = 0.0
    gang: StrictBool | None = None
    estimate_s: Annotated[float, Field(gt=0, le=10 * _YEAR_S), _NUMBER] | None = None
    name: Annotated[str, StringConstraints(max_length=200, pattern=_NO_NUL)] | None = None
    env: Env = Field(default_factory=dict)
    cwd: Directory | None = None
    min_gpus: Annotated[int, Field(ge=1, le=1024), _NUMBER] | None = None
    gpus_multiple: Annotated[int, Field(ge=1, le=1024), _NUMBER] = 1
    max_restarts: Annotated[int, Field(ge=0, le=1000), _NUMBER] | None = None
    """Restarts after a crash or a hang; more than the queue allows is refused (422)."""
    hang_after_s: Annotated[float, Field(gt=0, le=_WEEK_S), _NUMBER] | None = None
    hold: StrictBool = False
    """Submit it held: it waits out of its queue until released."""
    after: Annotated[list[AfterSpec], Field(max_length=64)] = Field(default_factory=list)
    """Jobs it waits for: "ID" or "ID:ok" (succeeded), "ID:any" (finished), "ID:started"."""
    array: ArraySpecText | None = None
    """An array of jobs, as `sbatch --array`: "0-99%8" is indices 0 to 99, at most 8 in their
    queue or running at once; the answer is the first job's, its `array_id` names them all."""

    def to_view(self) -> SubmitRequest:
        return SubmitRequest(**self.model_dump())


class CostBody(BaseModel):
    """`POST /v1/jobs/{id}/cost`: the cost file's JSON; its other fields are ignored.

    A save, stall or restore of more than a week is a mistake (and would negotiate a minimum
    runtime no float holds)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    save_seconds_p95: Annotated[float, Field(ge=0, le=_WEEK_S), _NUMBER] | None = None
    stall_seconds_p95: Annotated[float, Field(ge=0, le=_WEEK_S), _NUMBER] | None = None
    restore_seconds: Annotated[float, Field(ge=0, le=_WEEK_S), _NUMBER] | None = None
    upload_seconds_p95: Annotated[float, Field(ge=0, le=_WEEK_S), _NUMBER] | None = None
    """Two tiers: the upload after the local commit that `save_seconds_p95` measures. Shown,
    not negotiated: the next attempt runs on this machine and reads the local tier."""
    bytes: Annotated[int, Field(ge=0, le=MAX_INT), _NUMBER] | None = None
    last_checkpoint_step: Annotated[int, Field(ge=0, le=MAX_INT), _NUMBER] | None = None
    last_checkpoint_time: Annotated[float, Field(ge=0), _NUMBER] | None = None

    def to_view(self) -> CostView:
        # observed_exit_seconds is what the manager saw, never what the job claims.
        return CostView(**self.model_dump())


class ProgressBody(BaseModel):
    """`POST /v1/jobs/{id}/progress`: the job's step, and its slowest step since the last."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    step: Annotated[int, Field(ge=0, le=MAX_INT), _NUMBER]
    step_seconds: Annotated[float, Field(ge=0, le=_WEEK_S), _NUMBER] | None = None
    checkpoint_step: Annotated[int, Field(ge=0, le=MAX_INT), _NUMBER] | None = None
    """The newest committed checkpoint, as in the cost report (which is rate-limited)."""
    checkpoint_time: Annotated[float, Field(ge=0), _NUMBER] | None = None


class CheckpointedBody(_Request):
    """`POST /v1/jobs/{id}/checkpointed`: a checkpoint of `step` was committed at `at`."""

    step: Annotated[int, Field(ge=0, le=MAX_INT), _NUMBER]
    at: Annotated[float, Field(ge=0), _NUMBER] | None = None
    kind: Literal["preempt", "resize"] | None = None
    """The SDK says which notice it saved for (the manager knows already: it is not used)."""
    gpus: Annotated[int, Field(ge=1, le=1024), _NUMBER] | None = None
    """With `kind` "resize": the size it restarts at, as the notice said."""


# --- models: answers ----------------------------------------------------------------------------
# The manager's views (views.py) are the answers themselves; these wrap or add to them.


class NoticeAnswer(BaseModel):
    notice: NoticeView | None


class CheckpointedAnswer(BaseModel):
    ok: bool = True


class LogChunk(BaseModel):
    """A slice of a job's output file; ask again from `next_offset` to follow it."""

    job_id: str
    attempt: int | None
    """The attempt asked for (None: the latest)."""
    offset: int
    next_offset: int
    size: int
    """The file's size when read."""
    text: str
    state: JobState
    """The job's state before the file was read: once finished, an empty chunk is the end."""


class Health(BaseModel):
    status: str = "ok"
    version: str = __version__


# --- routes --------------------------------------------------------------------------------------


router = APIRouter(prefix="/v1", responses=error_responses(401, 403, 422, 429, 503))
_JOB = error_responses(404)
_BODY = error_responses(400, 413)


@router.post(
    "/jobs",
    status_code=201,
    responses={**_BODY, **error_responses(404)},
    summary="Submit a job (404: a job it would wait for does not exist)",
)
def submit(request: Request, body: SubmitBody, principal: Caller, manager: Manager) -> JobView:
    check_may_submit(principal, body.queue)
    for dependency in body.after:  # a job may wait only for jobs its submitter may see
        named = dependency.split(":")[0]
        members = manager.list_jobs(array=named, limit=1) if arrays.is_array_id(named) else []
        check_job_access(manager, principal, members[0].id if members else named)
    job = manager.submit(body.to_view(), by=principal)
    if body.array is not None and job.array_id is not None:  # charged as a listing of its jobs
        charge_listing(request, principal, len(arrays.parse(body.array).indices))
    return job


_NEXT_PAGE: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "Link": {
                "description": 'Where the next page is (`<URL>; rel="next"`), when there may be '
                "more; follow it until an answer has no Link",
                "schema": {"type": "string"},
            }
        }
    }
}


_JOB_LIST = TypeAdapter(list[JobView])
_EVENT_LIST = TypeAdapter(list[EventView])


def _page(
    request: Request, adapter: TypeAdapter[Any], items: list[Any], **cursor: str | int
) -> Response:
    """A page of a listing as JSON, written in one pass (`dump_json`; what FastAPI does with a
    returned list, validate, convert and dump, costs four times as much); with `cursor`, a
    `Link` to the next page: the same query from there."""
    response = Response(adapter.dump_json(items), media_type="application/json")
    if cursor:
        url = URL(request.url.path).include_query_params(**{**request.query_params, **cursor})
        response.headers["Link"] = f'<{url}>; rel="next"'
    return response


@router.get(
    "/jobs",
    response_model=list[JobView],
    responses={**error_responses(400), **_NEXT_PAGE},
    summary="List jobs, oldest first, a page at a time",
)
def list_jobs(
    request: Request,
    principal: Caller,
    manager: Manager,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    state: JobState | None = None,
    after: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    array: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Jobs in submission order: the first `limit` submitted after the job `after` (its id;
    none: from the first), of one queue, state or array (its id, "a7"). A full page ends with
    `Link: <...>; rel="next"`."""
    scope = queue_scope(principal, queue)
    found = manager.list_jobs(queue=scope, state=state, after=after, limit=limit + 1, array=array)
    more = len(found) > limit
    found = found[:limit]
    charge_listing(request, principal, len(found))
    return _page(request, _JOB_LIST, found, **({"after": found[-1].id} if more else {}))


@router.get("/jobs/{job_id}", responses=_JOB, summary="One job")
def get_job(job_id: str, principal: Caller, manager: Manager) -> JobView:
    check_job_access(manager, principal, job_id)
    return manager.get_job(job_id)


@router.delete(
    "/jobs/{job_id}",
    status_code=202,
    responses={**_JOB, **error_responses(409)},
    summary="Cancel a job: notice, grace, kill",
)
def cancel(job_id: str, principal: Caller, manager: Manager) -> JobView:
    check_job_access(manager, principal, job_id)
    return manager.cancel(job_id, by=principal)


@router.post(
    "/jobs/{job_id}/hold",
    responses={**_JOB, **error_responses(409)},
    summary="Keep a pending job out of its queue until released",
)
def hold(job_id: str, principal: Caller, manager: Manager) -> JobView:
    check_job_access(manager, principal, job_id)
    return manager.hold(job_id, by=principal)


@router.post(
    "/jobs/{job_id}/release",
    responses={**_JOB, **error_responses(409)},
    summary="Put a held job back in its queue",
)
def release(job_id: str, principal: Caller, manager: Manager) -> JobView:
    check_job_access(manager, principal, job_id)
    return manager.release(job_id, by=principal)


class PriorityBody(_Request):
    """`POST /v1/jobs/{id}/priority`: the pending job's new tier."""

    tier: Tier


@router.post(
    "/jobs/{job_id}/priority",
    responses={**_JOB, **_BODY, **error_responses(409)},
    summary="Move a pending job to another tier (it keeps its place by submission time)",
)
def priority(job_id: str, body: PriorityBody, principal: Caller, manager: Manager) -> JobView:
    check_job_access(manager, principal, job_id)
    return manager.set_tier(job_id, body.tier.value, by=principal)


@router.get("/jobs/{job_id}/why", responses=_JOB, summary="Why pending, why preempted")
def why(job_id: str, principal: Caller, manager: Manager) -> WhyView:
    check_job_access(manager, principal, job_id)
    return manager.why(job_id)


@router.post(
    "/jobs/{job_id}/cost",
    responses={**_JOB, **_BODY, **error_responses(409)},
    summary="Report the job's measured checkpoint cost (the job's token)",
)
def report_cost(
    job_id: str, body: CostBody, principal: Caller, manager: Manager
) -> NegotiationView:
    check_own_job(principal, job_id)
    return manager.report_cost(job_id, body.to_view(), by=principal)


@router.post(
    "/jobs/{job_id}/progress",
    responses={**_JOB, **_BODY, **error_responses(409)},
    summary="The job's step, for the hang watch (the job's token)",
)
def progress(
    job_id: str, body: ProgressBody, principal: Caller, manager: Manager
) -> CheckpointedAnswer:
    check_own_job(principal, job_id)
    checkpoint = (
        None
        if body.checkpoint_step is None or body.checkpoint_time is None
        else (body.checkpoint_step, body.checkpoint_time)
    )
    manager.progress(job_id, step=body.step, step_s=body.step_seconds, checkpoint=checkpoint)
    return CheckpointedAnswer()


@router.get(
    "/jobs/{job_id}/notice",
    responses=_JOB,
    summary="Long-poll for a preemption notice (the job's token)",
)
async def notice(
    request: Request,
    job_id: str,
    principal: Caller,
    manager: Manager,
    wait: Annotated[float, Query(ge=0, allow_inf_nan=False)] = 0.0,
) -> NoticeAnswer:
    check_own_job(principal, job_id)
    state = request.app.state
    slots: WaitSlots = state.notice_slots
    if not slots.acquire(principal):
        raise RateLimitedError(
            f"{principal.describe()} has {slots.per_key} notice long-polls waiting already; "
            "one is enough (each answers as soon as a notice is sent)",
            retry_after_s=1.0,
        )
    try:
        if state.notice_limiter is None:  # made in the event loop, on first use
            state.notice_limiter = anyio.CapacityLimiter(state.notice_threads)
        found = await anyio.to_thread.run_sync(
            manager.wait_notice, job_id, min(wait, MAX_NOTICE_WAIT_S), limiter=state.notice_limiter
        )
    finally:
        slots.release(principal)
    return NoticeAnswer(notice=found)


@router.post(
    "/jobs/{job_id}/checkpointed",
    responses={**_JOB, **_BODY, **error_responses(409)},
    summary="A checkpoint is committed; after a notice: exiting now (the job's token)",
)
def checkpointed(
    job_id: str, body: CheckpointedBody, principal: Caller, manager: Manager
) -> CheckpointedAnswer:
    check_own_job(principal, job_id)
    manager.checkpointed(job_id, step=body.step, at=body.at, by=principal)
    return CheckpointedAnswer()


@router.get(
    "/jobs/{job_id}/logs",
    responses=_JOB,
    summary="A slice of the job's output from `offset` (follow with `next_offset`)",
)
def logs(
    job_id: str,
    principal: Caller,
    manager: Manager,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_INT)] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    limit: Annotated[int, Query(ge=1024, le=MAX_LOG_CHUNK)] = DEFAULT_LOG_CHUNK,
) -> LogChunk:
    check_job_access(manager, principal, job_id)
    state = manager.get_job(job_id).state  # first: once finished, the file is complete
    try:
        path: Path | None = manager.log_path(job_id, attempt)
    except JobNotFoundError:
        if attempt is not None:
            raise
        path = None  # the job exists but has not started: no output yet
    text, next_offset, size = (
        ("", offset, 0) if path is None else read_log_slice(path, offset, limit)
    )
    return LogChunk(
        job_id=job_id,
        attempt=attempt,
        offset=offset,
        next_offset=next_offset,
        size=size,
        text=text,
        state=state,
    )


@router.get("/queues", summary="Queues with quota, usage and fair share (queue or admin token)")
def queues(principal: Caller, manager: Manager) -> list[QueueView]:
    check_team_or_admin(principal)
    return manager.queues()


@router.get("/stats", summary="The four signals per queue and overall (queue or admin token)")
def stats(principal: Caller, manager: Manager) -> StatsView:
    check_team_or_admin(principal)
    return manager.stats()


@router.get(
    "/events",
    response_model=list[EventView],
    responses=_NEXT_PAGE,
    summary="The audit log, oldest first, a page at a time",
)
def events(
    request: Request,
    principal: Caller,
    manager: Manager,
    since: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    job_id: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> Response:
    """Events after the id `since`, at most `limit`; a full page ends with `Link: <...>;
    rel="next"` (the same query from the last id)."""
    scope = queue_scope(principal, queue)
    found = manager.events(since=since, queue=scope, job_id=job_id, limit=limit + 1)
    more = len(found) > limit
    found = found[:limit]
    charge_listing(request, principal, len(found))
    return _page(request, _EVENT_LIST, found, **({"since": found[-1].id} if more else {}))


def _json_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`error_responses` for a route whose answers are not JSON: its errors still are."""
    ref = {"$ref": "#/components/schemas/ErrorAnswer"}
    return {
        status: {
            "description": answer["description"],
            "content": {"application/json": {"schema": ref}},
        }
        for status, answer in error_responses(*statuses).items()
    }


class _PrometheusText(Response):
    media_type = CONTENT_TYPE


plain_router = APIRouter(responses=error_responses(503))


@plain_router.get(
    "/metrics",
    response_class=_PrometheusText,
    responses={200: {"description": "Prometheus text format"}, **_json_errors(429, 503)},
    dependencies=[Anonymous],
    summary="Prometheus metrics (no token; the callers without one share one rate limit)",
)
def prometheus(request: Request) -> Response:
    metrics: ApiMetrics = request.app.state.metrics
    return _PrometheusText(metrics.render())


@plain_router.get("/healthz", summary="Liveness (no token)")
def healthz() -> Health:
    return Health()


__all__ = [
    "MAX_NOTICE_WAIT_S",
    "CheckpointedBody",
    "CostBody",
    "SubmitBody",
    "plain_router",
    "router",
]
