"""`preemptible queue serve`: the queue manager behind its HTTP API and its dashboard (`/`),
until SIGINT or SIGTERM.

Jobs keep running when the server stops: a restart adopts them again (`recovery.py`).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import socket
import threading
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from preemptible._env_names import LOG_LEVEL_ENV
from preemptible.errors import ConfigError
from preemptible.queue.core import QueueConfig, parse_config_text
from preemptible.queue.quiet_gc import quiet_garbage_collector
from preemptible.queue.service.connections import (
    ConnectionLimits,
    connection_limits,
    guarded_protocol,
    keep_alive_seconds,
)
from preemptible.queue.service.decision_log import configure_logging
from preemptible.queue.service.executor import ProcessExecutor
from preemptible.queue.service.isolation import (
    JobUser,
    check_job_users,
    job_users,
    make_not_dumpable,
    secure_state_dir,
)
from preemptible.queue.service.log_limits import quiet_repeats
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.store import Store

SHUTDOWN_GRACE_S = 10
"""On SIGTERM or SIGINT, requests in flight get this long to finish."""


def load_config(path: Path) -> QueueConfig:
    """The configuration file, with `gpus = "auto"` and `topology = "auto"` resolved from
    NVML."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration {path}: {exc.strerror or exc}") from None
    config = parse_config_text(text, path=path)
    if config.gpus_auto:
        from preemptible.queue.service.gpus import detect_gpus

        cluster = dataclasses.replace(config.cluster, gpus=detect_gpus())
        config = dataclasses.replace(config, cluster=cluster, gpus_auto=False)
    if config.topology_auto:
        from preemptible.queue.service.gpus import detect_topology

        topology = detect_topology()
        if topology.gpus != config.cluster.gpus:
            raise ConfigError(
                f"NVML sees {topology.gpus} GPUs but cluster.gpus is {config.cluster.gpus}; "
                'write gpus = "auto", or the right number'
            )
        config = dataclasses.replace(config, topology=topology, topology_auto=False)
    return config


def secret_variables(config: QueueConfig) -> set[str]:
    """The environment variables that hold tokens: jobs never see them."""
    specs = [*config.tokens.values(), config.admin_token or ""]
    return {s.removeprefix("env:") for s in specs if s.startswith("env:")}


def check_port(host: str, port: int) -> None:
    """Fail early, in one line, when the address cannot be bound."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port {port} on {host} is in use; stop what holds it or choose --port"
                ) from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def build_manager(
    config: QueueConfig,
    state_dir: Path,
    *,
    url: str,
    executor: ProcessExecutor | None = None,
    users: dict[str, JobUser] | None = None,
) -> QueueManager:
    """A manager on the state directory (recovered from it), not started yet.

    Args:
        users: Queue name -> the user its jobs run as; default: the config's ``run_as``.

    Raises:
        ConfigError: A ``run_as`` user does not exist or cannot be switched to.
        StateStoreError: The state directory cannot be created, secured or read.
    """
    if users is None:
        users = job_users(config)
    secure_state_dir(Path(state_dir), shared=bool(users))
    store = Store(state_dir)
    if executor is None:
        executor = ProcessExecutor(exclude=secret_variables(config))
    return QueueManager(config, store, executor, state_dir=state_dir, url=url, users=users)


def run_server(
    config_path: Path,
    state_dir: Path,
    host: str,
    port: int,
    *,
    allow_jobs_as_root: bool = False,
    log_format: str = "plain",
) -> None:
    """Serve until interrupted. Raises PreemptibleError (one line to show) for bad set-ups.

    Args:
        allow_jobs_as_root: A manager that runs as root starts although a queue has no
            ``run_as``, and that queue's jobs run as root (docs/user-guide/security.md).
        log_format: "plain" or "json" (`decision_log`).
    """
    from preemptible.queue.service.app import create_app

    # First: from here on, no other process of this user reads our environ, memory or fds.
    dumpable = not make_not_dumpable()
    config = load_config(config_path)
    users = job_users(config)
    warning = check_job_users(config, users, allow_jobs_as_root=allow_jobs_as_root)
    check_port(host, port)
    try:
        configure_logging(os.environ.get(LOG_LEVEL_ENV, "INFO"), log_format)
    except ValueError as exc:
        raise ConfigError(f"{exc} (${LOG_LEVEL_ENV}, --log-format)") from None
    quiet_repeats()  # a storm of one error (a flood's refused accepts...) is logged as a count
    limits = connection_limits(config.service)  # before the state file takes a descriptor
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    manager = build_manager(config, Path(state_dir), url=url, users=users)
    app = create_app(manager)
    log = logging.getLogger("preemptible.queue")
    if warning is not None:
        log.warning("%s", warning)
    if dumpable:
        log.warning("cannot make this process undumpable (no prctl): its user can read its memory")
    server = _StoppingServer(uvicorn_config(app, limits, host=host, port=port), manager)
    # Collections were the tail of the submission latency (gc-while-serving.md).
    quiet_garbage_collector()
    manager.start()
    log.info("job containment in force: %s", manager.executor.containment.why)
    log.info("GPU placement: %s", manager.runs.topology.describe())
    log.info(
        "serving on %s: the dashboard at %s/ (sign in with a queue or the admin token), "
        "the API under %s/v1; at most %d connections (file descriptors: %d)",
        url,
        url,
        url,
        limits.max_connections,
        limits.fd_limit,
    )
    try:
        server.run()
    finally:
        manager.stop()
        manager.store.close()


def uvicorn_config(
    app: FastAPI, limits: ConnectionLimits, *, host: str, port: int, **more: object
) -> uvicorn.Config:
    """The server of `app` under `limits`: its connections counted and refused past the bound,
    idle ones closed, the backlog sized with them (`connections.py`)."""
    app.state.metrics.connections.counts = limits  # what /metrics reports
    options: dict[str, object] = {
        "log_level": "warning",
        "access_log": False,
        "timeout_graceful_shutdown": SHUTDOWN_GRACE_S,
        **more,
    }
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(limits),
        backlog=limits.backlog,
        timeout_keep_alive=keep_alive_seconds(limits),
        **options,  # type: ignore[arg-type]
    )


class _StoppingServer(uvicorn.Server):
    """Stops the manager as soon as a shutdown begins, so that its notice long-polls answer at
    once: uvicorn waits for the requests in flight, and a poll may wait a minute."""

    def __init__(self, config: uvicorn.Config, manager: QueueManager):
        super().__init__(config)
        self.manager = manager

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: take no lock here; the manager stops in a thread of its own.
        threading.Thread(target=self.manager.stop, name="queue-stop", daemon=True).start()
        super().handle_exit(sig, frame)
