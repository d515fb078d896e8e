"""AWS spot interruption notices, from the instance metadata service (IMDSv2).

Two minutes before EC2 stops, terminates or hibernates a spot instance, the metadata item
``/latest/meta-data/spot/instance-action`` appears (404 until then) with
``{"action": "terminate" | "stop" | "hibernate", "time": "2026-12-04T10:00:00Z"}``: the time is
the deadline (for hibernation it is about now: no two-minute warning). AWS asks to check every
5 seconds. ``/latest/meta-data/events/recommendations/rebalance`` (``{"noticeTime": ...}``)
appears earlier, when the instance is at elevated risk; it is only a hint, logged once, and
stops the job only when ``PREEMPTIBLE_AWS_REBALANCE`` is ``stop``.

IMDSv2 only: every read carries a session token from ``PUT /latest/api/token`` (header
``X-aws-ec2-metadata-token-ttl-seconds``), which instances that require IMDSv2 demand (401
without it). The token is renewed before its TTL runs out, and once more on a 401 (the
service restarted, or the clock jumped). IMDSv1 is not used: it is off on new instance types.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx

from preemptible._env_names import AWS_REBALANCE_ENV
from preemptible.runtime.notices.source import (
    CloudNotice,
    MetadataAnswerError,
    NoticeSource,
    Poll,
    unexpected,
)

log = logging.getLogger("preemptible")

DEFAULT_ENDPOINT = "http://169.254.169.254"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
"""The variable botocore and the AWS CLI read for the metadata service's address."""
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TOKEN_TTL_S = 21600
"""The longest session IMDSv2 grants (6 hours)."""
ACTIONS = ("terminate", "stop", "hibernate")


class AwsSpotNotices(NoticeSource):
    """Watches an EC2 spot instance's interruption notice (and its rebalance hint).

    Args:
        base_url: the metadata service (``$AWS_EC2_METADATA_SERVICE_ENDPOINT``).
        token_ttl_s: how long each session token lives (1 to 21600 s); renewed at 80 %.
        stop_on_rebalance: a rebalance recommendation stops the job too (not just a log line).
        **options: see `NoticeSource`.
    """

    cloud = "aws"

    def __init__(
        self,
        base_url: str = DEFAULT_ENDPOINT,
        *,
        token_ttl_s: int = MAX_TOKEN_TTL_S,
        stop_on_rebalance: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(base_url, **options)
        if not 1 <= token_ttl_s <= MAX_TOKEN_TTL_S:
            raise ValueError(f"token_ttl_s must be 1 to {MAX_TOKEN_TTL_S}, got {token_ttl_s}")
        self.token_ttl_s = token_ttl_s
        self.stop_on_rebalance = stop_on_rebalance
        self._token: str | None = None
        self._renew_at = 0.0
        self._rebalance_seen = False

    def watches(self) -> Mapping[str, Poll]:
        return {"spot instance-action": self._poll}

    def probe(self, timeout_s: float) -> bool:
        try:
            response = self._client.put(
                TOKEN_PATH, headers={TTL_HEADER: "60"}, timeout=httpx.Timeout(timeout_s)
            )
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and bool(response.text.strip())

    # --- the token ------------------------------------------------------------------------------

    def _session_token(self) -> str:
        if self._token is None or time.monotonic() >= self._renew_at:
            asked = time.monotonic()
            response = self._client.put(TOKEN_PATH, headers={TTL_HEADER: str(self.token_ttl_s)})
            if response.status_code != 200:
                raise unexpected(response)
            token = response.text.strip()
            if not token or len(token) > 4096 or not token.isascii():
                raise MetadataAnswerError(f"{TOKEN_PATH} answered no usable token")
            self._token = token
            self._renew_at = asked + 0.8 * self.token_ttl_s  # before it expires, not after
        return self._token

    def _get(self, path: str) -> httpx.Response:
        response = self._client.get(path, headers={TOKEN_HEADER: self._session_token()})
        if response.status_code == 401:  # the token expired early or the service restarted
            self._token = None
            response = self._client.get(path, headers={TOKEN_HEADER: self._session_token()})
        return response

    # --- the poll -------------------------------------------------------------------------------

    def _poll(self) -> CloudNotice | None:
        response = self._get(ACTION_PATH)
        if response.status_code == 200:
            action, at = parse_instance_action(response.text)
            when = datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")
            return CloudNotice(cloud=self.cloud, reason=f"spot {action} at {when}", deadline=at)
        if response.status_code != 404:
            raise unexpected(response)
        if self._rebalance_seen:
            return None
        response = self._get(REBALANCE_PATH)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise unexpected(response)
        notice_time = parse_rebalance(response.text)
        self._rebalance_seen = True
        if not self.stop_on_rebalance:
            log.warning(
                "aws: rebalance recommendation (noticeTime %s): this spot instance is at "
                "elevated risk of interruption; training goes on (%s=stop saves and exits now)",
                notice_time,
                AWS_REBALANCE_ENV,
            )
            return None
        return CloudNotice(
            cloud=self.cloud, reason=f"rebalance recommendation at {notice_time}", deadline=None
        )


def parse_instance_action(body: str) -> tuple[str, float]:
    """The action and its time (epoch seconds) from ``spot/instance-action``.

    Raises:
        MetadataAnswerError: the body is not the documented object.
    """
    document = _json_object(body, ACTION_PATH)
    action, at = document.get("action"), document.get("time")
    if action not in ACTIONS:
        raise MetadataAnswerError(f"{ACTION_PATH}: action {action!r} is none of {ACTIONS}")
    return str(action), _iso_time(at, ACTION_PATH)


def parse_rebalance(body: str) -> str:
    """The ``noticeTime`` of a rebalance recommendation, as AWS wrote it (checked).

    Raises:
        MetadataAnswerError: the body is not the documented object.
    """
    notice_time = _json_object(body, REBALANCE_PATH).get("noticeTime")
    _iso_time(notice_time, REBALANCE_PATH)
    return str(notice_time)


def _json_object(body: str, path: str) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except ValueError:
        raise MetadataAnswerError(f"{path} is not JSON: {body[:80]!r}") from None
    if not isinstance(document, dict):
        raise MetadataAnswerError(f"{path} is not a JSON object: {body[:80]!r}")
    return document


def _iso_time(value: object, path: str) -> float:
    """``2026-12-04T10:00:00Z`` (UTC) as epoch seconds."""
    if not isinstance(value, str):
        raise MetadataAnswerError(f"{path}: the time {value!r} is not a string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise MetadataAnswerError(f"{path}: {value!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise MetadataAnswerError(f"{path}: {value!r} has no time zone (AWS writes UTC, Z)")
    return parsed.timestamp()
