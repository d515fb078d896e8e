"""The queue manager's HTTP API (docs/maintainers/design.md, "Service"): routes, checks, errors.

`create_app(manager)` wraps a `QueueManager` in a FastAPI app. This module owns the edge only:
who is calling (`auth.py`) and what they may reach (`access.py`), the shape of requests and
answers (pydantic models that mirror `views.py`, field for field), and the mapping from the
shared error tree to HTTP statuses.
Everything it knows about jobs it asks the manager; it keeps no state of its own.

Every error, whatever raised it (the manager, validation, routing, a body too large, a bug),
answers `{"error": {"code", "message"}}`, and every status a route can answer is documented in
its OpenAPI `responses`, which a schemathesis test checks. Routes are plain `def`, so FastAPI
runs them in its thread pool; the notice long-poll runs in a thread pool of its own, so that
jobs waiting for notices never starve the other routes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    WithJsonSchema,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preemptible._version import __version__
from preemptible.errors import (
    AccessDeniedError,
    ConfigError,
    JobNotFoundError,
    JobStateError,
    RequestError,
)
from preemptible.queue.core.config import QueueConfig
from preemptible.queue.service.access import (
    check_job_access,
    check_may_submit,
    check_own_job,
    queue_scope,
)
from preemptible.queue.service.auth import (
    AuthenticationError,
    Authenticator,
    Principal,
    Tokens,
    resolve_tokens,
)
from preemptible.queue.service.logs import read_log_slice
from preemptible.queue.service.metrics import CONTENT_TYPE, ApiMetrics, LatencyMiddleware
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

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
MAX_INT = 2**53 - 1
"""The largest integer a field or parameter takes: the largest JSON carries exactly (a
JavaScript number), well within what SQLite and a file offset hold."""
"""Largest request body accepted; a larger one is answered 413 before it is read."""
MAX_NOTICE_WAIT_S = 60.0
"""A notice long-poll waits at most this long, whatever `wait` asks."""
NOTICE_POLLERS = 256
"""Threads for notice long-polls (one per running job is enough)."""
DEFAULT_LOG_CHUNK = 256 * 1024
MAX_LOG_CHUNK = 1024 * 1024


class QueueManagerProtocol(Protocol):
    """What the HTTP layer asks of the manager (`manager.QueueManager` implements it).

    The methods are called from many threads at once, and `wait_notice` blocks for up to
    `wait_s`; `job_for_token` is called on the event loop and must never block. They raise
    the shared errors (`RequestError`, `JobNotFoundError`,
    `JobStateError`, `AccessDeniedError`), which become 400, 404, 409 and 403.
    """

    @property
    def config(self) -> QueueConfig: ...
    def submit(self, req: SubmitRequest) -> JobView: ...
    def list_jobs(
        self, *, queue: str | None = None, state: JobState | None = None
    ) -> list[JobView]: ...
    def get_job(self, job_id: str) -> JobView: ...
    def cancel(self, job_id: str) -> JobView: ...
    def why(self, job_id: str) -> WhyView: ...
    def report_cost(self, job_id: str, cost: CostView) -> NegotiationView: ...
    def wait_notice(self, job_id: str, wait_s: float) -> NoticeView | None: ...
    def checkpointed(self, job_id: str, *, step: int, at: float | None) -> None: ...
    def queues(self) -> list[QueueView]: ...
    def stats(self) -> StatsView: ...
    def events(
        self,
        *,
        since: int = 0,
        queue: str | None = None,
        job_id: str | None = None,
        limit: int = 1000,
    ) -> list[EventView]: ...
    def log_path(self, job_id: str, attempt: int | None = None) -> Path: ...
    def job_queue(self, job_id: str) -> str: ...
    def job_for_token(self, token: str) -> str | None: ...
    def metrics_snapshot(self) -> dict[str, Any]: ...


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
Tier = Literal["critical", "high", "normal", "low"]
_YEAR_S = 365 * 86400.0
_WEEK_S = 7 * 86400.0


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SubmitBody(_Request):
    """`POST /v1/jobs`: the fields of `views.SubmitRequest`."""

    queue: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=_NO_NUL)]
    command: Annotated[list[Arg], Field(min_length=1, max_length=256)]
    gpus: Annotated[int, Field(ge=0, le=1024), _NUMBER] = 0
    tier: Tier = "normal"
    cpus: Annotated[float, Field(ge=0, le=65536), _NUMBER] = 0.0
    memory_gb: Annotated[float, Field(ge=0, le=1 << 20), _NUMBER] = 0.0
    gang: StrictBool | None = None
    estimate_s: Annotated[float, Field(gt=0, le=10 * _YEAR_S), _NUMBER] | None = None
    name: Annotated[str, StringConstraints(max_length=200, pattern=_NO_NUL)] | None = None
    env: Env = Field(default_factory=dict)
    cwd: Directory | None = None

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
    bytes: Annotated[int, Field(ge=0, le=MAX_INT), _NUMBER] | None = None
    last_checkpoint_step: Annotated[int, Field(ge=0, le=MAX_INT), _NUMBER] | None = None
    last_checkpoint_time: Annotated[float, Field(ge=0), _NUMBER] | None = None

    def to_view(self) -> CostView:
        # observed_exit_seconds is what the manager saw, never what the job claims.
        return CostView(**self.model_dump())


class CheckpointedBody(_Request):
    """`POST /v1/jobs/{id}/checkpointed`: a checkpoint of `step` was committed at `at`."""

    step: Annotated[int, Field(ge=0, le=MAX_INT), _NUMBER]
    at: Annotated[float, Field(ge=0), _NUMBER] | None = None


# --- models: answers ----------------------------------------------------------------------------
# The manager's views (views.py) are the answers themselves; these wrap or add to them.


class ErrorDetail(BaseModel):
    code: str
    """A stable word: unauthenticated, forbidden, not_found, conflict, invalid_request..."""
    message: str
    """What is wrong and what to do."""


class ErrorAnswer(BaseModel):
    """Every 4xx and 5xx answer."""

    error: ErrorDetail


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


# --- errors --------------------------------------------------------------------------------------

_DESCRIPTIONS = {
    400: "The body is not JSON, or asks the impossible (an unknown queue, too many GPUs...).",
    401: "No token, or one this server does not know.",
    403: "The token is valid but not for this queue or job.",
    404: "No job (or attempt) with this id.",
    409: "The job's state does not allow this (it has finished, or is not running).",
    413: "The request body is larger than the server accepts.",
    422: "The request does not match the schema; the message names the field.",
}
_CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_request",
    500: "internal",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's OpenAPI `responses` for these error statuses: the error shape and what each
    status means here. Every status a route can answer is listed (a test checks it)."""
    return {s: {"model": ErrorAnswer, "description": _DESCRIPTIONS[s]} for s in statuses}


