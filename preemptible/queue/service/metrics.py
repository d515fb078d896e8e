"""`GET /metrics`: the queue manager's state and the API's latency in Prometheus text format.

Each app has its own `CollectorRegistry` (never prometheus-client's global one), so two apps
in one process, as in the tests, do not share or clash. The manager's numbers are read at
scrape time from `metrics_snapshot()` by a custom collector: nothing is copied between scrapes,
so what `/metrics` shows is what `/v1/stats` shows. Only the API latency is measured here, by
an ASGI middleware, labelled with the route's template (`/v1/jobs/{job_id}`), never the raw
path, so the number of series stays bounded.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preemptible._percentile import nearest_rank
from preemptible.queue.service.views import SignalsView, StatsView

PREFIX = "preemptible_queue"
CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The media type of the exposition (`text/plain; version=...`)."""

CYCLE_QUANTILES = (0.5, 0.9, 0.99, 1.0)
"""Quantiles of the recent cycle durations exported (1.0 is the slowest)."""

CYCLE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
"""Buckets of the cycle duration histogram (the goal is a 20 ms median at 10,000 pending)."""

STEP_GAP_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 1.25, 2.5, 5.0, 10.0)
"""Buckets of the time between two steps of the loop: it steps every 0.2 s or sooner, and a
cycle is due every second, so a gap over 1.25 s is a late cycle."""

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)
"""Buckets of the API latency histogram; the last ones catch notice long-polls."""

# (attribute of SignalsView, metric suffix, help): the four signals of docs/maintainers/design.md.
_SIGNALS = (
    ("p95_wait_s", "wait_p95_seconds", "p95 queue wait over the window"),
    ("max_wait_s", "wait_max_seconds", "Longest queue wait over the window"),
    ("utilization", "utilization_ratio", "GPU-seconds admitted / GPU-seconds available"),
    ("goodput", "goodput_ratio", "Utilisation minus the GPU-seconds lost to preemption"),
    ("preemptions", "window_preemptions", "Preemptions over the window"),
    ("preemptions_per_hour", "preemptions_per_hour", "Preemptions per hour over the window"),
    ("lost_gpu_s", "lost_gpu_seconds", "GPU-seconds lost to preemption over the window"),
    (
        "lost_gpu_s_per_preemption",
        "lost_gpu_seconds_per_preemption",
        "GPU-seconds lost per preemption over the window",
    ),
    ("jobs", "window_jobs", "Jobs counted in the window"),
    ("resizes", "window_resizes", "Shrinks and grows of elastic jobs over the window"),
    (
        "resize_lost_gpu_s",
        "resize_lost_gpu_seconds",
        "GPU-seconds the saves and restarts of resizes cost over the window",
    ),
)


@dataclass(frozen=True, slots=True)
class HistogramCounts:
    """A histogram's state: cumulative counts per upper bound (the last is +Inf), sum, count."""

    buckets: tuple[tuple[float, int], ...]
    sum: float
    count: int


class DurationHistogram:
    """Counts of durations by bucket since start, kept by the manager without Prometheus
    objects (the collector turns a snapshot into a histogram family at scrape time)."""

    def __init__(self, bounds: Sequence[float] = CYCLE_BUCKETS_S) -> None:
        self.bounds = tuple(sorted(bounds))
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, seconds)] += 1
            self._sum += seconds

    def snapshot(self) -> HistogramCounts:
        with self._lock:
            cumulative, total = [], 0
            for bound, n in zip((*self.bounds, math.inf), self._counts, strict=True):
                total += n
                cumulative.append((bound, total))
            return HistogramCounts(buckets=tuple(cumulative), sum=self._sum, count=total)


class MetricsSource(Protocol):
    """The part of the manager that `/metrics` reads."""

    def metrics_snapshot(self) -> dict[str, Any]: ...


