"""Azure Scheduled Events: spot evictions and terminations, from the Instance Metadata Service.

``GET /metadata/scheduledevents?api-version=2020-07-01`` (header ``Metadata: true``; 400
without it) answers ``{"DocumentIncarnation": N, "Events": [...]}``; each event has an
``EventId``, an ``EventType`` (``Preempt``, ``Terminate``, ``Reboot``, ``Redeploy``,
``Freeze``), the ``Resources`` it affects (VM names), an ``EventStatus`` (``Scheduled``, then
``Started``) and ``NotBefore`` (an RFC 1123 time such as ``Mon, 19 Sep 2016 18:29:47 GMT``,
empty once started), the time after which Azure may start it. Azure schedules a ``Preempt`` at
least 30 seconds ahead and a ``Terminate`` 5 to 15 minutes ahead (the scale set's setting).

Which events count. ``Preempt`` and ``Terminate`` stop the job, with ``NotBefore`` as the
deadline (now, when it is empty). Events go to every VM of an availability set or scale-set
placement group, so only those whose ``Resources`` name this VM (its
``compute/name``) are ours. An event without ``Resources`` names nobody in particular: it is
taken as ours, since saving for nothing costs one checkpoint and ignoring an eviction costs the
work since the last one. ``Reboot``, ``Redeploy`` and ``Freeze`` are logged once and do not stop
training (the VM comes back with its disks).

The acknowledgement. ``POST /metadata/scheduledevents`` with ``{"StartRequests": [{"EventId":
...}]}`` tells Azure it may start the event at once, before ``NotBefore``. It is sent only after
the notice save has committed (`committed`, which `Context` calls after the final save): sent
when the notice is taken, it would let Azure evict the VM in the middle of that save.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from preemptible.runtime.notices.source import (
    CloudNotice,
    MetadataAnswerError,
    NoticeSource,
    Poll,
    describe,
    unexpected,
)

log = logging.getLogger("preemptible")

DEFAULT_ENDPOINT = "http://169.254.169.254"
EVENTS_PATH = "/metadata/scheduledevents"
EVENTS_API_VERSION = "2020-07-01"
NAME_PATH = "/metadata/instance/compute/name"
INSTANCE_API_VERSION = "2021-02-01"
HEADERS = {"Metadata": "true"}
STOPPING = ("Preempt", "Terminate")
"""The event types that take the VM away."""
ACK_TIMEOUT_S = 2.0
FIRST_EVENTS_TIMEOUT_S = 120.0
"""Azure: the first request for Scheduled Events turns the service on and may take up to two
minutes to answer; a shorter timeout would make it look like an outage."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledEvent:
    """One entry of the ``Events`` array, with the fields this SDK reads."""

    event_id: str
    event_type: str
    resources: tuple[str, ...]
    status: str
    not_before: float | None
    """``NotBefore`` as epoch seconds; None when Azure left it empty (the event started)."""
    description: str = ""


