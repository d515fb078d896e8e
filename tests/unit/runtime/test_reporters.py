"""Reporters: pod annotations, SLURM comment, Prometheus gauges, and the fan-out.

The Kubernetes reporter runs the real ``kubernetes`` client, in-cluster config included,
against a local HTTPS server that checks each request. This is not a cluster test: no API
server can run on our machines, so RBAC, admission and the pod object itself are not exercised.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("kubernetes")

from preemptible.checkpoint.stats import CheckpointCost, Summary
from preemptible.runtime.reporters import Deferred, Reporters, from_env
from preemptible.runtime.reporters.kubernetes import PodAnnotations
from preemptible.runtime.reporters.prometheus import PrometheusGauges
from preemptible.runtime.reporters.slurm import SlurmComment
from tests.k8s_api import FakeApiServer, assert_pod_patch, fake_cluster

AT = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def make_cost(*, p95: float = 2.0, restore: float = 1.5, nbytes: int = 1000) -> CheckpointCost:
    save = Summary(last=p95, mean=p95, p95=p95, count=3)
    return CheckpointCost(
        save=save,
        stall=Summary(last=0.1, mean=0.1, p95=0.1, count=3),
        persist=save,
        restore=Summary(last=restore, mean=restore, p95=restore, count=1),
        bytes=nbytes,
        last_checkpoint_step=42,
        last_checkpoint_time=AT,
    )


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path, dict[str, str]]]:
    """The server, a mounted service-account dir (token, ca.crt, namespace) and the pod's env."""
    with fake_cluster(tmp_path) as cluster:
        yield cluster.server, cluster.service_account_dir, cluster.env


def make_pod_reporter(
    api: tuple[FakeApiServer, Path, dict[str, str]], **options: Any
) -> PodAnnotations:
    _server, sa, env = api
    reporter = PodAnnotations.from_env(env, service_account_dir=str(sa), **options)
    assert reporter is not None
    return reporter


# --- Kubernetes -----------------------------------------------------------------------------------


def test_the_pod_is_merge_patched_with_the_annotations_and_the_mounted_token(api: Any) -> None:
    server = api[0]
    reporter = make_pod_reporter(api)
    reporter.report(make_cost())
    reporter.close()
    [request] = server.requests
    assert_pod_patch(
        request,
        namespace="team-a",
        pod="trainer-0",
        annotations={
            "preemptible.dev/save-seconds-p95": "2.000",
            "preemptible.dev/restore-seconds": "1.500",
            "preemptible.dev/checkpoint-bytes": "1000",
            "preemptible.dev/last-checkpoint-time": "2026-01-01T00:00:00Z",
        },
    )


def test_pod_name_and_namespace_come_from_the_downward_api_and_the_prefix_is_configurable(
    api: Any,
) -> None:
    server, sa, env = api
    env = {
        **env,
        "POD_NAME": "job-7",
        "POD_NAMESPACE": "ml",
        "PREEMPTIBLE_ANNOTATION_PREFIX": "x.io/",
    }
    reporter = PodAnnotations.from_env(env, service_account_dir=str(sa))
    assert reporter is not None
    reporter.report(make_cost())
    assert server.requests[0]["path"] == "/api/v1/namespaces/ml/pods/job-7"
    assert "x.io/checkpoint-bytes" in server.requests[0]["body"]["metadata"]["annotations"]


def test_a_403_is_logged_once_and_the_reporter_stops(api: Any, caplog: Any) -> None:
    server = api[0]
    server.statuses = [403]
    reporters = Reporters([make_pod_reporter(api)])
    with caplog.at_level(logging.WARNING, logger="preemptible"):
        for nbytes in (1, 10, 100):  # large changes: the rate limit would let each through
            reporters.report(make_cost(nbytes=nbytes))
            assert reporters.flush()
    reporters.close()
    assert len(server.requests) == 1
    warnings = [r for r in caplog.records if "kubernetes reporter is off" in r.getMessage()]
    assert len(warnings) == 1 and "403" in warnings[0].getMessage()


