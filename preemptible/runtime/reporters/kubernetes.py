"""The pod's annotations (`preemptible.dev/save-seconds-p95`...) through the official client.

In-cluster config from the mounted service account (token, ``ca.crt``, namespace) and
``KUBERNETES_SERVICE_HOST``/``PORT``; the pod is ``$POD_NAME`` (downward API) or
``$HOSTNAME``, its namespace ``$POD_NAMESPACE`` or the mounted namespace file.

A JSON merge patch (RFC 7386, ``application/merge-patch+json``) of ``metadata.annotations``:
annotations are a plain map, so strategic merge would do the same thing, and a merge patch
says exactly what changes without Kubernetes-specific patch semantics. Whether the account may
patch is learnt from the first answer instead of a SelfSubjectAccessReview: a 403 turns the
reporter off for the run (one log line), which costs one request either way and needs no
extra RBAC rule. Patches go out at most once per ``min_interval_s`` unless a value moved by
more than ``change_ratio``, so a job that saves every few seconds does not load the API server;
a cost held back goes out when the interval ends (`Deferred`), unless a newer one replaced it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from preemptible._env_names import ANNOTATION_PREFIX_ENV
from preemptible.checkpoint import CheckpointCost
from preemptible.errors import BackendNotInstalledError, ConfigError
from preemptible.runtime.reporters.sink import Deferred, ReporterDisabled

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_PREFIX = "preemptible.dev/"
MERGE_PATCH = "application/merge-patch+json"


def in_pod(env: Mapping[str, str], service_account_dir: str = SERVICE_ACCOUNT_DIR) -> bool:
    """Inside a pod with a mounted service-account token."""
    return (
        bool(env.get("KUBERNETES_SERVICE_HOST")) and (Path(service_account_dir) / "token").is_file()
    )


def cost_annotations(cost: CheckpointCost, prefix: str = DEFAULT_PREFIX) -> dict[str, str]:
    """The annotation values for `cost` (`docs/maintainers/design.md`, SDK cost)."""
    values = {
        "save-seconds-p95": f"{cost.save.p95:.3f}",
        "restore-seconds": f"{cost.restore.last:.3f}",
        "checkpoint-bytes": str(cost.bytes),
    }
    if cost.upload.count:  # two tiers: the save above is the local commit, this the upload
        values["upload-seconds-p95"] = f"{cost.upload.p95:.3f}"
    if cost.last_checkpoint_time is not None:
        at = datetime.fromtimestamp(cost.last_checkpoint_time, UTC)
        values["last-checkpoint-time"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {prefix + k: v for k, v in values.items()}


class PodAnnotations:
    """Patches this pod's annotations with the measured cost.

    Args:
        api: a ``kubernetes.client.CoreV1Api`` with in-cluster config.
        pod: this pod's name.
        namespace: its namespace.
        prefix: the annotation prefix.
        min_interval_s: at most one patch per this many seconds...
        change_ratio: ...unless a number moved by more than this fraction.
        timeout_s: timeout of one request.
        clock: a monotonic clock (tests replace it).
    """

    name = "kubernetes"

    def __init__(
        self,
        api: Any,
        pod: str,
        namespace: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        min_interval_s: float = 30.0,
        change_ratio: float = 0.5,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.api, self.pod, self.namespace, self.prefix = api, pod, namespace, prefix
        self.min_interval_s, self.change_ratio, self.timeout_s = (
            min_interval_s,
            change_ratio,
            timeout_s,
        )
        self._clock = clock
        self._last: tuple[float, CheckpointCost] | None = None

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
        **options: Any,
    ) -> PodAnnotations | None:
        """The reporter for this pod, in-cluster config from `service_account_dir`."""
        try:
            from kubernetes import client
            from kubernetes.config.incluster_config import InClusterConfigLoader
        except ImportError as exc:
            raise BackendNotInstalledError(
                "pod annotations need the kubernetes client: pip install 'preemptible[k8s]'",
                extra="k8s",
            ) from exc
        sa = Path(service_account_dir)
        pod = env.get("POD_NAME") or env.get("HOSTNAME") or ""
        namespace = env.get("POD_NAMESPACE") or ""
        if not namespace and (sa / "namespace").is_file():
            namespace = (sa / "namespace").read_text().strip()
        if not pod or not namespace:
            raise ConfigError(
                "the pod's name and namespace are unknown: set POD_NAME and POD_NAMESPACE from "
                "the downward API"
            )
        config = client.Configuration()
        loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(sa / "token"), cert_filename=str(sa / "ca.crt"), environ=env
        )
        loader.load_and_set(config)  # type: ignore[no-untyped-call]
        api = client.CoreV1Api(client.ApiClient(config))
        prefix = env.get(ANNOTATION_PREFIX_ENV) or DEFAULT_PREFIX
        return cls(api, pod, namespace, prefix=prefix, **options)

    def wait_before_patch(self, cost: CheckpointCost) -> float:
        """Rate limit: the first cost, then one per interval or on a large change.

        Returns:
            0.0 to patch now, else the seconds until the interval allows it.
        """
        if self._last is None:
            return 0.0
        at, sent = self._last
        left = self.min_interval_s - (self._clock() - at)
        if left <= 0:
            return 0.0
        pairs = (
            (sent.save.p95, cost.save.p95),
            (sent.upload.p95, cost.upload.p95),
            (sent.restore.last, cost.restore.last),
            (float(sent.bytes), float(cost.bytes)),
        )
        moved = any(abs(new - old) > self.change_ratio * max(abs(old), 1e-9) for old, new in pairs)
        return 0.0 if moved else left

    def report(self, cost: CheckpointCost) -> None:
        wait = self.wait_before_patch(cost)
        if wait > 0:
            raise Deferred(wait)
        from kubernetes.client.exceptions import ApiException

        body = {"metadata": {"annotations": cost_annotations(cost, self.prefix)}}
        try:
            self.api.patch_namespaced_pod(
                self.pod,
                self.namespace,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self.timeout_s,
            )
        except ApiException as exc:
            if exc.status in (401, 403):
                raise ReporterDisabled(
                    f"HTTP {exc.status}: the service account may not patch pod "
                    f"{self.namespace}/{self.pod} (give it RBAC 'patch' on its own pod)"
                ) from None
            raise RuntimeError(f"HTTP {exc.status} patching pod {self.pod}: {exc.reason}") from None
        self._last = (self._clock(), cost)

    def close(self) -> None:
        closer = getattr(getattr(self.api, "api_client", None), "close", None)
        if callable(closer):
            closer()