class AzureNotices(NoticeSource):
    """Watches an Azure VM's Scheduled Events; acknowledges the one it acted on after the save.

    Args:
        base_url: the metadata service (``$PREEMPTIBLE_AZURE_METADATA_ENDPOINT``).
        vm_name: this VM's name as ``Resources`` lists it; read from the metadata service
            (``compute/name``) when not given.
        **options: see `NoticeSource`.
    """

    cloud = "azure"

    def __init__(
        self, base_url: str = DEFAULT_ENDPOINT, *, vm_name: str | None = None, **options: Any
    ) -> None:
        super().__init__(base_url, **options)
        self._vm_name = vm_name
        self._logged: set[str] = set()
        self._acked = False
        self._answered = False

    def watches(self) -> Mapping[str, Poll]:
        return {"scheduled events": self._poll}

    def probe(self, timeout_s: float) -> bool:
        # Not the events document: Azure may take up to two minutes over the first request,
        # which turns the service on. The VM's name answers at once.
        try:
            self._name(timeout=httpx.Timeout(timeout_s))
        except (httpx.HTTPError, MetadataAnswerError):
            return False
        return True

    # --- the poll -------------------------------------------------------------------------------

    def _poll(self) -> CloudNotice | None:
        read_s = self.timeout_s if self._answered else max(self.timeout_s, FIRST_EVENTS_TIMEOUT_S)
        response = self._client.get(
            EVENTS_PATH,
            params={"api-version": EVENTS_API_VERSION},
            headers=HEADERS,
            timeout=httpx.Timeout(read_s, connect=min(self.timeout_s, 1.0)),
        )
        if response.status_code != 200:
            raise unexpected(response)
        self._answered = True
        for event in parse_scheduled_events(response.text):
            if event.event_type in STOPPING:
                if not self._ours(event):
                    continue
                deadline = event.not_before if event.not_before is not None else self._clock()
                what = f"{event.event_type} event {event.event_id} ({event.status})"
                return CloudNotice(
                    cloud=self.cloud, reason=what, deadline=deadline, event_id=event.event_id
                )
            if event.event_id not in self._logged and self._ours(event):
                self._logged.add(event.event_id)
                log.info(
                    "azure: scheduled %s event %s (%s): training goes on",
                    event.event_type,
                    event.event_id,
                    event.description or event.status,
                )
        return None

    def _ours(self, event: ScheduledEvent) -> bool:
        if not event.resources:
            return True  # names nobody in particular: see the module docstring
        name = self._vm_name if self._vm_name is not None else self._name()
        self._vm_name = name
        return any(r.strip().casefold() == name.casefold() for r in event.resources)

    def _name(self, timeout: httpx.Timeout | None = None) -> str:
        response = self._client.get(
            NAME_PATH,
            params={"api-version": INSTANCE_API_VERSION, "format": "text"},
            headers=HEADERS,
            timeout=timeout if timeout is not None else self._client.timeout,
        )
        if response.status_code != 200:
            raise unexpected(response)
        name = response.text.strip()
        if not name or len(name) > 256 or "\n" in name:
            raise MetadataAnswerError(f"{NAME_PATH}: not a VM name: {name[:80]!r}")
        return name

    # --- the acknowledgement --------------------------------------------------------------------

    def committed(self, step: int) -> None:
        """Acknowledge the event this source acted on: the save of ``step`` has committed, so
        Azure may take the VM now. Once; a failure is logged (Azure goes ahead at NotBefore)."""
        notice = self.delivered
        if notice is None or notice.event_id is None or self._acked:
            return
        self._acked = True
        body = {"StartRequests": [{"EventId": notice.event_id}]}
        try:
            response = self._client.post(
                EVENTS_PATH,
                params={"api-version": EVENTS_API_VERSION},
                headers=HEADERS,
                json=body,
                timeout=ACK_TIMEOUT_S,
            )
            if response.status_code != 200:
                raise unexpected(response)
        except Exception as exc:  # the save is done; the ack is a courtesy, never an error
            log.warning(
                "azure: could not acknowledge event %s (%s); Azure starts it at its NotBefore",
                notice.event_id,
                describe(exc),
            )
            return
        log.info("azure: acknowledged event %s after the save of step %d", notice.event_id, step)


def parse_scheduled_events(body: str) -> list[ScheduledEvent]:
    """The events of a Scheduled Events document.

    Raises:
        MetadataAnswerError: the body is not the documented object (every event needs an
            ``EventId`` and an ``EventType``; a ``NotBefore`` must be an RFC 1123 time).
    """
    try:
        document = json.loads(body)
    except ValueError:
        raise MetadataAnswerError(f"{EVENTS_PATH} is not JSON: {body[:80]!r}") from None
    if not isinstance(document, dict) or not isinstance(document.get("Events", []), list):
        raise MetadataAnswerError(f"{EVENTS_PATH} is not an events document: {body[:80]!r}")
    if not isinstance(document.get("DocumentIncarnation"), int):
        raise MetadataAnswerError(f"{EVENTS_PATH} lacks an integer DocumentIncarnation")
    return [_event(raw) for raw in document.get("Events", [])]


def _event(raw: object) -> ScheduledEvent:
    if not isinstance(raw, dict):
        raise MetadataAnswerError(f"{EVENTS_PATH}: an event is not an object: {raw!r:.80}")
    event_id, event_type = raw.get("EventId"), raw.get("EventType")
    if not isinstance(event_id, str) or not event_id or not isinstance(event_type, str):
        raise MetadataAnswerError(f"{EVENTS_PATH}: an event lacks EventId or EventType")
    resources = raw.get("Resources") or []
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise MetadataAnswerError(f"{EVENTS_PATH}: Resources is not a list of names")
    return ScheduledEvent(
        event_id=event_id,
        event_type=event_type,
        resources=tuple(resources),
        status=str(raw.get("EventStatus", "")),
        not_before=_rfc1123(raw.get("NotBefore")),
        description=str(raw.get("Description", "")),
    )


def _rfc1123(value: object) -> float | None:
    """``Mon, 19 Sep 2016 18:29:47 GMT`` as epoch seconds; None for an empty or absent one."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MetadataAnswerError(f"{EVENTS_PATH}: NotBefore {value!r} is not a string")
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        raise MetadataAnswerError(f"{EVENTS_PATH}: NotBefore {value!r} is not a time") from None