def error_response(
    status: int, message: str, *, code: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The one error shape: `{"error": {"code": ..., "message": ...}}`."""
    body = {"error": {"code": code or _CODES.get(status, "error"), "message": message}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = [str(p) for p in error.get("loc", ())]
        where, field = (loc[0], ".".join(loc[1:])) if loc else ("request", "")
        kind = error.get("type", "")
        if kind == "json_invalid":
            ctx = error.get("ctx") or {}
            parts.append(f"the body is not valid JSON ({ctx.get('error', 'decode error')})")
        elif where == "body" and not field and kind == "missing":
            parts.append("the request needs a JSON body")
        elif field:
            parts.append(f"{where} field '{field}': {error.get('msg', 'invalid')}")
        else:
            parts.append(f"{where}: {error.get('msg', 'invalid')}")
    more = len(exc.errors()) - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _install_error_handlers(app: FastAPI) -> None:
    mapping: list[tuple[type[Exception], int]] = [
        (AuthenticationError, 401),
        (AccessDeniedError, 403),
        (JobNotFoundError, 404),
        (JobStateError, 409),
        (RequestError, 400),
        (ConfigError, 400),  # a request naming what the configuration lacks (a queue...)
    ]
    for exc_type, status in mapping:

        def handler(_: Request, exc: Exception, status: int = status) -> JSONResponse:
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            return error_response(status, str(exc), headers=headers)

        app.add_exception_handler(exc_type, handler)

    def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, _validation_message(exc))

    def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
            return error_response(
                405,
                f"{request.method} is not allowed here; use {headers['Allow']}",
                headers=headers,
            )
        if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
            # FastAPI says 400 here but 422 for other JSON that does not parse: one answer.
            return error_response(422, f"the body is not UTF-8 JSON ({exc.__cause__.reason})")
        return error_response(exc.status_code, str(exc.detail), headers=headers)

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


def _allowed_methods(request: Request) -> list[str]:
    """Every method our routes serve at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    routers: list[APIRouter] = request.app.state.routers
    for route in (r for included in routers for r in included.routes):
        if isinstance(route, APIRoute) and route.path_regex.match(request.url.path):
            methods |= route.methods or set()
    return sorted(methods)


class _CatchAllMiddleware:
    """Turns an unexpected exception into a logged 500 in the error shape.

    An `Exception` handler registered on the app would answer too, but Starlette re-raises
    it afterwards, so the server logs it a second time with its own words.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            # The traceback names the route and the error, never the Authorization header.
            logger.exception("unexpected error in %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            response = error_response(
                500, "internal error in the queue manager; its log has the details"
            )
            await response(scope, receive, send)


class _BodyLimitMiddleware:
    """Refuses request bodies over `limit` bytes with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        too_large = f"the request body is larger than {self.limit} bytes; send less"
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await error_response(400, "Content-Length is not a number")(scope, receive, send)
                return
            if length > self.limit:
                await error_response(413, too_large)(scope, receive, send)
                return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, too_large)
            return message

        await self.app(scope, counting_receive, send)


# --- the app -------------------------------------------------------------------------------------


