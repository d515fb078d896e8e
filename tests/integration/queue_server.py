"""A real `preemptible queue serve` process for the integration tests, and HTTP helpers."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.polling import wait_until

CLI = [sys.executable, "-m", "preemptible"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One `preemptible queue serve` process on `tmp/state`, its output in `tmp/server.log`.

    Its jobs may run as root when the tests do (CI runs as root): they are the test's own, on a
    machine no team shares (`allow_jobs_as_root`). `cli`, `env` and `user` start it otherwise:
    as another Unix user, with an interpreter that user may run. `fd_limit` sets its file
    descriptor limit (soft and hard, so it cannot raise it); `args` are more options of
    `queue serve`.
    """

    def __init__(
        self,
        tmp: Path,
        config: str,
        tokens: dict[str, str],
        port: int | None = None,
        *,
        allow_jobs_as_root: bool = True,
        cli: list[str] | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        fd_limit: int | None = None,
        args: list[str] | None = None,
    ):
        self.tmp, self.config, self.tokens = tmp, config, tokens
        self.fd_limit = fd_limit
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.allow_jobs_as_root = allow_jobs_as_root
        self.cli, self.env, self.user = cli or CLI, env or {}, user
        self.args = list(args or [])

    def start(self) -> None:
        config = self.tmp / "queue.toml"
        config.write_text(self.config)
        args = ["--config", str(config), "--state", str(self.tmp / "state")]
        if self.allow_jobs_as_root:
            args.append("--allow-jobs-as-root")
        args += self.args
        log = open(self.tmp / "server.log", "ab")  # noqa: SIM115 - closed with the process
        fds = self.fd_limit

        def limit_fds() -> None:
            if fds is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (fds, fds))

        self.proc = subprocess.Popen(
            [*self.cli, "queue", "serve", *args, "--port", str(self.port)],
            env={**os.environ, **self.env, **self.tokens},
            stdout=log,
            stderr=subprocess.STDOUT,
            user=self.user,
            preexec_fn=limit_fds if fds is not None else None,
        )
        wait_until(self._answers, "the server to answer", timeout=30, every=0.1, describe=self.log)

    def _answers(self) -> bool:
        try:
            if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        assert self.proc is not None and self.proc.poll() is None, self.log()
        return False

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

    def job() -> dict[str, Any] | None:
        found: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        return found if found["state"] in states else None

    return wait_until(
        job,
        f"{job_id} to reach {states}",
        timeout=timeout,
        every=0.1,
        describe=lambda: client.get(f"/v1/jobs/{job_id}").json(),
    )


def ready(client: httpx.Client, job_id: str, timeout: float = 30) -> None:
    """Wait until the job runs and has said so (it prints 'ready')."""
    wait_until(
        lambda: "ready" in client.get(f"/v1/jobs/{job_id}/logs").json()["text"],
        f"{job_id} to say it is ready",
        timeout=timeout,
        every=0.1,
    )


def events(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return list(client.get("/v1/events", params={"job_id": job_id}).json())


def wait_event(client: httpx.Client, job_id: str, kind: str, timeout: float = 30) -> dict[str, Any]:
    """The job's first event of `kind`, once there is one."""
    return wait_until(
        lambda: next((e for e in events(client, job_id) if e["kind"] == kind), None),
        f"a {kind!r} event of {job_id}",
        timeout=timeout,
        every=0.1,
        describe=lambda: events(client, job_id),
    )


def submit(client: httpx.Client, queue: str, command: list[str], **fields: Any) -> dict[str, Any]:
    r = client.post("/v1/jobs", json={"queue": queue, "command": command, **fields})
    assert r.status_code == 201, r.text
    return dict(r.json())
