"""The sidecar: the trainer's cost file, sent on to the pod's annotations and to ``/metrics``.

The trainer writes its measured cost to a file on a volume it shares with this container
(`preemptible.runtime.cost_file`); the sidecar watches the file and hands each new cost to the
reporters (`preemptible.runtime.reporters`). So the trainer needs no API credentials: only the
sidecar mounts a service-account token, and its RBAC allows nothing but ``patch`` on pods
(`integrations/kubernetes/`). The alternative, the trainer patching its own pod, gives the
training code, and everything it imports, a token.

The file is polled (one ``stat`` a second, by default) rather than watched with inotify, which
misses changes on some network and overlay volumes and is Linux-only; a change of inode, size or
modification time means "read it again". The writer replaces the file with ``os.replace``, so a
read never sees half a file. A file that is missing (the trainer has not saved yet) is waited for
quietly; one that cannot be read is logged once and the last good values stay.

Stopping: SIGTERM or SIGINT sets a flag and writes a byte to a pipe the loop waits on, so the
handler takes no lock (a `threading.Event` set from a handler can deadlock on its own lock) and
the loop wakes at once; the reporters and the ``/metrics`` server are then closed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NamedTuple

from preemptible._env_names import SERVICE_ACCOUNT_DIR_ENV
from preemptible.checkpoint.stats import CheckpointCost
from preemptible.errors import BackendNotInstalledError, ConfigError
from preemptible.runtime.cost_file import read_cost_file
from preemptible.runtime.reporters import Reporter, Reporters
from preemptible.runtime.reporters.kubernetes import SERVICE_ACCOUNT_DIR

log = logging.getLogger("preemptible.runtime.sidecar")


DEFAULT_POLL_S = 1.0

__all__ = [
    "DEFAULT_POLL_S",
    "SERVICE_ACCOUNT_DIR_ENV",
    "Sidecar",
    "SidecarOptions",
    "run_until_signalled",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SidecarOptions:
    """What the sidecar watches and where it reports (the flags of ``preemptible sidecar``)."""

    cost_file: Path
    """The cost file the trainer writes (its ``$PREEMPTIBLE_COST_FILE``)."""
    pod: str | None = None
    """This pod's name (default ``$POD_NAME``, then ``$HOSTNAME``)."""
    namespace: str | None = None
    """Its namespace (default ``$POD_NAMESPACE``, then the service account's namespace file)."""
    annotations: bool = True
    """Patch the pod's annotations (needs the in-cluster service account)."""
    metrics_port: int | None = None
    """Serve the Prometheus gauges on this port (None: no ``/metrics``)."""
    metrics_addr: str = "127.0.0.1"
    """The address ``/metrics`` listens on (``0.0.0.0`` for a scrape of the pod's IP)."""
    poll_s: float = DEFAULT_POLL_S
    """Seconds between two looks at the cost file."""
    service_account_dir: Path = Path(SERVICE_ACCOUNT_DIR)
    """The mounted service account: ``token``, ``ca.crt``, ``namespace``."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.poll_s) and 0 < self.poll_s <= 3600):
            raise ConfigError(f"--poll-seconds must be in (0, 3600], got {self.poll_s}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port must be in 0..65535, got {self.metrics_port}")
        if not self.annotations and self.metrics_port is None:
            raise ConfigError(
                "the sidecar has nowhere to report: drop --no-annotations or give --metrics-port"
            )


class _Signature(NamedTuple):
    """What tells a rewritten file apart: `os.replace` gives it a new inode every time."""

    inode: int
    size: int
    mtime_ns: int


class Sidecar:
    """Polls the cost file and hands every new cost to the reporters.

    Args:
        cost_file: the file the trainer writes.
        reporters: where each new cost goes; closed by `close`.
        poll_s: seconds between two looks at the file.
        targets: where the reporters report, in words, for the start line.
    """

    def __init__(
        self,
        cost_file: Path,
        reporters: Reporters,
        *,
        poll_s: float = DEFAULT_POLL_S,
        targets: tuple[str, ...] = (),
    ) -> None:
        self.cost_file, self.reporters, self.poll_s = cost_file, reporters, poll_s
        self.targets = targets
        self.cost: CheckpointCost | None = None
        """The last good cost read (and handed on)."""
        self._signature: _Signature | None = None
        self._unreadable = False
        self._stopping = False
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    @classmethod
    def from_options(cls, options: SidecarOptions, env: Mapping[str, str]) -> Sidecar:
        """The sidecar with the reporters `options` ask for.

        Raises:
            ConfigError: no pod name, no service account, or ``/metrics`` cannot listen.
            BackendNotInstalledError: annotations asked for without the kubernetes client.
        """
        built: list[Reporter] = []
        targets: list[str] = []
        try:
            if options.annotations:
                pod, where = _pod_annotations(options, env)
                built.append(pod)
                targets.append(where)
            if options.metrics_port is not None:
                gauges, where = _gauges(options.metrics_port, options.metrics_addr)
                built.append(gauges)
                targets.append(where)
        except BaseException:
            Reporters(built).close()
            raise
        return cls(
            options.cost_file, Reporters(built), poll_s=options.poll_s, targets=tuple(targets)
        )

    def poll(self) -> CheckpointCost | None:
        """One look at the file: the new cost handed to the reporters, or None if none."""
        try:
            st = self.cost_file.stat()
        except FileNotFoundError:
            self._signature = None  # if it comes back, read it again
            return None
        except OSError as exc:
            self._unreadable_once(f"cannot stat the cost file {self.cost_file}: {exc}")
            return None
        signature = _Signature(st.st_ino, st.st_size, st.st_mtime_ns)
        if signature == self._signature:
            return None
        self._signature = signature
        try:
            cost = read_cost_file(self.cost_file)
        except FileNotFoundError:
            self._signature = None
            return None
        except (ConfigError, OSError) as exc:
            self._unreadable_once(str(exc))
            return None
        self._unreadable = False
        if cost == self.cost or cost.save.count == 0:  # no save measured yet: 0 s would be a lie
            return None
        self.cost = cost
        log.info(
            "new cost: step %s, save p95 %.3f s, restore %.3f s, %d bytes",
            cost.last_checkpoint_step,
            cost.save.p95,
            cost.restore.last,
            cost.bytes,
        )
        self.reporters.report(cost)
        return cost

    def run(self) -> None:
        """Poll until `stop` is called."""
        targets = " and ".join(self.targets) or "nowhere"
        log.info(
            "watching %s every %g s (waiting for the trainer's first save if it is missing); "
            "reporting to %s",
            self.cost_file,
            self.poll_s,
            targets,
        )
        while True:
            self.poll()
            if self._stopping:
                return
            select.select([self._wake_r], [], [], self.poll_s)

    def stop(self) -> None:
        """Make `run` return; safe from a signal handler and from any thread (takes no lock)."""
        self._stopping = True
        if not self._closed:
            with contextlib.suppress(BlockingIOError):  # the pipe is full: the loop is awake
                os.write(self._wake_w, b"\0")

    def close(self) -> None:
        """Close the reporters and the ``/metrics`` server (at most about a second)."""
        if self._closed:
            return
        self._closed = True
        self.reporters.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _unreadable_once(self, message: str) -> None:
        if not self._unreadable:  # once until a good file is read: a rewrite loop must not flood
            self._unreadable = True
            kept = "keeping the last good values" if self.cost else "nothing reported yet"
            log.warning("%s (%s)", message, kept)


def run_until_signalled(sidecar: Sidecar) -> signal.Signals | None:
    """Run `sidecar` in the main thread until SIGTERM or SIGINT, then close it.

    Returns:
        The signal that stopped it (None if `stop` was called otherwise).
    """
    received: list[signal.Signals] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum))  # list.append takes no lock a thread could hold
        sidecar.stop()

    stops = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.signal(s, on_signal) for s in stops}
    try:
        sidecar.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if received:
            log.info("%s received: stopping", received[0].name)
        sidecar.close()
    return received[0] if received else None


# --- the reporters -------------------------------------------------------------------------------


def _pod_annotations(options: SidecarOptions, env: Mapping[str, str]) -> tuple[Reporter, str]:
    """The pod-annotation reporter, from the in-cluster config, and where it reports."""
    try:
        from kubernetes.config.config_exception import ConfigException
    except ImportError as exc:
        raise BackendNotInstalledError(
            "the sidecar patches pod annotations with the kubernetes client: "
            "pip install 'preemptible[k8s]' (or pass --no-annotations to serve only /metrics)",
            extra="k8s",
        ) from exc
    from preemptible.runtime.reporters.kubernetes import PodAnnotations

    sa = options.service_account_dir
    if not (env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT")):
        raise ConfigError(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: the sidecar "
            "patches its pod from inside the pod, where Kubernetes sets them (outside, pass "
            "--no-annotations to serve only /metrics)"
        )
    for name in ("token", "ca.crt"):
        if not (sa / name).is_file():
            raise ConfigError(
                f"no service-account {name} in {sa}: mount the sidecar's service account there "
                f"(integrations/kubernetes/job.yaml does) or point {SERVICE_ACCOUNT_DIR_ENV} "
                "at it"
            )
    pod_env = dict(env)
    if options.pod:
        pod_env["POD_NAME"] = options.pod
    if options.namespace:
        pod_env["POD_NAMESPACE"] = options.namespace
    try:
        reporter = PodAnnotations.from_env(pod_env, service_account_dir=str(sa))
    except ConfigException as exc:
        raise ConfigError(f"the in-cluster config in {sa} is unusable: {exc}") from None
    assert reporter is not None  # from_env raises rather than return None
    host = reporter.api.api_client.configuration.host
    return reporter, f"the annotations of pod {reporter.namespace}/{reporter.pod} ({host})"


def _gauges(port: int, addr: str) -> tuple[Reporter, str]:
    from preemptible.runtime.reporters.prometheus import PrometheusGauges

    gauges = PrometheusGauges()
    try:
        bound = gauges.serve(port, addr)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve /metrics on {addr}:{port} ({exc.strerror or exc}): "
            "choose a free --metrics-port"
        ) from None
    host = f"[{addr}]" if ":" in addr else addr
    return gauges, f"/metrics on http://{host}:{bound}"
