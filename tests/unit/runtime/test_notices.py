"""Cloud notice sources against the fake metadata servers of `tests.cloud_metadata`.

No mocks: every source talks HTTP to a local server that implements its cloud's documented API
(rejections, tokens, ETags, hanging waits), and the fakes' own fidelity is checked first.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from preemptible import Context
from preemptible.errors import ConfigError
from preemptible.runtime.notices import (
    CloudNotice,
    CloudNotices,
    NoticeSelection,
    build_source,
    parse_notices,
)
from preemptible.runtime.notices.aws import AwsSpotNotices, parse_instance_action, parse_rebalance
from preemptible.runtime.notices.azure import AzureNotices, parse_scheduled_events
from preemptible.runtime.notices.gcp import GcpNotices
from preemptible.runtime.notices.source import MetadataAnswerError, NoticeSource
from tests.cloud_metadata import FakeAzureImds, FakeGceMetadata, FakeImds, Fault, iso_utc
from tests.polling import wait_until
from tests.s3servers import free_port

FAST = {"poll_s": 0.02, "timeout_s": 1.0}


class Notices:
    """What a source handed on, collected for the test."""

    def __init__(self) -> None:
        self.got: list[CloudNotice] = []

    def __call__(self, notice: CloudNotice) -> None:
        self.got.append(notice)

    def wait(self, timeout: float = 5.0) -> CloudNotice:
        return wait_until(lambda: self.got and self.got[0], "a notice", timeout=timeout)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    server = FakeImds()
    yield server
    server.stop()


@pytest.fixture
def gce() -> Iterator[FakeGceMetadata]:
    server = FakeGceMetadata()
    yield server
    server.stop()


@pytest.fixture
def azure_imds() -> Iterator[FakeAzureImds]:
    server = FakeAzureImds()
    yield server
    server.stop()


def running(source: NoticeSource) -> Notices:
    notices = Notices()
    source.start(notices)
    return notices


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


# --- the fakes answer as the clouds document --------------------------------------------------


def test_the_fake_servers_reject_what_the_clouds_reject(imds, gce, azure_imds) -> None:
    assert httpx.get(f"{imds.url}/latest/meta-data/spot/instance-action").status_code == 401
    assert httpx.put(f"{imds.url}/latest/api/token").status_code == 400
    token = httpx.put(
        f"{imds.url}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    ).text
    reply = httpx.get(
        f"{imds.url}/latest/meta-data/spot/instance-action",
        headers={"X-aws-ec2-metadata-token": token},
    )
    assert reply.status_code == 404
    assert httpx.get(f"{gce.url}/computeMetadata/v1/instance/preempted").status_code == 403
    reply = httpx.get(
        f"{gce.url}/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}
    )
    assert (reply.status_code, reply.text, reply.headers["Metadata-Flavor"]) == (
        200,
        "FALSE",
        "Google",
    )
    events = f"{azure_imds.url}/metadata/scheduledevents?api-version=2020-07-01"
    assert httpx.get(events).status_code == 400
    assert httpx.get(events, headers={"Metadata": "true"}).json() == {
        "DocumentIncarnation": 1,
        "Events": [],
    }


def test_the_fake_gce_server_hangs_a_wait_until_the_value_changes(gce) -> None:
    url = f"{gce.url}/computeMetadata/v1/instance/preempted"
    etag = httpx.get(url, headers={"Metadata-Flavor": "Google"}).headers["ETag"]
    started = time.monotonic()
    params = {"wait_for_change": "true", "last_etag": etag, "timeout_sec": "1"}
    reply = httpx.get(url, params=params, headers={"Metadata-Flavor": "Google"})
    assert reply.text == "FALSE" and reply.headers["ETag"] == etag
    assert time.monotonic() - started >= 0.9


# --- parsing ------------------------------------------------------------------------------------


def test_an_instance_action_gives_its_action_and_its_time_as_the_deadline() -> None:
    action, at = parse_instance_action('{"action": "terminate", "time": "2026-12-04T10:00:00Z"}')
    assert action == "terminate"
    assert at == datetime(2026, 12, 4, 10, 0, tzinfo=UTC).timestamp()
    assert parse_rebalance('{"noticeTime": "2026-12-04T09:55:00Z"}') == "2026-12-04T09:55:00Z"


@pytest.mark.parametrize(
    "body",
    [
        "<html>502</html>",
        '{"action": "terminate", "time": ',
        '["terminate"]',
        '{"action": "terminate"}',
        '{"action": "reboot", "time": "2026-12-04T10:00:00Z"}',
        '{"action": "stop", "time": "2026-12-04T10:00:00"}',
        '{"action": "stop", "time": "soon"}',
    ],
    ids=["html", "bad-json", "list", "no-time", "unknown-action", "naive-time", "bad-time"],
)
def test_an_instance_action_that_is_not_the_documented_object_is_rejected(body: str) -> None:
    with pytest.raises(MetadataAnswerError):
        parse_instance_action(body)


def test_scheduled_events_parse_with_an_rfc1123_not_before() -> None:
    body = json.dumps(
        {
            "DocumentIncarnation": 3,
            "Events": [
                {
                    "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": ["FrontEnd_IN_0"],
                    "EventStatus": "Scheduled",
                    "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                },
                {"EventId": "b", "EventType": "Reboot", "EventStatus": "Started", "NotBefore": ""},
            ],
        }
    )
    first, second = parse_scheduled_events(body)
    assert first.event_type == "Preempt" and first.resources == ("FrontEnd_IN_0",)
    assert first.not_before == datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC).timestamp()
    assert second.not_before is None and second.resources == ()


@pytest.mark.parametrize(
    "body",
    [
        "<html></html>",
        "[]",
        '{"Events": []}',
        '{"DocumentIncarnation": 1, "Events": {}}',
        '{"DocumentIncarnation": 1, "Events": [{"EventType": "Preempt"}]}',
        '{"DocumentIncarnation": 1, "Events": [{"EventId": "a", "EventType": "Preempt", '
        '"NotBefore": "tomorrow"}]}',
    ],
    ids=["html", "list", "no-incarnation", "events-not-list", "no-id", "bad-not-before"],
)
def test_a_scheduled_events_document_of_the_wrong_shape_is_rejected(body: str) -> None:
    with pytest.raises(MetadataAnswerError):
        parse_scheduled_events(body)


# --- selection ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, NoticeSelection()),
        ("", NoticeSelection()),
        ("none", NoticeSelection()),
        ("aws", NoticeSelection(clouds=("aws",))),
        (" AWS, azure ,aws", NoticeSelection(clouds=("aws", "azure"))),
        (["gcp"], NoticeSelection(clouds=("gcp",))),
        ("auto", NoticeSelection(auto=True)),
    ],
    ids=["unset", "empty", "none", "one", "case-spaces-duplicates", "list", "auto"],
)
def test_the_notices_setting_parses(spec: Any, expected: NoticeSelection) -> None:
    assert parse_notices(spec) == expected
    assert bool(parse_notices(spec)) == (spec not in (None, "", "none"))


def test_an_unknown_notice_source_is_a_config_error_that_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'ec2'.*aws, gcp, azure, auto or none"):
        parse_notices("aws,ec2")
    with pytest.raises(ConfigError, match="auto"):
        parse_notices("auto,gcp")
    with pytest.raises(ConfigError, match="'ec2'"):
        Context("unused", notices="ec2")


def test_each_source_finds_its_endpoint_where_the_clouds_sdks_look() -> None:
    env = {
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:9",
        "GCE_METADATA_HOST": "127.0.0.1:10",
        "PREEMPTIBLE_AZURE_METADATA_ENDPOINT": "http://127.0.0.1:11/",
        "PREEMPTIBLE_NOTICES_POLL_SECONDS": "0.5",
    }
    urls = {cloud: build_source(cloud, env) for cloud in ("aws", "gcp", "azure")}
    assert {c: s.base_url for c, s in urls.items()} == {
        "aws": "http://127.0.0.1:9",
        "gcp": "http://127.0.0.1:10",
        "azure": "http://127.0.0.1:11",
    }
    assert all(s.poll_s == 0.5 for s in urls.values())
    assert build_source("gcp", {"GCE_METADATA_IP": "10.0.0.1"}).base_url == "http://10.0.0.1"
    defaults = {c: build_source(c, {}).base_url for c in ("aws", "gcp", "azure")}
    assert defaults == {
        "aws": "http://169.254.169.254",
        "gcp": "http://metadata.google.internal",
        "azure": "http://169.254.169.254",
    }
    with pytest.raises(ConfigError, match="PREEMPTIBLE_NOTICES_POLL_SECONDS"):
        build_source("aws", {"PREEMPTIBLE_NOTICES_POLL_SECONDS": "often"})
    with pytest.raises(ConfigError, match="PREEMPTIBLE_AWS_REBALANCE"):
        build_source("aws", {"PREEMPTIBLE_AWS_REBALANCE": "panic"})


def test_only_local_rank_zero_polls(monkeypatch) -> None:
    monkeypatch.setenv("PREEMPTIBLE_NOTICES", "aws")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert Context("unused").cloud_notices is not None
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert Context("unused").cloud_notices is None
    monkeypatch.delenv("LOCAL_RANK")
    assert Context("unused", notices="none").cloud_notices is None


# --- AWS ----------------------------------------------------------------------------------------


def test_an_aws_spot_interruption_is_a_notice_with_the_interruption_time(imds) -> None:
    source = AwsSpotNotices(imds.url, **FAST)
    notices = running(source)
    wait_until(lambda: imds.count("GET", imds.ACTION, 404) >= 2, "two polls without a notice")
    assert not notices.got
    at = imds.interrupt("stop", in_s=120)
    notice = notices.wait()
    source.close()
    assert notice.cloud == "aws" and "stop" in notice.reason and notice.deadline == at
    assert imds.count("GET", imds.ACTION, 401) == 0  # every read carried a live token
    assert imds.count("PUT", imds.TOKEN) == 1  # one session token for all of them


def test_the_aws_token_is_renewed_before_its_ttl_and_after_a_401(imds, caplog) -> None:
    source = AwsSpotNotices(imds.url, token_ttl_s=1, **FAST)
    running(source)
    wait_until(lambda: imds.count("PUT", imds.TOKEN) >= 3, "two renewals", timeout=5)
    assert imds.count("GET", imds.ACTION, 401) == 0  # renewed before it expired
    imds.expire_tokens()  # the service restarted: the live token is unknown now
    puts = imds.count("PUT", imds.TOKEN)
    wait_until(lambda: imds.count("PUT", imds.TOKEN) > puts, "a new token")
    wait_until(lambda: imds.count("GET", imds.ACTION, 404) > puts + 3, "polls again")
    source.close()
    assert warnings_of(caplog, "metadata server") == []  # a 401 is renewed, not an outage


def test_an_aws_rebalance_recommendation_is_logged_once_and_does_not_stop(imds, caplog) -> None:
    imds.recommend_rebalance()
    source = AwsSpotNotices(imds.url, **FAST)
    notices = running(source)
    wait_until(lambda: imds.count("GET", imds.ACTION) >= 5, "polls after the hint")
    source.close()
    assert notices.got == []
    assert len(warnings_of(caplog, "rebalance recommendation")) == 1
    assert imds.count("GET", imds.REBALANCE) == 1


def test_an_aws_rebalance_recommendation_stops_when_configured(imds) -> None:
    imds.recommend_rebalance()
    env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url, "PREEMPTIBLE_AWS_REBALANCE": "stop"}
    source = build_source("aws", env, **FAST)
    notice = running(source).wait()
    source.close()
    assert "rebalance" in notice.reason and notice.deadline is None


# --- Google -------------------------------------------------------------------------------------


def test_a_gce_preemption_arrives_through_a_hanging_wait_with_a_30_s_deadline(gce) -> None:
    source = GcpNotices(gce.url, wait_s=5, clock=lambda: 1000.0, **FAST)
    notices = running(source)
    path = "/computeMetadata/v1/instance/preempted"
    wait_until(lambda: [r for r in gce.requests if "last_etag" in r.query], "a hanging wait")
    time.sleep(0.3)  # the wait is hanging on the server now; it answers at the change
    assert gce.count("GET", path) == 2  # the first read, then one wait: no polling
    changed = time.monotonic()
    gce.set("preempted", "TRUE")
    notice = notices.wait()
    assert time.monotonic() - changed < 1.0
    source.close()
    assert notice.deadline == 1030.0 and "preempted" in notice.reason
    waits = [r.query for r in gce.requests if r.path == path and "wait_for_change" in r.query]
    assert waits[0]["wait_for_change"] == "true" and waits[0]["timeout_sec"] == "5"
    assert waits[0]["last_etag"]  # waits on what the first read returned


def test_a_gce_maintenance_terminate_gives_60_s_and_a_migration_does_not_stop(gce, caplog) -> None:
    caplog.set_level(logging.INFO, logger="preemptible")
    source = GcpNotices(gce.url, wait_s=5, clock=lambda: 1000.0, **FAST)
    notices = running(source)
    gce.set("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    wait_until(lambda: "MIGRATE_ON_HOST_MAINTENANCE" in caplog.text, "the migration logged")
    assert notices.got == []
    gce.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    notice = notices.wait()
    source.close()
    assert notice.deadline == 1060.0


def test_a_server_that_does_not_answer_as_google_is_never_believed(gce, caplog) -> None:
    gce.fault = Fault("garbage", body="TRUE")  # the right word, without Metadata-Flavor
    source = GcpNotices(gce.url, wait_s=1, **FAST)
    notices = running(source)
    wait_until(lambda: gce.count("GET", "/computeMetadata/v1/instance/preempted") >= 3, "polls")
    source.close()
    assert notices.got == []
    assert len(warnings_of(caplog, "Metadata-Flavor")) == 1


# --- Azure --------------------------------------------------------------------------------------


def test_an_azure_preempt_for_this_vm_is_a_notice_until_not_before(azure_imds) -> None:
    source = AzureNotices(azure_imds.url, **FAST)
    notices = running(source)
    azure_imds.schedule("Preempt", resources=["another-vm"])
    azure_imds.schedule("Reboot")
    wait_until(lambda: azure_imds.count("GET", azure_imds.EVENTS) >= 3, "polls")
    assert notices.got == []  # another VM's eviction, and a reboot, do not stop this one
    event_id, not_before = azure_imds.schedule("Preempt", in_s=30)
    notice = notices.wait()
    source.close()
    assert notice.event_id == event_id and notice.deadline == not_before
    assert azure_imds.acks == []  # nothing is acknowledged before the save


def test_an_azure_event_without_resources_is_ours(azure_imds) -> None:
    event_id, _ = azure_imds.schedule("Terminate", resources=[], in_s=600)
    source = AzureNotices(azure_imds.url, **FAST)
    assert running(source).wait().event_id == event_id
    source.close()


def test_azure_is_acknowledged_once_and_only_after_the_save_commits(azure_imds) -> None:
    source = AzureNotices(azure_imds.url, **FAST)
    source.committed(3)  # no notice yet: nothing to acknowledge
    assert azure_imds.acks == []
    notices = running(source)
    event_id, _ = azure_imds.schedule("Preempt")
    notices.wait()
    assert azure_imds.acks == []
    source.committed(7)
    source.committed(7)
    source.close()
    assert [ack.event_ids for ack in azure_imds.acks] == [[event_id]]
    assert azure_imds.events[0]["EventStatus"] == "Started"


# --- outages ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["error", "garbage", "slow"])
def test_an_outage_is_one_warning_and_its_end_one_info_line(imds, caplog, fault) -> None:
    caplog.set_level(logging.INFO, logger="preemptible")
    imds.fault = Fault(fault, seconds=0.6)
    source = AwsSpotNotices(imds.url, poll_s=0.01, timeout_s=0.3)
    notices = running(source)
    wait_until(lambda: len(imds.requests) >= 4, "several failed polls")
    assert len(warnings_of(caplog, "metadata server")) == 1
    imds.fault = None
    wait_until(lambda: "answers again" in caplog.text, "the recovery", timeout=10)
    imds.interrupt()
    assert notices.wait(timeout=10).cloud == "aws"  # and it still works
    source.close()
    assert len(warnings_of(caplog, "metadata server")) == 1
    assert caplog.text.count("answers again") == 1


def test_a_server_that_is_down_is_one_warning_and_no_notice(caplog) -> None:
    source = AwsSpotNotices(f"http://127.0.0.1:{free_port()}", poll_s=0.01, timeout_s=0.3)
    notices = running(source)
    time.sleep(0.5)  # refused connections, backing off
    source.close()
    assert notices.got == [] and len(warnings_of(caplog, "metadata server")) == 1


# --- auto ----------------------------------------------------------------------------------------


def test_auto_trusts_the_dmi_strings_and_probes_nothing(imds, tmp_path) -> None:
    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    env = {
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url,
        "PREEMPTIBLE_NOTICES_POLL_SECONDS": "0.02",
    }
    notices = CloudNotices(parse_notices("auto"), env, dmi_dir=tmp_path)
    got: list[tuple[str, float | None]] = []
    notices.start(lambda reason, deadline: got.append((reason, deadline)))
    wait_until(lambda: notices.sources, "detection")
    at = imds.interrupt()
    wait_until(lambda: got, "the notice")
    notices.close()
    assert [s.cloud for s in notices.sources] == ["aws"]
    assert got[0][0].startswith("aws: spot terminate") and got[0][1] == at


def test_auto_without_dmi_probes_every_cloud_and_watches_the_one_that_answers(
    gce, tmp_path
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    env = {
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://{closed}",
        "GCE_METADATA_HOST": gce.host,
        "PREEMPTIBLE_AZURE_METADATA_ENDPOINT": f"http://{closed}",
    }
    notices = CloudNotices(parse_notices("auto"), env, dmi_dir=tmp_path)
    started = time.monotonic()
    notices.start(lambda reason, deadline: None)
    assert time.monotonic() - started < 0.1  # detection runs in the background
    wait_until(lambda: notices.sources, "detection", timeout=5)
    notices.close()
    assert [s.cloud for s in notices.sources] == ["gcp"]


def test_rfc1123_times_round_trip_through_the_fake() -> None:
    at = float(int(time.time()))
    text = format_datetime(datetime.fromtimestamp(at, UTC), usegmt=True)
    body = json.dumps(
        {
            "DocumentIncarnation": 1,
            "Events": [{"EventId": "x", "EventType": "Preempt", "NotBefore": text}],
        }
    )
    assert parse_scheduled_events(body)[0].not_before == at
    assert iso_utc(at).endswith("Z")
