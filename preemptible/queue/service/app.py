"""The queue manager's app: the API's routes and the dashboard's, over one `QueueManager`.

Assembled here, above `api.py` and `dashboard_api.py`, so that each router knows only the
shared edge (`http_edge.py`) and never the other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI

from preemptible._version import __version__
from preemptible.queue.service import api
from preemptible.queue.service.auth import Authenticator, Tokens, resolve_tokens
from preemptible.queue.service.dashboard_api import install_dashboard
from preemptible.queue.service.http_edge import (
    BodyLimitMiddleware,
    CallerShareMiddleware,
    CatchAllMiddleware,
    QueueManagerProtocol,
    install_error_handlers,
)
from preemptible.queue.service.limits import RateLimiter, WaitSlots
from preemptible.queue.service.metrics import ApiMetrics, LatencyMiddleware

MAX_BODY_BYTES = 64 * 1024
"""Largest request body accepted; a larger one is answered 413 before it is read."""


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
    limits = manager.config.service
    app.state.rate_limiter = RateLimiter(limits.rate_per_s, limits.burst)
    app.state.notice_slots = WaitSlots(limits.notice_polls)
    # A thread for every poll the server can hold a connection for: none waits for a thread.
    app.state.notice_threads = limits.max_connections
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, limit=max_body_bytes)
    app.add_middleware(CallerShareMiddleware, in_flight=limits.in_flight)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(LatencyMiddleware, metrics=metrics)
    app.include_router(api.router)
    app.include_router(api.plain_router)
    app.state.routers = [api.router, api.plain_router]  # what a 405's Allow header is made from
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
