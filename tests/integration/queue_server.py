"""A real `preemptible queue serve` process for the integration tests, and HTTP helpers."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

CLI = [sys.executable, "-m", "preemptible"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One `preemptible queue serve` process on `tmp/state`, its output in `tmp/server.log`;
    `fd_limit` sets its file descriptor limit (soft and hard, so it cannot raise it)."""

    def __init__(
        self,
        tmp: Path,
        config: str,
        tokens: dict[str, str],
        port: int | None = None,
        *,
        fd_limit: int | None = None,
    ):
        self.tmp, self.config, self.tokens = tmp, config, tokens
        self.fd_limit = fd_limit
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        config = self.tmp / "queue.toml"
        config.write_text(self.config)
        args = ["--config", str(config), "--state", str(self.tmp / "state")]
        log = open(self.tmp / "server.log", "ab")  # noqa: SIM115 - closed with the process
        fds = self.fd_limit

        def limit_fds() -> None:
            if fds is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))

        self.proc = subprocess.Popen(
            [*CLI, "queue", "serve", *args, "--port", str(self.port)],
            env={**os.environ, **self.tokens},
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=limit_fds if fds is not None else None,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, self.log()
            time.sleep(0.1)
        raise AssertionError("the server did not answer within 30 s")

    def log(self) -> str:
        return (self.tmp / "server.log").read_text()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )


def wait_for(
    client: httpx.Client, job_id: str, states: set[str], timeout: float = 30
) -> dict[str, Any]:
    """The job once it is in one of `states`."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"{job_id} never reached {states}: {job}")


def ready(client: httpx.Client, job_id: str, timeout: float = 30) -> None:
    """Wait until the job runs and has said so (it prints 'ready')."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "ready" in client.get(f"/v1/jobs/{job_id}/logs").json()["text"]:
            return
        time.sleep(0.1)
    raise AssertionError(f"{job_id} never said it was ready")


def submit(client: httpx.Client, queue: str, command: list[str], **fields: Any) -> dict[str, Any]:
    r = client.post("/v1/jobs", json={"queue": queue, "command": command, **fields})
    assert r.status_code == 201, r.text
    return dict(r.json())
