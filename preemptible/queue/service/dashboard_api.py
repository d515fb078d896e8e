"""The dashboard's routes: its page and files at `/`, and the three JSON answers it polls.

The page is plain HTML, CSS and JavaScript shipped in the package (`static/`): no build step,
no CDN, nothing fetched from elsewhere (its Content-Security-Policy says so to the browser).
It holds no data and needs no token; everything it shows comes from `/v1` with the token the
user typed, sent as `Authorization: Bearer` and kept in the tab's `sessionStorage`, so the
token is never in a URL, a cookie or a server log. Rejected alternative: a login that sets a
cookie, which the browser would then send with requests other sites make (CSRF), and which
Server-Sent Events would need because `EventSource` cannot send a header; the page polls
instead, every two seconds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Literal, Protocol, runtime_checkable

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preemptible.errors import JobNotFoundError
from preemptible.queue.core.model import Tier
from preemptible.queue.service import dashboard
from preemptible.queue.service.access import check_job_access, check_team_or_admin, queue_scope
from preemptible.queue.service.dashboard import DashboardView, JobDetailView
from preemptible.queue.service.history import SignalSample
from preemptible.queue.service.http_edge import (
    Caller,
    Manager,
    QueueManagerProtocol,
    charge_listing,
    error_responses,
)
from preemptible.queue.service.views import JobState, JobView

MAX_JOBS_SHOWN = 500
"""The overview lists at most this many jobs (and says how many match): a queue of 10,000
must not cost every open page megabytes every two seconds."""
JobFilter = Literal[
    "active", "all", "pending", "running", "preempting", "completed", "failed", "cancelled"
]
"""Which jobs the overview lists: "active" is pending, running and preempting."""

STATIC_DIR = Path(__file__).parent / "static"
"""The page's files, package data (pyproject.toml `package-data`)."""

PAGE_HEADERS = {
    # Only this server's own files and API: no CDN, no inline script, no framing.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@runtime_checkable
class KeepsSignalHistory(Protocol):
    """A manager that samples the four signals (`QueueManager` does; a stand-in may not, and
    its trends are then empty)."""

    def signal_history(self, since: float) -> list[SignalSample]: ...


router = APIRouter(prefix="/v1", responses=error_responses(401, 403, 422, 429, 503))


@router.get(
    "/dashboard",
    summary="The dashboard's overview: queues, signals, GPUs and the jobs the filters select",
)
def overview(
    request: Request,
    principal: Caller,
    manager: Manager,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    state: JobFilter = "active",
    tier: Tier | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_JOBS_SHOWN)] = MAX_JOBS_SHOWN,
) -> DashboardView:
    scope = queue_scope(principal, queue)  # refuses job tokens and other queues' listings
    queues = manager.queues()
    stats = manager.stats()
    running = manager.list_jobs(state=JobState.RUNNING)
    preempting = manager.list_jobs(state=JobState.PREEMPTING)
    holding = running + preempting
    matching = _jobs(manager, scope, state, tier)
    gpus = manager.config.cluster.gpus
    charge_listing(request, principal, min(len(matching), limit))
    return DashboardView(
        at=time.time(),
        viewer=dashboard.viewer(principal),
        gpus=dashboard.gpu_map(gpus, holding, principal),
        queues=dashboard.queue_rows(queues, stats, preempting, gpus),
        overall=stats.overall,
        max_wait_least_served_s=stats.max_wait_least_served_s,
        window_s=stats.window_s,
        jobs=matching[:limit],
        jobs_matching=len(matching),
    )


def _jobs(
    manager: QueueManagerProtocol, queue: str | None, state: JobFilter, tier: Tier | None
) -> list[JobView]:
    """The jobs the filters select: waiting and running ones oldest first (as `queue status`
    lists them), finished ones newest first."""
    if state == "all":
        found = manager.list_jobs(queue=queue)
    elif state == "active":
        active = dashboard.ACTIVE_STATES
        found = [j for s in active for j in manager.list_jobs(queue=queue, state=s)]
    else:
        found = manager.list_jobs(queue=queue, state=JobState(state))
    if tier is not None:
        found = [j for j in found if j.tier == tier]
    newest_first = state not in ("active", *(s.value for s in dashboard.ACTIVE_STATES))
    return sorted(found, key=lambda j: (j.submitted_at, j.id), reverse=newest_first)


@router.get(
    "/jobs/{job_id}/detail",
    responses=error_responses(404),
    summary="A job's page: attempts, notices, checkpoints, terms, lost work, log tail",
)
def job_detail(job_id: str, principal: Caller, manager: Manager) -> JobDetailView:
    check_job_access(manager, principal, job_id)
    job = manager.get_job(job_id)
    history = manager.why(job_id).history
    try:
        path: Path | None = manager.log_path(job_id)
    except JobNotFoundError:
        path = None  # not started yet: no output
    return dashboard.job_detail(job, history, dashboard.tail_log(path), time.time())


@router.get(
    "/signals/history",
    summary="Samples of the four signals, one a minute over the last day (queue or admin token)",
)
def signal_history(
    principal: Caller,
    manager: Manager,
    since: Annotated[float, Query(ge=0, allow_inf_nan=False)] = 0.0,
) -> list[SignalSample]:
    check_team_or_admin(principal)
    return _history(manager, since)


def _history(manager: QueueManagerProtocol, since: float) -> list[SignalSample]:
    if isinstance(manager, KeepsSignalHistory):
        return manager.signal_history(since)
    return []


pages = APIRouter(include_in_schema=False)


@pages.api_route("/", methods=["GET", "HEAD"])
def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


class _PageHeadersMiddleware:
    """Adds `PAGE_HEADERS` to the page and its files (the API's answers are JSON, not pages)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/" or path.startswith("/static/")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"cache-control"]
                headers += [(k.lower().encode(), v.encode()) for k, v in PAGE_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def install_dashboard(app: FastAPI) -> None:
    """The dashboard's routes, files and headers on `app`."""
    app.include_router(router)
    app.include_router(pages)
    app.state.routers += [router, pages]
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_middleware(_PageHeadersMiddleware)