class ManagerCollector:
    """Builds the manager's metric families at each scrape from `metrics_snapshot()`.

    The snapshot holds `queue_depth` {queue: n}, `admissions` {queue: n} (since start),
    `preemptions` {(queue, reason_kind): n}, `resizes` {(queue, "shrink" or "grow"): n},
    `failures` {(queue, outcome): n} and `hangs` {(queue, "step"): n} (since start),
    `cycle_seconds` (recent cycle durations), `cycle_histogram` (a `HistogramCounts` since
    start) and `signals` (a `StatsView`). A missing key exports nothing for it.
    """

    def __init__(self, source: MetricsSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        snapshot = self._source.metrics_snapshot()
        depth = GaugeMetricFamily(
            f"{PREFIX}_depth", "Jobs waiting (pending) per queue", labels=["queue"]
        )
        for queue, n in sorted(_mapping(snapshot.get("queue_depth")).items()):
            depth.add_metric([str(queue)], float(n))
        yield depth
        admissions = CounterMetricFamily(
            f"{PREFIX}_admissions", "Jobs admitted since the manager started", labels=["queue"]
        )
        for queue, n in sorted(_mapping(snapshot.get("admissions")).items()):
            admissions.add_metric([str(queue)], float(n))
        yield admissions
        yield _per_queue_counter(
            "preemptions",
            "Preemptions since the manager started, by victim queue and reason",
            "reason",
            snapshot.get("preemptions"),
        )
        yield _per_queue_counter(
            "resizes",
            "Elastic jobs shrunk or grown since the manager started (not preemptions)",
            "kind",
            snapshot.get("resizes"),
        )
        yield _per_queue_counter(
            "failures",
            "Attempts that failed (crashed or hung) since the manager started, by what "
            "followed: restarted, crash_loop, no_restart_left or not_restarted",
            "outcome",
            snapshot.get("failures"),
        )
        yield _per_queue_counter(
            "hangs",
            "Running jobs told to go because their step stood still, since the manager started",
            "cause",
            snapshot.get("hangs"),
        )
        yield from _cycle_metrics(snapshot.get("cycle_seconds"))
        histogram = snapshot.get("cycle_histogram")
        if isinstance(histogram, HistogramCounts):
            yield HistogramMetricFamily(
                f"{PREFIX}_cycle_duration_seconds",
                "Duration of the scheduling cycles since the manager started",
                buckets=[(_le(bound), float(n)) for bound, n in histogram.buckets],
                sum_value=histogram.sum,
            )
        yield from _loop_metrics(snapshot)
        signals = snapshot.get("signals")
        if isinstance(signals, StatsView):
            yield from _signal_metrics(signals)


def _loop_metrics(snapshot: Mapping[str, Any]) -> Iterator[Metric]:
    """The loop's health: its steps, cycles and failed steps, and the time between steps."""
    for key, name, help_text in (
        ("cycles", "cycles", "Cycles of the scheduling core since the manager started"),
        ("loop_steps", "loop_steps", "Steps of the scheduling loop since the manager started"),
        ("loop_step_failures", "loop_step_failures", "Steps of the loop that failed (retried)"),
    ):
        value = snapshot.get(key)
        if isinstance(value, int):
            family = CounterMetricFamily(f"{PREFIX}_{name}", help_text)
            family.add_metric([], float(value))
            yield family
    gaps = snapshot.get("loop_step_gaps")
    if isinstance(gaps, HistogramCounts):
        yield HistogramMetricFamily(
            f"{PREFIX}_loop_step_gap_seconds",
            "Time from one step of the scheduling loop to the next (over 1.25 s: a late cycle)",
            buckets=[(_le(bound), float(n)) for bound, n in gaps.buckets],
            sum_value=gaps.sum,
        )


def _mapping(value: Any) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else f"{bound:g}"


def _cycle_metrics(durations: Any) -> Iterator[Metric]:
    # Quantiles of the recent cycles, beside the histogram since start: what the loop does now.
    recent = [float(d) for d in durations] if isinstance(durations, Sequence) else []
    quantiles = GaugeMetricFamily(
        f"{PREFIX}_cycle_seconds",
        "Duration of recent scheduling cycles (quantile over the cycles the manager keeps)",
        labels=["quantile"],
    )
    for q in CYCLE_QUANTILES if recent else ():
        quantiles.add_metric([f"{q:g}"], nearest_rank(recent, q))
    yield quantiles
    count = GaugeMetricFamily(
        f"{PREFIX}_cycle_window_cycles", "How many recent cycles the quantiles are over"
    )
    count.add_metric([], float(len(recent)))
    yield count


def _per_queue_counter(name: str, help_text: str, label: str, counts: object) -> Metric:
    """A counter of {(queue, `label`): n}; a key that is not a pair counts as ("key", unknown)."""
    family = CounterMetricFamily(f"{PREFIX}_{name}", help_text, labels=["queue", label])
    for key, n in sorted(_mapping(counts).items(), key=str):
        queue, value = key if isinstance(key, tuple) else (key, "unknown")
        family.add_metric([str(queue), str(value)], float(n))
    return family


def _signal_metrics(stats: StatsView) -> Iterator[Metric]:
    rows: list[tuple[list[str], SignalsView]] = [(["overall", ""], stats.overall)]
    rows += [(["queue", name], view) for name, view in sorted(stats.queues.items())]
    for attribute, suffix, help_text in _SIGNALS:
        family = GaugeMetricFamily(
            f"{PREFIX}_{suffix}",
            f"{help_text} (scope=overall, or scope=queue with its name)",
            labels=["scope", "queue"],
        )
        for labels, view in rows:
            family.add_metric(labels, float(getattr(view, attribute)))
        yield family
    least = GaugeMetricFamily(
        f"{PREFIX}_max_wait_least_served_seconds", "Longest wait of the least-served queue"
    )
    least.add_metric([], stats.max_wait_least_served_s)
    yield least
    window = GaugeMetricFamily(f"{PREFIX}_signals_window_seconds", "Window of the four signals")
    window.add_metric([], stats.window_s)
    yield window


class ConnectionCounts(Protocol):
    """What `/metrics` reads of the server's connection limits (`connections.ConnectionLimits`)."""

    max_connections: int
    open: int
    refused: int


class ConnectionCollector:
    """The server's connections: open, at most, refused since start (when it has limits)."""

    def __init__(self) -> None:
        self.counts: ConnectionCounts | None = None
        """Set by the server that applies the limits (`server.uvicorn_config`)."""

    def collect(self) -> Iterator[Metric]:
        counts = self.counts
        if counts is None:
            return
        opened = GaugeMetricFamily("preemptible_api_connections", "HTTP connections open now")
        opened.add_metric([], float(counts.open))
        yield opened
        most = GaugeMetricFamily(
            "preemptible_api_connections_max", "HTTP connections the server takes at most"
        )
        most.add_metric([], float(counts.max_connections))
        yield most
        refused = CounterMetricFamily(
            "preemptible_api_connections_refused",
            "Connections answered 503 or reset because the server had its most open",
        )
        refused.add_metric([], float(counts.refused))
        yield refused


class ApiMetrics:
    """One app's registry: the manager's collector, the connections and the API latency."""

    def __init__(self, source: MetricsSource) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ManagerCollector(source))
        self.connections = ConnectionCollector()
        self.registry.register(self.connections)
        self.latency = Histogram(
            "preemptible_api_request_duration_seconds",
            "Time to answer an API request, by method, route template and status",
            labelnames=["method", "route", "status"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The exposition text of everything in the registry."""
        return generate_latest(self.registry)


class LatencyMiddleware:
    """ASGI middleware that times every HTTP request into `ApiMetrics.latency`."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # if the app dies before answering, the server answers 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.latency.labels(
                method=scope.get("method", ""), route=template, status=str(status)
            ).observe(time.perf_counter() - started)
