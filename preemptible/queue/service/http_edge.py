"""The HTTP edge that the API's routes and the dashboard's share: who calls, the error shape.

`api.py` (jobs, queues, notices) and `dashboard_api.py` (the page's answers) both build on what
is here: the manager and caller dependencies, the one error shape with its OpenAPI description,
and the middleware that keeps every answer in that shape. `app.py` assembles the app above
them, so neither router imports the other.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preemptible.errors import (
    AccessDeniedError,
    ConfigError,
    JobNotFoundError,
    JobSpecError,
    JobStateError,
    RequestError,
    StateStoreError,
)
from preemptible.queue.core.config import QueueConfig
from preemptible.queue.service.auth import AuthenticationError, Authenticator
from preemptible.queue.service.limits import RateLimitedError, RateLimiter
from preemptible.queue.service.views import (
    CostView,
    EventView,
    JobState,
    JobView,
    NegotiationView,
    NoticeView,
    Principal,
    QueueView,
    StatsView,
    SubmitRequest,
    TokenOwner,
    WhyView,
)

logger = logging.getLogger(__name__)


class QueueManagerProtocol(Protocol):
    """What the HTTP layer asks of the manager (`manager.QueueManager` implements it).

    The methods are called from many threads at once, and `wait_notice` blocks for up to
    `wait_s`; `job_for_token` is called on the event loop and must never block. Each change
    takes `by`, the caller, for the audit log (None: not asked over HTTP). They raise
    the shared errors (`RequestError`, `JobNotFoundError`,
    `JobStateError`, `AccessDeniedError`), which become 400, 404, 409 and 403.
    """

    @property
    def config(self) -> QueueConfig: ...
    def submit(self, req: SubmitRequest, *, by: Principal | None = None) -> JobView: ...
    def list_jobs(
        self,
        *,
        queue: str | None = None,
        state: JobState | None = None,
        after: str | None = None,
        limit: int | None = None,
        array: str | None = None,
    ) -> list[JobView]: ...
    def get_job(self, job_id: str) -> JobView: ...
    def cancel(self, job_id: str, *, by: Principal | None = None) -> JobView: ...
    def hold(self, job_id: str, *, by: Principal | None = None) -> JobView: ...
    def release(self, job_id: str, *, by: Principal | None = None) -> JobView: ...
    def set_tier(self, job_id: str, tier: str, *, by: Principal | None = None) -> JobView: ...
    def why(self, job_id: str) -> WhyView: ...
    def report_cost(
        self, job_id: str, cost: CostView, *, by: Principal | None = None
    ) -> NegotiationView: ...
    def wait_notice(self, job_id: str, wait_s: float) -> NoticeView | None: ...
    def checkpointed(
        self, job_id: str, *, step: int, at: float | None, by: Principal | None = None
    ) -> None: ...
    def progress(
        self,
        job_id: str,
        *,
        step: int,
        step_s: float | None,
        checkpoint: tuple[int, float] | None = None,
    ) -> None: ...
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
    def job_for_token(self, token: str) -> TokenOwner | None: ...
    def metrics_snapshot(self) -> dict[str, Any]: ...


class ErrorDetail(BaseModel):
    code: str
    """A stable word: unauthenticated, forbidden, not_found, conflict, invalid_request..."""
    message: str
    """What is wrong and what to do."""


class ErrorAnswer(BaseModel):
    """Every 4xx and 5xx answer."""

    error: ErrorDetail


# --- errors --------------------------------------------------------------------------------------

_DESCRIPTIONS = {
    400: "The request asks the impossible (an unknown queue, too many GPUs, a page after a job "
    "that does not exist...).",
    401: "No token, or one this server does not know.",
    403: "The token is valid but not for this queue or job.",
    404: "No job (or attempt) with this id.",
    409: "The job's state does not allow this (it has finished, or is not running).",
    413: "The request body is larger than the server accepts.",
    422: "The request does not match the schema; the message names the field.",
    429: "Too many requests from this token (or too many of its notice long-polls at once): "
    "ask again after `Retry-After` seconds.",
    503: "The server cannot take this now: it has as many connections open as it takes (ask "
    "again after `Retry-After` seconds, on a new connection), or the state file cannot be "
    "written (`state_unwritable`: a full disk, a read-only folder; nothing was stored, the "
    "message says what to fix, and the request may be sent again once it is).",
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
    429: "rate_limited",
    503: "unavailable",
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


def install_error_handlers(app: FastAPI) -> None:
    mapping: list[tuple[type[Exception], int]] = [
        (AuthenticationError, 401),
        (AccessDeniedError, 403),
        (JobNotFoundError, 404),
        (JobStateError, 409),
        (JobSpecError, 422),  # before its base class, RequestError
        (RequestError, 400),
        (ConfigError, 400),  # a request naming what the configuration lacks (a queue...)
        (StateStoreError, 503),  # the disk's fault, not the request's: it may be sent again
    ]
    for exc_type, status in mapping:

        def handler(_: Request, exc: Exception, status: int = status) -> JSONResponse:
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            code = "state_unwritable" if isinstance(exc, StateStoreError) else None
            return error_response(status, str(exc), headers=headers, code=code)

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

    def on_rate_limited(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RateLimitedError)
        return error_response(429, str(exc), headers={"Retry-After": exc.retry_after})

    app.add_exception_handler(RateLimitedError, on_rate_limited)
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


class CatchAllMiddleware:
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


class BodyLimitMiddleware:
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


# --- dependencies ------------------------------------------------------------------------------

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
    """Who calls: found, counted and let in by `CallerShareMiddleware` (else 401 here)."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:  # no valid token: the middleware let it through to be refused here
        authenticator: Authenticator = request.app.state.authenticator
        principal = authenticator.authenticate(request.headers.get("authorization"))
        await _take(request.app.state.rate_limiter, principal)
    return principal


