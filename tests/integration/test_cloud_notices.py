"""A real training loop under `Context`, in a subprocess, stopped by a cloud's notice.

The cloud is one of the fake metadata servers of `tests.cloud_metadata`, reached through the
variables the clouds' own SDKs read. The job must save at its next step boundary, exit with
128 + SIGTERM (a notice is a preemption), and leave a valid checkpoint of the step it stopped
at; Azure must be acknowledged only once that checkpoint has committed.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from preemptible import Checkpointer
from tests.cloud_metadata import FakeAzureImds, FakeGceMetadata, FakeImds, Fault
from tests.integration.test_torchrun import Output, spawn, torchrun_command

REPO = Path(__file__).parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "cloud_notice_train.py"
NOTICE_EXIT = 143  # 128 + SIGTERM: a programmatic notice exits as a preemption
STOPPED = re.compile(r"rank (\d+) stopped at step (\d+) reason='?([^']*?)'? deadline=([\d.]+|None)")


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREEMPTIBLE_")}
    env.update(PREEMPTIBLE_NOTICES_POLL_SECONDS="0.05", PYTHONPATH=str(REPO), **extra)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def start(ckpt: Path, env: dict[str, str], *, total: int = 100_000, torchrun: bool = False):
    args = [str(SCRIPT), str(ckpt), "--total", str(total), "--step-s", "0.05"]
    command = torchrun_command(*args) if torchrun else [sys.executable, *args]
    return Output(spawn(command, env))


def stopped(out: str) -> list[tuple[int, int, str, float | None]]:
    return [
        (int(r), int(s), reason, None if d == "None" else float(d))
        for r, s, reason, d in STOPPED.findall(out)
    ]


def assert_valid_checkpoint(ckpt: Path, step: int, world_size: int = 1) -> None:
    checkpointer = Checkpointer(ckpt)
    latest = checkpointer.latest()
    assert latest is not None and latest.step == step and latest.world_size == world_size
    report = checkpointer.verify(step)
    assert report.ok, report


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    server = FakeImds()
    yield server
    server.stop()


def test_an_aws_spot_interruption_saves_at_the_next_step_and_exits(tmp_path, imds) -> None:
    job = start(
        tmp_path / "ckpt",
        job_env(PREEMPTIBLE_NOTICES="aws", AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.url),
    )
    job.until(r"rank 0 step 3\b")
    at = imds.interrupt("terminate", in_s=120)
    code, out = job.finish()
    assert code == NOTICE_EXIT, out
    [(_, step, reason, deadline)] = stopped(out)
    assert reason.startswith("aws: spot terminate") and deadline == at
    steps_after = [int(s) for s in re.findall(r"rank 0 step (\d+)", out) if int(s) > 3]
    assert len(steps_after) < 20, out  # polled every 0.05 s: stopped within a few steps
    assert_valid_checkpoint(tmp_path / "ckpt", step)
    assert imds.count("GET", imds.ACTION, 401) == 0


def test_a_gce_preemption_saves_at_the_next_step_with_a_30_s_deadline(tmp_path) -> None:
    gce = FakeGceMetadata()
    try:
        job = start(
            tmp_path / "ckpt", job_env(PREEMPTIBLE_NOTICES="gcp", GCE_METADATA_HOST=gce.host)
        )
        job.until(r"rank 0 step 3\b")
        preempted_at = time.time()
        gce.set("preempted", "TRUE")
        code, out = job.finish()
    finally:
        gce.stop()
    assert code == NOTICE_EXIT, out
    [(_, step, reason, deadline)] = stopped(out)
    assert reason.startswith("gcp: preempted")
    assert deadline is not None and 30 <= deadline - preempted_at < 32  # arrival + 30 s
    assert_valid_checkpoint(tmp_path / "ckpt", step)
    told = [r for r in gce.requests if r.path.endswith("/preempted") and r.status == 200][-1]
    assert told.query.get("wait_for_change") == "true"  # it came through a hanging wait


def test_an_azure_preempt_saves_then_acknowledges_after_the_commit(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"

    def committed_step() -> int | None:
        latest = Checkpointer(ckpt).latest() if ckpt.exists() else None
        return None if latest is None else latest.step

    azure = FakeAzureImds(on_ack=committed_step)
    try:
        job = start(
            ckpt,
            job_env(PREEMPTIBLE_NOTICES="azure", PREEMPTIBLE_AZURE_METADATA_ENDPOINT=azure.url),
        )
        job.until(r"rank 0 step 3\b")
        azure.schedule("Preempt", resources=["some-other-vm"])
        event_id, not_before = azure.schedule("Preempt", in_s=30)
        code, out = job.finish()
    finally:
        azure.stop()
    assert code == NOTICE_EXIT, out
    [(_, step, reason, deadline)] = stopped(out)
    assert f"Preempt event {event_id}" in reason and deadline == not_before
    assert_valid_checkpoint(ckpt, step)
    [ack] = azure.acks
    assert ack.event_ids == [event_id]
    assert ack.seen == step  # when the ack arrived, the step it saved was already committed


def test_under_torchrun_one_poller_stops_both_ranks_at_the_same_step(tmp_path, imds) -> None:
    job = start(
        tmp_path / "ckpt",
        job_env(PREEMPTIBLE_NOTICES="aws", AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.url),
        torchrun=True,
    )
    job.until(r"rank 1 step ([3-9]|\d{2,})\b")  # any of them: two ranks may share a line
    at = imds.interrupt("terminate", in_s=120)
    code, out = job.finish()
    stops = sorted(stopped(out))
    assert [rank for rank, *_ in stops] == [0, 1], out
    assert stops[0][1] == stops[1][1], out  # one step for both ranks
    assert stops[0][3] == at  # rank 0 heard it from the metadata server
    assert code != 0 and f"exitcode  : {NOTICE_EXIT}" in out, out
    assert_valid_checkpoint(tmp_path / "ckpt", stops[0][1], world_size=2)
    assert imds.count("PUT", imds.TOKEN) == 1  # one poller for the node: local rank 0


def test_a_metadata_server_gone_bad_then_down_costs_one_warning_and_training_completes(
    tmp_path, imds
) -> None:
    imds.fault = Fault("garbage")  # HTML where JSON belongs
    job = start(
        tmp_path / "ckpt",
        job_env(PREEMPTIBLE_NOTICES="aws", AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.url),
        total=60,
    )
    job.until(r"rank 0 step 20\b")
    assert imds.requests, "the job never polled"
    imds.stop()  # then down: the port refuses; the same outage goes on
    code, out = job.finish()
    assert code == 0 and "rank 0 done" in out, out
    assert out.count("aws metadata server at") == 1, out
    assert_valid_checkpoint(tmp_path / "ckpt", 59)
