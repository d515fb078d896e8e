"""A real `queue serve` under a flood of idle connections, with few file descriptors.

The server runs with a descriptor limit of 256 (soft and hard, so it cannot raise it), as a
small `ulimit -n` would have it, and 400 connections are opened to it that never send a byte.
Without a bound, they took every descriptor: the API stopped answering, and the scheduling loop,
which opens a job's log at launch and reads `/proc` at every poll, failed step after step and
logged a traceback each time. Now the server sizes its connections under the limit, refuses the
rest, closes the idle ones, and the loop keeps its descriptors: a job submitted during the
flood runs and completes, and the log stays short.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.polling import wait_until

from .queue_server import Server

ADMIN = "flood-admin-token"
TOKENS = {"FLOOD_ADMIN": ADMIN, "FLOOD_A": "flood-team-a-token"}
CONFIG = """
[cluster]
gpus = 1

[service]
admin_token = "env:FLOOD_ADMIN"
keep_alive = "1s"

[[queues]]
name = "a"
nominal = { gpus = 1 }
token = "env:FLOOD_A"
"""
FLOOD = 400
FD_LIMIT = 256


def until(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    return wait_until(check, what, timeout=timeout_s, every=0.1)


def call(url: str, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
    """One try on a new connection: the answer, or None when refused, reset or too slow."""
    try:
        response = httpx.request(
            method, url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=2, **kwargs
        )
    except httpx.HTTPError:
        return None
    return None if response.status_code == 503 else response


def flood(port: int, n: int) -> list[socket.socket]:
    """`n` connections that never send a byte (non-blocking: a full backlog does not stall)."""
    socks = []
    for _ in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        code = sock.connect_ex(("127.0.0.1", port))
        assert code in (0, errno.EINPROGRESS), errno.errorcode.get(code)
        socks.append(sock)
    return socks


def test_a_flood_of_idle_connections_starves_neither_the_api_nor_the_loop(tmp_path: Path) -> None:
    server = Server(tmp_path, CONFIG, TOKENS, fd_limit=FD_LIMIT)
    server.start()
    socks: list[socket.socket] = []
    try:
        socks = flood(server.port, FLOOD)
        time.sleep(0.5)  # the server has taken what it takes
        body = {"queue": "a", "command": [sys.executable, "-c", "print('ran')"], "gpus": 1}
        submitted = until(
            "a submission", lambda: call(server.url, "POST", "/v1/jobs", json=body), 30
        )
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]

        def completed() -> bool:
            answer = call(server.url, "GET", f"/v1/jobs/{job_id}")
            return answer is not None and answer.json()["state"] == "completed"

        until(f"{job_id} completed", completed, 30)
        log = call(server.url, "GET", f"/v1/jobs/{job_id}/logs")
        assert log is not None and log.json()["text"] == "ran\n"
        socks += flood(server.port, FLOOD)  # a second wave, while the first is still open
        time.sleep(2)
        assert until("healthz", lambda: call(server.url, "GET", "/healthz"), 10).status_code == 200
    finally:
        for sock in socks:
            sock.close()
        server.stop()
    text = server.log()
    assert "step failed" not in text and "Too many open files" not in text, text[-3000:]
    assert len(text) < 20_000, f"the log grew to {len(text)} characters"