def create_app(
    manager: QueueManagerProtocol,
    *,
    tokens: Tokens | None = None,
    environ: Mapping[str, str] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """The HTTP API of docs/maintainers/design.md over `manager`.

    Args:
        manager: the queue manager (thread-safe; see `QueueManagerProtocol`).
        tokens: the admin and queue tokens; default: resolved from `manager.config`.
        environ: where `env:` token specs are read when `tokens` is not given (`os.environ`).
        max_body_bytes: largest request body accepted (413 beyond).

    Raises:
        ConfigError: a token spec names a missing environment variable.
    """
    if tokens is None:
        tokens = resolve_tokens(manager.config, os.environ if environ is None else environ)
    metrics = ApiMetrics(manager)
    app = FastAPI(
        title="preemptible queue manager",
        version=__version__,
        description="Jobs, queues, notices and the four signals of one shared GPU machine.",
    )
    app.state.manager = manager
    app.state.authenticator = Authenticator(tokens, manager.job_for_token)
    app.state.metrics = metrics
    app.state.notice_limiter = None  # created in the event loop, on first use
    _install_error_handlers(app)
    app.add_middleware(_BodyLimitMiddleware, limit=max_body_bytes)
    app.add_middleware(_CatchAllMiddleware)
    app.add_middleware(LatencyMiddleware, metrics=metrics)
    app.include_router(router)
    app.include_router(plain_router)
    app.state.routers = [router, plain_router]  # what a 405's Allow header is made from
    # Imported here: the dashboard's routes are built on this module's dependencies.
    from preemptible.queue.service.dashboard_api import install_dashboard

    install_dashboard(app)
    _document_queues(app, [q.name for q in manager.config.queues])
    return app


def _document_queues(app: FastAPI, names: list[str]) -> None:
    """Name this server's queues in the schema (the manager refuses others with 400)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()  # cached by FastAPI after the first call
        queue = schema["components"]["schemas"]["SubmitBody"]["properties"]["queue"]
        queue["enum"] = names
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way


_bearer = HTTPBearer(
    auto_error=False,
    description="A queue token, the admin token, or a job's own token (PREEMPTIBLE_TOKEN).",
)


# The dependencies are `async` (they never block): a plain `def` would cost each request two
# more round trips through the thread pool, which is most of a submission's CPU.
async def _manager(request: Request) -> QueueManagerProtocol:
    manager: QueueManagerProtocol = request.app.state.manager
    return manager


async def _caller(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
) -> Principal:
    authenticator: Authenticator = request.app.state.authenticator
    return authenticator.authenticate(request.headers.get("authorization"))


Manager = Annotated[QueueManagerProtocol, Depends(_manager)]
Caller = Annotated[Principal, Depends(_caller)]


router = APIRouter(prefix="/v1", responses=error_responses(401, 403, 422))
_JOB = error_responses(404)
_BODY = error_responses(400, 413)


@router.post("/jobs", status_code=201, responses=_BODY, summary="Submit a job")
def submit(body: SubmitBody, principal: Caller, manager: Manager) -> JobView:
    check_may_submit(principal, body.queue)
    return manager.submit(body.to_view())


@router.get("/jobs", summary="List jobs")
def list_jobs(
    principal: Caller,
    manager: Manager,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    state: JobState | None = None,
) -> list[JobView]:
    scope = queue_scope(principal, queue)
    return manager.list_jobs(queue=scope, state=state)


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
    return manager.cancel(job_id)


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
    return manager.report_cost(job_id, body.to_view())


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
    if state.notice_limiter is None:
        state.notice_limiter = anyio.CapacityLimiter(NOTICE_POLLERS)
    found = await anyio.to_thread.run_sync(
        manager.wait_notice, job_id, min(wait, MAX_NOTICE_WAIT_S), limiter=state.notice_limiter
    )
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
    manager.checkpointed(job_id, step=body.step, at=body.at)
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


@router.get("/queues", summary="Queues with quota, usage and fair share (any token)")
def queues(principal: Caller, manager: Manager) -> list[QueueView]:
    return manager.queues()


@router.get("/stats", summary="The four signals per queue and overall (any token)")
def stats(principal: Caller, manager: Manager) -> StatsView:
    return manager.stats()


@router.get("/events", summary="The audit log, oldest first")
def events(
    principal: Caller,
    manager: Manager,
    since: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    job_id: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
) -> list[EventView]:
    scope = queue_scope(principal, queue)
    found = manager.events(since=since, queue=scope, job_id=job_id, limit=limit)
    return found


class _PrometheusText(Response):
    media_type = CONTENT_TYPE


plain_router = APIRouter()


@plain_router.get(
    "/metrics",
    response_class=_PrometheusText,
    responses={200: {"description": "Prometheus text format"}},
    summary="Prometheus metrics (no token)",
)
def prometheus(request: Request) -> Response:
    metrics: ApiMetrics = request.app.state.metrics
    return _PrometheusText(metrics.render())


@plain_router.get("/healthz", summary="Liveness (no token)")
def healthz() -> Health:
    return Health()


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_NOTICE_WAIT_S",
    "Caller",
    "Manager",
    "QueueManagerProtocol",
    "Tier",
    "create_app",
    "error_response",
    "error_responses",
]
