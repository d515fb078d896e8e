"""How many connections the server holds, and for how long: sized below its file descriptors.

Every open connection is a file descriptor, and so is every file the scheduling loop opens (the
state file, a job's log at its launch, `/proc/<pid>/stat` at every poll). With no bound, a few
hundred idle connections took every descriptor: the API stopped answering and the loop failed
step after step. So, at start, `connection_limits` reads the process's descriptor limit (raising
the soft limit to the hard one where it may) and sizes the connections below it: what the loop
and the request handlers open (`RESERVED_FDS`), a burst of connections the kernel hands over at
once (the backlog) and the ones being refused all fit under it. The uvicorn protocol of
`guarded_protocol` then enforces it:

- at `max_connections` open, a new connection makes room by closing the one idle the longest
  (no request in: a flood of connections that never send one cannot keep a client out); when
  every connection has a request in, it is answered 503 in the error shape, with `Retry-After`
  and `Connection: close`, and past `refuse_beyond` it is reset without an answer;
- a connection that has not sent a whole request within `idle_s` (a new one, a keep-alive one
  between requests, or one that sends its headers a byte at a time) is closed.

Rejected alternative: uvicorn's own `limit_concurrency`, which counts connections only when a
request arrives (an idle one is never refused) and answers in plain text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import resource
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from preemptible.errors import ConfigError
from preemptible.queue.core import ServiceSettings

log = logging.getLogger("preemptible.queue")

RESERVED_FDS = 128
"""Descriptors kept for everything but connections: the state file (3), the loop's launches and
`/proc` reads, a log file per request handler thread (40), the interpreter's own."""
REFUSING = 32
"""Connections that may be open at once being answered 503, beyond `max_connections`."""
MIN_CONNECTIONS = 16
"""Fewer connections than this would not serve a team: the server refuses to start."""
MAX_SOFT_LIMIT = 1 << 16
"""The soft descriptor limit is raised towards the hard one, up to this."""


@dataclass(kw_only=True)
class ConnectionLimits:
    """The bounds one server applies, and what they refused (read by `/metrics`)."""

    max_connections: int
    refuse_beyond: int
    """Past this many open, a new connection is reset without an answer."""
    idle_s: float
    backlog: int
    fd_limit: int
    """The process's soft descriptor limit when the limits were sized."""
    open: int = 0
    refused: int = 0
    """Connections answered 503 (or reset) since start."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_refused(self) -> None:
        with self._lock:
            self.refused += 1


def connection_limits(settings: ServiceSettings) -> ConnectionLimits:
    """The bounds of `[service]`, lowered to fit under the file descriptor limit.

    Raises:
        ConfigError: the descriptor limit leaves room for fewer than `MIN_CONNECTIONS`.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_SOFT_LIMIT if hard == resource.RLIM_INFINITY else min(hard, MAX_SOFT_LIMIT)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # not allowed here: size the limits under the soft one as it is
    if soft == resource.RLIM_INFINITY:
        soft = MAX_SOFT_LIMIT
    backlog = min(settings.backlog, max(8, soft // 8))
    room = soft - RESERVED_FDS - backlog - REFUSING
    if room < MIN_CONNECTIONS:
        raise ConfigError(
            f"the file descriptor limit is {soft} (ulimit -n), which leaves room for "
            f"{max(0, room)} connections beside what the scheduling loop needs; raise it to at "
            f"least {RESERVED_FDS + backlog + REFUSING + MIN_CONNECTIONS}"
        )
    connections = min(settings.max_connections, room)
    if connections < settings.max_connections:
        log.warning(
            "at most %d connections (not %d): the file descriptor limit is %d (ulimit -n)",
            connections,
            settings.max_connections,
            soft,
        )
    return ConnectionLimits(
        max_connections=connections,
        refuse_beyond=connections + REFUSING,
        idle_s=settings.keep_alive_s,
        backlog=backlog,
        fd_limit=soft,
    )


def _busy_body(limits: ConnectionLimits) -> bytes:
    error = {
        "code": "unavailable",
        "message": f"the server has {limits.max_connections} connections open, as many as it "
        "takes; ask again in a second, and close the connections you do not use",
    }
    return json.dumps({"error": error}).encode()


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11) under `limits`: pass it as `uvicorn.Config(http=...)`."""
    busy = _busy_body(limits)
    idle: OrderedDict[asyncio.Protocol, None] = OrderedDict()
    """The open connections with no request in, the longest idle first (one event loop: no
    lock)."""

    async def answer_busy(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(busy)).encode()),
                    (b"retry-after", b"1"),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": busy, "more_body": False})

    class GuardedH11Protocol(H11Protocol):
        _reset = False
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= limits.max_connections and idle:
                # Make room: the connection idle the longest goes, not the new one. A flood of
                # connections that never send a request cannot keep a client out.
                oldest = next(iter(idle))
                assert isinstance(oldest, GuardedH11Protocol)
                oldest.close_if_idle()
            held = len(self.connections)
            if held >= limits.refuse_beyond:
                self._reset = True
                limits.count_refused()
                transport.abort()
                return
            super().connection_made(transport)
            limits.open = len(self.connections)
            if held >= limits.max_connections:  # every connection has a request in
                limits.count_refused()
                self.app = answer_busy  # its first request is answered 503, and it closes
            self._now_idle()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._reset:
                return
            idle.pop(self, None)
            self._disarm_deadline()
            super().connection_lost(exc)
            limits.open = len(self.connections)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a whole request is in
                idle.pop(self, None)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._now_idle()  # until the next request is whole

        def _now_idle(self) -> None:
            idle.pop(self, None)
            idle[self] = None
            self._disarm_deadline()
            self._deadline = self.loop.call_later(limits.idle_s, self.close_if_idle)

        def _disarm_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def close_if_idle(self) -> None:
            """Close this connection unless a request is in (a long-poll may wait a minute)."""
            self._deadline = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            idle.pop(self, None)
            with contextlib.suppress(h11.LocalProtocolError):
                self.conn.send(h11.ConnectionClosed())
            self.transport.close()
            self.connections.discard(self)  # now, not when the loop reports it lost: it is gone
            limits.open = len(self.connections)

    return GuardedH11Protocol


def keep_alive_seconds(limits: ConnectionLimits) -> int:
    """uvicorn's `timeout_keep_alive` (whole seconds) for `limits.idle_s`."""
    return max(1, math.ceil(limits.idle_s))