def test_a_500_is_logged_once_backed_off_and_retried(api: Any, caplog: Any) -> None:
    server = api[0]
    server.statuses = [500]
    reporters = Reporters([make_pod_reporter(api)])
    with caplog.at_level(logging.INFO, logger="preemptible"):
        reporters.report(make_cost())
        server.wait_for(2)
        assert reporters.flush()
    reporters.close()
    first, second = server.requests
    assert second["at"] - first["at"] >= 0.9  # the first back-off is one second
    assert second["body"] == first["body"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("kubernetes reporter failed" in m for m in messages) == 1
    assert any("works again" in m for m in messages)


def test_patches_are_rate_limited_unless_a_value_changes_a_lot(api: Any) -> None:
    server = api[0]
    now = [100.0]
    reporter = make_pod_reporter(api, min_interval_s=30.0, clock=lambda: now[0])
    reporter.report(make_cost(p95=2.0))  # the first: sent
    now[0] += 1
    with pytest.raises(Deferred) as deferred:  # small change within the interval: held back
        reporter.report(make_cost(p95=2.2))
    assert deferred.value.retry_in_s == pytest.approx(29.0)
    now[0] += 1
    reporter.report(make_cost(p95=4.0))  # doubled: sent at once
    now[0] += 1
    with pytest.raises(Deferred):
        reporter.report(make_cost(p95=4.1))
    now[0] += 31
    reporter.report(make_cost(p95=4.1))  # the interval has passed: sent
    sent = [
        r["body"]["metadata"]["annotations"]["preemptible.dev/save-seconds-p95"]
        for r in server.requests
    ]
    assert sent == ["2.000", "4.000", "4.100"]


def test_a_silent_api_server_never_blocks_the_training_thread(api: Any) -> None:
    server = api[0]
    server.silent.set()
    reporters = Reporters([make_pod_reporter(api, timeout_s=5.0)])
    started = time.perf_counter()
    reporters.report(make_cost())
    server.wait_for(1)
    reporters.report(make_cost(nbytes=5000))  # while the first is stuck
    took = time.perf_counter() - started
    closing = time.perf_counter()
    reporters.close()
    assert took < 0.5
    assert time.perf_counter() - closing < 2.0  # close waits at most a second for the thread


# --- Prometheus, SLURM ----------------------------------------------------------------------------


def test_prometheus_gauges_hold_the_cost_and_are_served_on_localhost() -> None:
    gauges = PrometheusGauges()
    gauges.report(make_cost(p95=2.5, restore=1.25, nbytes=4096))
    text = gauges.text()
    assert "preemptible_save_seconds 2.5" in text
    assert "preemptible_restore_seconds 1.25" in text
    assert "preemptible_checkpoint_bytes 4096.0" in text
    assert "preemptible_last_checkpoint_timestamp_seconds 1.7672256e+09" in text
    port = gauges.serve(0)
    try:
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        gauges.close()
    assert "preemptible_checkpoint_bytes 4096.0" in scraped


def test_slurm_comment_goes_through_scontrol_with_the_exact_argv() -> None:
    calls: list[list[str]] = []

    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, "", "")

    now = [0.0]
    reporter = SlurmComment("4711", runner=runner, min_interval_s=30, clock=lambda: now[0])
    reporter.report(make_cost())
    now[0] += 5
    with pytest.raises(Deferred):
        reporter.report(make_cost())  # rate-limited
    assert calls == [
        [
            "scontrol",
            "update",
            "JobId=4711",
            "Comment=preemptible save_p95_s=2.000 restore_s=1.500 bytes=1000 step=42 at=1767225600",
        ]
    ]


def test_a_failing_scontrol_raises_for_the_fan_out_to_back_off() -> None:
    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(argv), 1, "", "Invalid job id specified\n")

    with pytest.raises(RuntimeError, match="Invalid job id"):
        SlurmComment("1", runner=runner).report(make_cost())


# --- the fan-out and the choice -------------------------------------------------------------------


class Recording:
    def __init__(self, name: str, fail: bool = False):
        self.name, self.fail = name, fail
        self.costs: list[CheckpointCost] = []
        self.closed = False

    def report(self, cost: CheckpointCost) -> None:
        self.costs.append(cost)
        if self.fail:
            raise OSError("sink down")

    def close(self) -> None:
        self.closed = True


