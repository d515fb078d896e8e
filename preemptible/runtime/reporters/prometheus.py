"""Prometheus gauges of the measured cost, in a registry of their own.

A registry per reporter rather than the process-wide default, so that two contexts in one
process (tests, notebooks) do not collide on metric names; ``PREEMPTIBLE_METRICS_PORT`` serves
it on 127.0.0.1 (a scraper in the same pod or host reads it; nothing is exposed further).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest, start_http_server

from preemptible._env_names import METRICS_PORT_ENV
from preemptible.checkpoint import CheckpointCost


class PrometheusGauges:
    """``preemptible_save_seconds`` (p95), ``preemptible_restore_seconds`` (last),
    ``preemptible_checkpoint_bytes``, ``preemptible_last_checkpoint_timestamp_seconds``.

    Args:
        registry: where the gauges live (default: a new one).
    """

    name = "prometheus"

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._server: Any = None
        self.save_seconds = Gauge(
            "preemptible_save_seconds",
            "p95 seconds from the start of a save until it has committed (two tiers: locally)",
            registry=self.registry,
        )
        self.upload_seconds = Gauge(
            "preemptible_upload_seconds",
            "p95 seconds to upload a locally committed checkpoint to the remote tier",
            registry=self.registry,
        )
        self.restore_seconds = Gauge(
            "preemptible_restore_seconds", "seconds the last restore took", registry=self.registry
        )
        self.checkpoint_bytes = Gauge(
            "preemptible_checkpoint_bytes", "bytes of the last checkpoint", registry=self.registry
        )
        self.last_checkpoint = Gauge(
            "preemptible_last_checkpoint_timestamp_seconds",
            "when the last checkpoint became durable (Unix time)",
            registry=self.registry,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PrometheusGauges:
        """The gauges, served on 127.0.0.1:``$PREEMPTIBLE_METRICS_PORT`` when it is set."""
        reporter = cls()
        port = env.get(METRICS_PORT_ENV, "").strip()
        if port:
            reporter.serve(int(port))
        return reporter

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on `addr`:`port` (0: any free port); returns the port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def text(self) -> str:
        """The registry in the text exposition format."""
        return generate_latest(self.registry).decode()

    def report(self, cost: CheckpointCost) -> None:
        self.save_seconds.set(cost.save.p95)
        if cost.upload.count:
            self.upload_seconds.set(cost.upload.p95)
        self.restore_seconds.set(cost.restore.last)
        self.checkpoint_bytes.set(cost.bytes)
        if cost.last_checkpoint_time is not None:
            self.last_checkpoint.set(cost.last_checkpoint_time)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
