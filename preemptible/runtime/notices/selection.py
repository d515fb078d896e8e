"""Which clouds to watch: ``PREEMPTIBLE_NOTICES`` (or ``Context(notices=...)``), and ``auto``.

Off by default: a job outside a cloud must not pay for looking, and one inside a cloud that
the job's owner did not name may block the metadata server on purpose. ``aws,gcp,azure`` names
them; ``auto`` finds the cloud this VM runs in, in the background so the training start never
waits for it:

1. the DMI strings the hypervisor puts in ``/sys/class/dmi/id`` (``Amazon EC2``, ``Google``,
   ``Microsoft Corporation``), a file read that costs nothing, name the cloud when they can;
   that cloud's source starts at once (an unreachable server then says so, once);
2. otherwise every cloud's metadata server is probed in parallel with a short timeout
   (`PROBE_TIMEOUT_S`), and the ones that answer as their API documents are watched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preemptible._env_names import (
    AWS_REBALANCE_ENV,
    AZURE_METADATA_ENDPOINT_ENV,
    NOTICES_ENV,
    NOTICES_POLL_ENV,
)
from preemptible.errors import ConfigError
from preemptible.runtime.env import seconds_from_env
from preemptible.runtime.notices import aws, azure, gcp
from preemptible.runtime.notices.source import DEFAULT_POLL_S, CloudNotice, NoticeSource

log = logging.getLogger("preemptible")

CLOUDS = ("aws", "gcp", "azure")
AUTO = "auto"
OFF = ("", "none", "off")
PROBE_TIMEOUT_S = 0.2
DMI_DIR = Path("/sys/class/dmi/id")
DMI_HINTS = (  # (file, text it contains, cloud)
    ("sys_vendor", "amazon ec2", "aws"),
    ("bios_vendor", "amazon ec2", "aws"),
    ("product_name", "google compute engine", "gcp"),
    ("sys_vendor", "google", "gcp"),
    ("sys_vendor", "microsoft corporation", "azure"),
)  # fmt: skip
"""Microsoft's string also names Hyper-V outside Azure: an Azure hint is probed, not trusted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NoticeSelection:
    """What ``PREEMPTIBLE_NOTICES`` asks for."""

    clouds: tuple[str, ...] = ()
    """The clouds named (empty with ``auto`` or off)."""
    auto: bool = False
    """Find the cloud this VM runs in."""

    def __bool__(self) -> bool:
        return self.auto or bool(self.clouds)


def parse_notices(spec: str | Iterable[str] | None) -> NoticeSelection:
    """Parse ``"aws,gcp"``, ``["azure"]``, ``"auto"``, ``"none"`` or None (off).

    Raises:
        ConfigError: an unknown name (the message lists the valid ones), or ``auto`` together
            with a cloud's name.
    """
    if spec is None:
        return NoticeSelection()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [str(item).strip().lower() for item in items]
    names = [n for n in names if n not in OFF]
    valid = f"{', '.join(CLOUDS)}, {AUTO} or none"
    unknown = [n for n in names if n not in (*CLOUDS, AUTO)]
    if unknown:
        raise ConfigError(
            f"{NOTICES_ENV}/notices=: unknown notice source {unknown[0]!r}; valid: {valid} "
            "(comma-separated)"
        )
    if AUTO in names:
        if len(set(names)) > 1:
            raise ConfigError(f"{NOTICES_ENV}/notices=: {AUTO!r} finds the cloud; name no other")
        return NoticeSelection(auto=True)
    return NoticeSelection(clouds=tuple(dict.fromkeys(names)))


def build_source(cloud: str, env: Mapping[str, str], **options: Any) -> NoticeSource:
    """The source for ``cloud``, at the endpoint the environment names (each cloud's own SDK
    variable, ``$PREEMPTIBLE_AZURE_METADATA_ENDPOINT`` for Azure, which has none).

    Raises:
        ConfigError: a notice variable is invalid.
    """
    poll_s = seconds_from_env(env, NOTICES_POLL_ENV)
    options.setdefault("poll_s", DEFAULT_POLL_S if poll_s is None else max(poll_s, 0.01))
    if cloud == "aws":
        rebalance = env.get(AWS_REBALANCE_ENV, "log").strip().lower() or "log"
        if rebalance not in ("log", "stop"):
            raise ConfigError(f"{AWS_REBALANCE_ENV}={rebalance!r}: use 'log' or 'stop'")
        url = env.get(aws.ENDPOINT_ENV, "").strip() or aws.DEFAULT_ENDPOINT
        return aws.AwsSpotNotices(url, stop_on_rebalance=rebalance == "stop", **options)
    if cloud == "gcp":
        return gcp.GcpNotices(gcp.endpoint(env), **options)
    if cloud == "azure":
        url = env.get(AZURE_METADATA_ENDPOINT_ENV, "").strip() or azure.DEFAULT_ENDPOINT
        return azure.AzureNotices(url, **options)
    raise ConfigError(f"unknown notice source {cloud!r}; valid: {', '.join(CLOUDS)}")