def test_one_failing_reporter_does_not_stop_the_others(caplog: Any) -> None:
    broken, good = Recording("broken", fail=True), Recording("good")
    reporters = Reporters([broken, good])
    with caplog.at_level(logging.WARNING, logger="preemptible"):
        for nbytes in (1, 2, 3):
            reporters.report(make_cost(nbytes=nbytes))
            assert reporters.flush()
    reporters.close()
    assert [c.bytes for c in good.costs] == [1, 2, 3]
    assert len(broken.costs) == 1  # backing off: not called again within a second
    assert sum("broken reporter failed" in r.getMessage() for r in caplog.records) == 1
    assert broken.closed and good.closed


class RateLimited(Recording):
    """Takes one cost per `interval_s`; `got` is set once `want` costs arrived."""

    def __init__(self, interval_s: float, want: int):
        super().__init__("limited")
        self.interval_s, self.want = interval_s, want
        self.last_at: float | None = None
        self.got = threading.Event()

    def report(self, cost: CheckpointCost) -> None:
        now = time.monotonic()
        if self.last_at is not None and now - self.last_at < self.interval_s:
            raise Deferred(self.interval_s - (now - self.last_at))
        self.last_at = now
        self.costs.append(cost)
        if len(self.costs) >= self.want:
            self.got.set()


def test_a_cost_held_back_by_a_rate_limit_goes_out_when_the_interval_ends(caplog: Any) -> None:
    limited = RateLimited(interval_s=0.3, want=2)
    reporters = Reporters([limited])
    with caplog.at_level(logging.WARNING, logger="preemptible"):
        reporters.report(make_cost(nbytes=1))
        assert reporters.flush()
        reporters.report(make_cost(nbytes=2))  # held back...
        reporters.report(make_cost(nbytes=3))  # ...and replaced by a newer one
        assert limited.got.wait(timeout=5)
    reporters.close()
    assert [c.bytes for c in limited.costs] == [1, 3]
    assert not caplog.records  # a rate limit is not a failure


def test_from_env_picks_what_the_environment_offers_and_can_be_overridden() -> None:
    assert from_env({}).names == []
    assert from_env({"PREEMPTIBLE_REPORTERS": "none", "SLURM_JOB_ID": "9"}).names == []
    assert from_env({"PREEMPTIBLE_REPORTERS": "slurm", "SLURM_JOB_ID": "9"}).names == ["slurm"]
    assert from_env({"PREEMPTIBLE_REPORTERS": "prometheus"}).names == ["prometheus"]
    # asked for but impossible here (no service account): skipped with a warning, not raised
    assert from_env({"PREEMPTIBLE_REPORTERS": "kubernetes"}).names == []


def test_a_context_hands_each_measured_cost_to_its_reporters_and_closes_them(
    tmp_path: Path,
) -> None:
    from preemptible import Context

    sink = Recording("sink")
    reporters = Reporters([sink])
    with Context(tmp_path / "ckpt", every_steps=2, async_save=False, reporters=reporters) as ctx:
        ctx.register(state={"x": 1})
        for _ in ctx.steps(4):
            pass
        assert reporters.flush()
    assert sink.costs and sink.costs[-1].save.count >= 1
    assert sink.closed


def test_two_tiers_report_the_upload_beside_the_local_save() -> None:
    import dataclasses

    from preemptible.runtime.reporters.kubernetes import cost_annotations
    from preemptible.runtime.reporters.slurm import comment

    one_tier = make_cost()
    assert "preemptible.dev/upload-seconds-p95" not in cost_annotations(one_tier)
    assert "upload" not in comment(one_tier)
    two_tiers = dataclasses.replace(one_tier, upload=Summary(last=7.0, mean=7.0, p95=7.25, count=2))
    assert cost_annotations(two_tiers)["preemptible.dev/upload-seconds-p95"] == "7.250"
    assert "save_p95_s=2.000 restore_s=1.500 bytes=1000 upload_p95_s=7.250" in comment(two_tiers)
    gauges = PrometheusGauges()
    gauges.report(two_tiers)
    assert "preemptible_upload_seconds 7.25" in gauges.text()
