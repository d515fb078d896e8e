"""Google Compute Engine preemption and host-maintenance notices, from the metadata server.

Two keys under ``/computeMetadata/v1/instance/``, each watched by a hanging GET
(``?wait_for_change=true&last_etag=E&timeout_sec=S``: the server answers when the value's ETag
differs from ``E``, or after ``S`` seconds with the same value), so a change arrives at once
without polling:

- ``preempted`` turns from ``FALSE`` to ``TRUE`` when a preemptible or Spot VM is preempted.
  Compute Engine then sends the ACPI soft-off (our SIGTERM) and stops the VM about 30 seconds
  later: the deadline is the notice's arrival plus `PREEMPTION_NOTICE_S`.
- ``maintenance-event`` turns from ``NONE`` to ``MIGRATE_ON_HOST_MAINTENANCE`` (a live
  migration: logged, training goes on) or ``TERMINATE_ON_HOST_MAINTENANCE`` 60 seconds before
  the maintenance: the deadline is the arrival plus `MAINTENANCE_NOTICE_S`.

Every request carries ``Metadata-Flavor: Google`` (the server answers 403 without it), and every
answer must carry it back: a server that does not is not Google's, whatever it says. The first
read of each key is a plain GET, which gives the current value and ETag (a VM preempted before
the job started must not wait for a change that already happened).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from preemptible.runtime.notices.source import (
    CloudNotice,
    MetadataAnswerError,
    NoticeSource,
    Poll,
    unexpected,
)

log = logging.getLogger("preemptible")

DEFAULT_HOST = "metadata.google.internal"
HOST_ENV = "GCE_METADATA_HOST"
"""host[:port] of the metadata server, as google-auth and the Cloud client libraries read it."""
IP_ENV = "GCE_METADATA_IP"
"""The metadata server's IP, which google-auth reads for its ping; used when HOST_ENV is unset."""
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
MAINTENANCE_PATH = "/computeMetadata/v1/instance/maintenance-event"
FLAVOR_HEADER = "Metadata-Flavor"
FLAVOR = "Google"

PREEMPTION_NOTICE_S = 30.0
"""Google: a preempted VM gets about 30 s between the ACPI soft-off and the stop."""
MAINTENANCE_NOTICE_S = 60.0
"""Google: ``maintenance-event`` changes 60 s before the host maintenance begins."""
DEFAULT_WAIT_S = 60.0
"""How long one hanging GET waits on the server (``timeout_sec``)."""

_EVENT = re.compile(r"[A-Z][A-Z0-9_]*")


class GcpNotices(NoticeSource):
    """Watches a Compute Engine VM's ``preempted`` and ``maintenance-event`` keys.

    Args:
        base_url: the metadata server (``http://$GCE_METADATA_HOST``).
        wait_s: how long one ``wait_for_change`` request waits on the server (whole seconds).
        **options: see `NoticeSource`.
    """

    cloud = "gcp"

    def __init__(self, base_url: str, *, wait_s: float = DEFAULT_WAIT_S, **options: Any) -> None:
        super().__init__(base_url, **options)
        self.wait_s = wait_s
        self._etags: dict[str, str] = {}
        self._pause: dict[str, float] = {}
        self._logged: set[str] = set()

    def watches(self) -> Mapping[str, Poll]:
        return {"preempted": self._poll_preempted, "maintenance-event": self._poll_maintenance}

    def probe(self, timeout_s: float) -> bool:
        try:
            response = self._client.get(
                PREEMPTED_PATH, headers={FLAVOR_HEADER: FLAVOR}, timeout=httpx.Timeout(timeout_s)
            )
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and response.headers.get(FLAVOR_HEADER) == FLAVOR

    def pause_s(self, what: str) -> float:
        return self._pause.get(what, 0.0)

    # --- the polls ------------------------------------------------------------------------------

    def _poll_preempted(self) -> CloudNotice | None:
        value = self._read("preempted", PREEMPTED_PATH, ("TRUE", "FALSE"))
        if value != "TRUE":
            return None
        return CloudNotice(
            cloud=self.cloud,
            reason="preempted (Compute Engine stops the VM about 30 s after the notice)",
            deadline=self._clock() + PREEMPTION_NOTICE_S,
        )

    def _poll_maintenance(self) -> CloudNotice | None:
        value = self._read("maintenance-event", MAINTENANCE_PATH, ())
        if value == "TERMINATE_ON_HOST_MAINTENANCE":
            return CloudNotice(
                cloud=self.cloud,
                reason="host maintenance terminates the VM in 60 s",
                deadline=self._clock() + MAINTENANCE_NOTICE_S,
            )
        if value != "NONE" and value not in self._logged:
            self._logged.add(value)  # a live migration, or an event this SDK does not know
            log.info("gcp: maintenance-event is %s: training goes on", value)
        return None

    def _read(self, what: str, path: str, allowed: Sequence[str]) -> str:
        """The key's value: at once the first time, then when it changes (or after wait_s)."""
        etag = self._etags.get(what)
        params: dict[str, str] = {}
        timeout = httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 1.0))
        if etag is not None:
            params = {
                "wait_for_change": "true",
                "last_etag": etag,
                "timeout_sec": f"{self.wait_s:g}",
            }
            timeout = httpx.Timeout(self.timeout_s + self.wait_s, connect=min(self.timeout_s, 1.0))
        started = time.monotonic()
        response = self._client.get(
            path, params=params, headers={FLAVOR_HEADER: FLAVOR}, timeout=timeout
        )
        if response.status_code != 200:
            raise unexpected(response)
        if response.headers.get(FLAVOR_HEADER) != FLAVOR:
            raise MetadataAnswerError(
                f"{path}: the answer lacks '{FLAVOR_HEADER}: {FLAVOR}' (not a GCE metadata server)"
            )
        value = response.text.strip()
        if not (value in allowed if allowed else _EVENT.fullmatch(value)):
            raise MetadataAnswerError(f"{path}: unexpected value {value[:80]!r}")
        new_etag = response.headers.get("ETag")
        if new_etag:
            self._etags[what] = new_etag
        else:
            self._etags.pop(what, None)
        # A server that answers a wait at once with nothing new (it ignores wait_for_change), or
        # sends no ETag to wait on, would make this loop spin: poll it every poll_s instead.
        quick = time.monotonic() - started < min(1.0, self.wait_s / 2)
        spins = not new_etag or (etag is not None and new_etag == etag and quick)
        self._pause[what] = self.poll_s if spins else 0.0
        return value


def endpoint(env: Mapping[str, str]) -> str:
    """The metadata server's base URL: ``$GCE_METADATA_HOST``, else ``$GCE_METADATA_IP``, else
    ``metadata.google.internal``, over plain HTTP as Google's own clients use it."""
    host = env.get(HOST_ENV, "").strip() or env.get(IP_ENV, "").strip() or DEFAULT_HOST
    return host if host.startswith(("http://", "https://")) else f"http://{host}"