ANONYMOUS = "anonymous"
"""The one bucket that the calls without a token (`/metrics`) share."""


async def _anonymous(request: Request) -> None:
    """A call without a token, once the callers without one have room for it (else 429)."""
    await _take(request.app.state.rate_limiter, ANONYMOUS)


REFUSAL_DELAY_S = 0.5
"""A refused request is answered this long after it came: a client that asks again at once,
whatever `Retry-After` says, asks twice a second per connection, not thousands of times, and
the wait costs the server a timer on its event loop, no thread and no CPU."""


async def _take(limiter: RateLimiter, key: Principal | str) -> None:
    """Take a request from `key`'s bucket, or wait `REFUSAL_DELAY_S` and raise 429."""
    wait_s = limiter.take(key)
    if wait_s > 0:
        await asyncio.sleep(REFUSAL_DELAY_S)
        who = key.describe() if isinstance(key, Principal) else "the callers without a token"
        left_s = max(0.0, wait_s - REFUSAL_DELAY_S)
        raise RateLimitedError(
            f"too many requests from {who}: at most {limiter.rate_per_s:g} a second "
            f"({limiter.burst} at once); ask again in {max(1, math.ceil(left_s))} s",
            left_s,
        )


class InFlight:
    """At most `per_key` requests of one key in progress; the others wait their turn, first
    come first served, in the event loop (no thread). One event loop only: no lock."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._held: dict[Hashable, int] = {}
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}

    async def enter(self, key: Hashable) -> None:
        if self._held.get(key, 0) < self.per_key and not self._waiting.get(key):
            self._held[key] = self._held.get(key, 0) + 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(turn)
        try:
            await turn  # `leave` hands its slot over
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave(key)  # handed over as it was cancelled: hand it on
            else:
                self._waiting[key].remove(turn)
                if not self._waiting[key]:
                    del self._waiting[key]
            raise

    def leave(self, key: Hashable) -> None:
        waiting = self._waiting.get(key)
        while waiting:
            turn = waiting.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot goes to the next, still held
                if not waiting:
                    del self._waiting[key]
                return
        self._waiting.pop(key, None)
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)

    def held(self, key: Hashable) -> int:
        return self._held.get(key, 0)


LONG_POLL_SUFFIX = "/notice"
"""The notice long-poll: bounded by `[service] notice_polls`, not by the requests in flight."""


class CallerShareMiddleware:
    """Each caller's share of the server, before any routing: who calls (its token), whether its
    bucket has room (else 429 after `REFUSAL_DELAY_S`), and at most `in_flight` of its requests
    in progress at once, the others waiting their turn. Eight clients of one token in a loop then
    compete with the other callers as a few requests do, not as eight.

    A request without a valid token goes on, to be refused by the route (401); the caller found
    here is the route's (`request.state.principal`).
    """

    def __init__(self, app: ASGIApp, in_flight: int) -> None:
        self.app = app
        self.in_flight = InFlight(in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        authenticator: Authenticator = state.authenticator
        header = Headers(scope=scope).get("authorization")
        try:
            principal = authenticator.authenticate(header)
        except AuthenticationError:
            await self.app(scope, receive, send)
            return
        try:
            await _take(state.rate_limiter, principal)
        except RateLimitedError as refused:
            headers = {"Retry-After": refused.retry_after}
            await error_response(429, str(refused), headers=headers)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        if path.endswith(LONG_POLL_SUFFIX):
            await self.app(scope, receive, send)
            return
        await self.in_flight.enter(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight.leave(principal)


ITEMS_PER_REQUEST = 50
"""A listing costs its caller one request more for every this many items it returned."""


def charge_listing(request: Request, principal: Principal, items: int) -> None:
    """Charge a listing for the items it returned (a page of 500 costs 11 requests in all), so
    that a client listing in a loop uses its own share up sooner, not the server's."""
    limiter: RateLimiter = request.app.state.rate_limiter
    limiter.charge(principal, items / ITEMS_PER_REQUEST)


Manager = Annotated[QueueManagerProtocol, Depends(_manager)]
Caller = Annotated[Principal, Depends(_caller)]
Anonymous = Depends(_anonymous)