def dmi_hint(dmi_dir: Path = DMI_DIR) -> str | None:
    """The cloud the DMI strings name, or None (not a VM of theirs, or no /sys)."""
    for file, text, cloud in DMI_HINTS:
        try:
            value = (dmi_dir / file).read_text(errors="replace").strip().lower()
        except OSError:
            continue
        if text in value:
            return cloud
    return None


class CloudNotices:
    """The cloud notice sources of one node, started beside the signal handlers.

    Built by `Context` on local rank 0 only (one poller per node: every rank of a VM goes away
    with it, and the ranks agree on the stop step anyway). A notice is recorded with
    `PreemptionGuard.request` and the cloud's deadline; `committed` runs after the notice save.

    Args:
        selection: what to watch (`parse_notices`).
        env: where endpoints and options come from (``os.environ`` in `Context`).
        dmi_dir: where ``auto`` reads the DMI strings (tests point it elsewhere).
        **options: for each source (`NoticeSource`), e.g. ``timeout_s``.
    """

    def __init__(
        self,
        selection: NoticeSelection,
        env: Mapping[str, str],
        *,
        dmi_dir: Path = DMI_DIR,
        **options: Any,
    ) -> None:
        self.selection = selection
        self._lock = threading.Lock()
        self._closed = False
        self._sources: list[NoticeSource] = []
        self._dmi_dir = dmi_dir
        self._detector: threading.Thread | None = None
        # Built now (not in the thread) so that an invalid variable is a ConfigError at start.
        clouds = selection.clouds if not selection.auto else CLOUDS
        self._candidates = [build_source(cloud, env, **options) for cloud in clouds]

    @property
    def sources(self) -> tuple[NoticeSource, ...]:
        """The sources being watched (with ``auto``, once detection has found them)."""
        with self._lock:
            return tuple(self._sources)

    def start(self, request: Callable[[str, float | None], None]) -> None:
        """Start watching; ``request(reason, deadline)`` records a notice (from a thread)."""

        def on_notice(notice: CloudNotice) -> None:
            log.warning(
                "%s notice: %s; saving at the next step boundary", notice.cloud, notice.reason
            )
            request(f"{notice.cloud}: {notice.reason}", notice.deadline)

        if not self.selection.auto:
            self._launch(self._candidates, on_notice)
            return
        self._detector = threading.Thread(
            target=self._detect, args=(on_notice,), name="preemptible-notices-auto", daemon=True
        )
        self._detector.start()

    def _detect(self, on_notice: Callable[[CloudNotice], None]) -> None:
        by_cloud = {source.cloud: source for source in self._candidates}
        hint = dmi_hint(self._dmi_dir)
        if hint is not None and hint != "azure":
            found = [by_cloud[hint]]
        else:
            with ThreadPoolExecutor(len(self._candidates)) as pool:
                answers = list(pool.map(lambda s: s.probe(PROBE_TIMEOUT_S), self._candidates))
            found = [s for s, ok in zip(self._candidates, answers, strict=True) if ok]
        for source in self._candidates:
            if source not in found:
                source.close()
        if not found:
            log.debug("notices=auto: no cloud metadata server answered; watching signals only")
            return
        log.info("notices=auto: watching %s", ", ".join(s.cloud for s in found))
        self._launch(found, on_notice)

    def _launch(
        self, sources: list[NoticeSource], on_notice: Callable[[CloudNotice], None]
    ) -> None:
        with self._lock:
            if self._closed:
                for source in sources:
                    source.close()
                return
            self._sources = list(sources)
            for source in sources:
                source.start(on_notice)

    def committed(self, step: int) -> None:
        """The notice save of ``step`` has committed: acknowledge where a cloud asks for it."""
        for source in self.sources:
            source.committed(step)

    def close(self) -> None:
        """Stop every source."""
        with self._lock:
            self._closed = True
            sources = self._sources or self._candidates
        for source in sources:
            source.close()
