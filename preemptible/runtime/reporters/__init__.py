"""Reporters: the measured checkpoint cost sent, after each save, to every sink the job has.

The cost file and the queue manager are written by `Context` itself
(`preemptible.runtime.cost_file`, `preemptible.runtime.queue_link`); the sinks here are the pod's
annotations (`kubernetes`), the SLURM job's comment (`slurm`) and Prometheus gauges
(`prometheus`). `from_env` picks the ones the
environment offers, and ``PREEMPTIBLE_REPORTERS`` overrides the choice.

`Reporters` runs them on one background thread, so that a slow API server never blocks a
training step: ``report`` only stores the newest cost and wakes the thread. A failing reporter
is logged once per outage and retried with a doubling back-off (up to a minute); one that
raises `ReporterDisabled` (a 403: the service account may not patch) is logged once and
dropped. Nothing a reporter does ever raises into training. The alternative, one thread per
reporter, buys nothing: reports are rare (once per save) and each is rate-limited.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from preemptible._env_names import METRICS_PORT_ENV, REPORTERS_ENV
from preemptible.checkpoint import CheckpointCost
from preemptible.runtime.reporters.sink import Deferred, Reporter, ReporterDisabled

log = logging.getLogger("preemptible")

MAX_BACKOFF_S = 60.0

__all__ = [
    "REPORTERS_ENV",
    "Deferred",
    "Reporter",
    "ReporterDisabled",
    "Reporters",
    "from_env",
]


@dataclass(slots=True)
class _State:
    reporter: Reporter
    backoff_s: float = 0.0
    not_before: float = 0.0
    failing: bool = False
    disabled: bool = False
    sent: CheckpointCost | None = field(default=None)


class Reporters:
    """Fan-out to several reporters from one background thread; never raises into training.

    Args:
        reporters: the sinks.
        clock: a monotonic clock (tests replace it).
    """

    def __init__(
        self, reporters: Sequence[Reporter], *, clock: Callable[[], float] = time.monotonic
    ):
        self._states = [_State(r) for r in reporters]
        self._clock = clock
        self._wake = threading.Condition()
        self._pending: CheckpointCost | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def names(self) -> list[str]:
        return [s.reporter.name for s in self._states]

    def __bool__(self) -> bool:
        return bool(self._states)

    def report(self, cost: CheckpointCost) -> None:
        """Hand `cost` to the thread (a newer cost replaces one not sent yet); returns at once."""
        if not self._states:
            return
        with self._wake:
            if self._closed:
                return
            self._pending = cost
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="preemptible-reporters", daemon=True
                )
                self._thread.start()
            self._wake.notify_all()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the pending cost went to every reporter not backing off (for tests)."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            while self._pending is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(timeout=left)
        return True

    def close(self) -> None:
        """Stop the thread (a daemon: a stuck request never holds the exit) and the reporters."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        for state in self._states:
            try:
                state.reporter.close()
            except Exception as exc:
                log.debug("closing the %s reporter failed: %r", state.reporter.name, exc)

    # --- the thread ---------------------------------------------------------------------------

    _busy = False

    def _loop(self) -> None:
        latest: CheckpointCost | None = None
        while True:
            with self._wake:
                while not self._closed and self._pending is None and not self._retry_due(latest):
                    self._wake.wait(timeout=self._next_retry_in(latest))
                if self._closed:
                    return
                if self._pending is not None:
                    latest, self._pending = self._pending, None
                self._busy = True
            try:
                assert latest is not None
                for state in self._states:
                    self._send(state, latest)
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

    def _owed(self, latest: CheckpointCost | None) -> list[_State]:
        return [
            s
            for s in self._states
            if not s.disabled and latest is not None and s.sent is not latest
        ]

    def _retry_due(self, latest: CheckpointCost | None) -> bool:
        now = self._clock()
        return any(s.not_before <= now for s in self._owed(latest))

    def _next_retry_in(self, latest: CheckpointCost | None) -> float | None:
        owed = self._owed(latest)
        if not owed:
            return None
        return max(0.01, min(s.not_before for s in owed) - self._clock())

    def _send(self, state: _State, cost: CheckpointCost) -> None:
        if state.disabled or state.sent is cost or state.not_before > self._clock():
            return
        name = state.reporter.name
        try:
            state.reporter.report(cost)
        except Deferred as deferred:  # the newest cost goes out when the rate limit allows
            state.not_before = self._clock() + max(0.0, deferred.retry_in_s)
            return
        except ReporterDisabled as exc:
            state.disabled = True
            log.warning("the %s reporter is off for this run: %s", name, exc)
            return
        except Exception as exc:  # a sink must never break training
            state.backoff_s = min(MAX_BACKOFF_S, max(1.0, 2 * state.backoff_s))
            state.not_before = self._clock() + state.backoff_s
            if not state.failing:  # once per outage: a sink that is down must not flood the log
                state.failing = True
                log.warning(
                    "the %s reporter failed (%s); training goes on, retrying with back-off",
                    name,
                    _describe(exc),
                )
            return
        state.sent = cost
        state.backoff_s, state.not_before = 0.0, 0.0
        if state.failing:
            state.failing = False
            log.info("the %s reporter works again", name)


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def from_env(env: Mapping[str, str]) -> Reporters:
    """The reporters this environment offers (``PREEMPTIBLE_REPORTERS`` overrides).

    Auto: ``kubernetes`` inside a pod with a mounted service-account token and the
    ``kubernetes`` package (``pip install 'preemptible[k8s]'``); ``slurm`` when ``SLURM_JOB_ID``
    is set and ``scontrol`` is on the PATH; ``prometheus`` when ``PREEMPTIBLE_METRICS_PORT`` is
    set. A reporter that cannot be built is logged and skipped.
    """
    from preemptible.runtime.reporters import kubernetes, prometheus, slurm

    builders: dict[str, Callable[[Mapping[str, str]], Reporter | None]] = {
        "kubernetes": kubernetes.PodAnnotations.from_env,
        "slurm": slurm.SlurmComment.from_env,
        "prometheus": prometheus.PrometheusGauges.from_env,
    }
    chosen = env.get(REPORTERS_ENV, "").strip().lower()
    if chosen in ("none", "off", "0"):
        return Reporters([])
    if chosen:
        names = [n.strip() for n in chosen.split(",") if n.strip()]
        unknown = [n for n in names if n not in builders]
        if unknown:
            log.warning(
                "%s: unknown reporters %s (known: %s)", REPORTERS_ENV, unknown, list(builders)
            )
    else:
        names = [
            n
            for n, wanted in (
                ("kubernetes", kubernetes.in_pod(env)),
                (
                    "slurm",
                    bool(env.get(slurm.SLURM_JOB_ID_ENV)) and shutil.which("scontrol") is not None,
                ),
                ("prometheus", bool(env.get(METRICS_PORT_ENV))),
            )
            if wanted
        ]
    built: list[Reporter] = []
    for name in names:
        if name not in builders:
            continue
        try:
            reporter = builders[name](env)
        except Exception as exc:
            log.warning(
                "the %s reporter could not start (%s); not reporting there", name, _describe(exc)
            )
            continue
        if reporter is not None:
            built.append(reporter)
    return Reporters(built)
