"""Elastic jobs in the real manager (`runs.py`): a shrink instead of a preemption, a restart at
once at the new size, a grow back, and the fallback when a job does not save on its notice.

The jobs are real processes; each writes its size (`{gpus}` in its command, $PREEMPTIBLE_GPUS
and CUDA_VISIBLE_DEVICES) to a file per attempt, and "saves" on SIGTERM as the SDK would: it
reports a checkpoint (the ack) and exits 143.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from preemptible.queue.core import parse_config
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.metrics import ApiMetrics
from preemptible.queue.service.server import build_manager
from preemptible.queue.service.views import CostView, JobState, SubmitRequest

from .test_manager import _MANAGERS, no_job_outlives_its_test, until  # noqa: F401 - the fixture

PY = sys.executable
CONFIG = {
    "cluster": {"gpus": 4},
    "policy": {"resize_interval": "1s"},
    "preemption": {"grace_min": "2s", "grace_max": "5s", "min_runtime": "0s", "cooldown": "0s"},
    "queues": [
        {"name": "a", "nominal": {"gpus": 2}, "borrowing_limit": {"gpus": 2}},
        {"name": "b", "nominal": {"gpus": 2}},
    ],
}
# Writes what it was given, then waits; on SIGTERM it acks (the test does, through a file it
# writes) and exits 143. `mode` "acks" or "refuses" (exits 143 without saving).
ELASTIC = """
import json, os, pathlib, signal, sys, time
size = int(sys.argv[1])
attempt = os.environ["PREEMPTIBLE_ATTEMPT"]
seen = {"arg": size, "env": int(os.environ["PREEMPTIBLE_GPUS"]),
        "devices": os.environ["CUDA_VISIBLE_DEVICES"]}
pathlib.Path(f"attempt-{attempt}.json").write_text(json.dumps(seen))
def stop(*_):
    pathlib.Path(f"stopped-{attempt}").write_text("x")
    time.sleep(0.5)  # the test acks meanwhile, as the SDK does before it exits
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
time.sleep(120)
"""


def manager(state: Path, **policy: object) -> QueueManager:
    config = {**CONFIG, "policy": {**CONFIG["policy"], **policy}}
    m = build_manager(parse_config(config), state, url="http://127.0.0.1:9")
    _MANAGERS.append(m)
    return m


def submit_elastic(m: QueueManager, cwd: Path, *, min_gpus: int = 2):
    return m.submit(
        SubmitRequest(
            queue="a",
            command=[PY, "-c", ELASTIC, "{gpus}"],
            gpus=4,
            min_gpus=min_gpus,
            estimate_s=3600.0,
            cwd=str(cwd),
        )
    )


def reports_its_cost(m: QueueManager, job_id: str) -> None:
    """The job reports a small save and restore, as the SDK does once it has measured them:
    then it saves on notice, and a shrink costs it less than an eviction."""
    m.report_cost(job_id, CostView(save_seconds_p95=0.1, restore_seconds=0.1))


def attempt(m: QueueManager, cwd: Path, k: int) -> dict[str, object]:
    """What attempt `k` was given, once it has started (the manager stepped meanwhile)."""
    path = cwd / f"attempt-{k}.json"
    until(m, path.exists)
    return json.loads(path.read_text())


def ack_when_stopped(m: QueueManager, job_id: str, cwd: Path, k: int) -> None:
    """Step until attempt `k` got its SIGTERM, then report its checkpoint (the ack)."""
    until(m, (cwd / f"stopped-{k}").exists)
    m.checkpointed(job_id, step=10 * k, at=None)


def test_a_job_is_shrunk_for_a_higher_tier_and_grows_back_when_it_leaves(tmp_path):
    m = manager(tmp_path / "state")
    job = submit_elastic(m, tmp_path)
    until(m, lambda: m.get_job(job.id).state is JobState.RUNNING)
    assert attempt(m, tmp_path, 1) == {"arg": 4, "env": 4, "devices": "0,1,2,3"}
    reports_its_cost(m, job.id)

    high = m.submit(
        SubmitRequest(
            queue="b", command=[PY, "-c", "import time; time.sleep(3)"], gpus=2, tier="high"
        )
    )
    ack_when_stopped(m, job.id, tmp_path, 1)
    until(m, lambda: m.get_job(high.id).state is JobState.RUNNING)
    assert attempt(m, tmp_path, 2) == {"arg": 2, "env": 2, "devices": "0,1"}
    view = m.get_job(job.id)
    assert view.state is JobState.RUNNING and view.gpu_ids == [0, 1] and view.resizes == 1
    assert m.jobs[job.id].preemptions == 0  # a shrink, not a preemption
    assert set(m.get_job(high.id).gpu_ids) == {2, 3}

    # The high-tier job ends: the elastic one grows back to 4 (it pays: an hour left).
    ack_when_stopped(m, job.id, tmp_path, 2)
    assert attempt(m, tmp_path, 3) == {"arg": 4, "env": 4, "devices": "0,1,2,3"}
    kinds = [(e.kind, e.data.get("resize")) for e in reversed(m.events(job_id=job.id))]
    assert kinds.count(("resized", "shrink")) == 1 and kinds.count(("resized", "grow")) == 1
    assert ("requeued", None) not in kinds
    stats = m.stats()
    assert stats.overall.resizes == 2 and stats.overall.preemptions == 0
    text = ApiMetrics(m).render().decode()
    assert 'preemptible_queue_resizes_total{kind="shrink",queue="a"} 1.0' in text
    assert 'preemptible_queue_resizes_total{kind="grow",queue="a"} 1.0' in text
    assert 'preemptible_queue_window_resizes{queue="",scope="overall"} 2.0' in text
    m.cancel(job.id)
    until(m, lambda: m.get_job(job.id).state is JobState.CANCELLED)


def test_a_job_that_does_not_save_on_its_resize_notice_is_preempted_instead(tmp_path):
    m = manager(tmp_path / "state")
    job = submit_elastic(m, tmp_path)
    until(m, lambda: m.get_job(job.id).state is JobState.RUNNING)
    attempt(m, tmp_path, 1)
    reports_its_cost(m, job.id)
    high = m.submit(
        SubmitRequest(
            queue="b", command=[PY, "-c", "import time; time.sleep(60)"], gpus=2, tier="high"
        )
    )
    until(m, (tmp_path / "stopped-1").exists)  # told to shrink; exits without an ack
    until(m, lambda: m.get_job(high.id).state is JobState.RUNNING)
    record = m.jobs[job.id]
    assert record.preemptions == 1 and record.resizes == 0
    requeued = [e for e in m.events(job_id=job.id) if e.kind == "requeued"]
    assert len(requeued) == 1 and not requeued[0].data["acked"]
    # `queue why` shows the history: the fallback says what happened.
    reasons = [e.reason for e in m.why(job.id).history]
    assert any("exited without saving on its notice to shrink to 2 GPUs" in r for r in reasons)
    for j in (job.id, high.id):
        m.cancel(j)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": 2, "min_gpus": 3}, "min_gpus 3 is more than gpus 2"),
        ({"gpus": 4, "min_gpus": 1, "gpus_multiple": 2}, "gpus_multiple 2 must divide"),
        ({"gpus": 3, "gpus_multiple": 2}, "does not divide gpus 3"),
    ],
)
def test_a_range_that_makes_no_sense_is_refused_at_submission(tmp_path, fields, message):
    from preemptible.errors import JobSpecError

    m = manager(tmp_path / "state")
    with pytest.raises(JobSpecError, match=message):
        m.submit(SubmitRequest(queue="a", command=[PY, "-c", "pass"], **fields))
    assert m.list_jobs() == []


def test_the_api_answers_a_bad_range_with_422_and_a_good_one_shows_it(tmp_path):
    from fastapi.testclient import TestClient

    from preemptible.queue.service.app import create_app
    from preemptible.queue.service.auth import Tokens

    m = manager(tmp_path / "state")
    client = TestClient(create_app(m, tokens=Tokens(admin="admin-token", queues={})))
    admin = {"Authorization": "Bearer admin-token"}
    body = {"queue": "a", "command": [PY, "-c", "pass"], "gpus": 4, "cwd": str(tmp_path)}
    for bad, says in [
        ({"min_gpus": 5}, "min_gpus 5 is more than gpus 4"),
        ({"min_gpus": 0}, "min_gpus"),
        ({"min_gpus": 2, "gpus_multiple": 3}, "gpus_multiple 3 must divide"),
    ]:
        answer = client.post("/v1/jobs", json={**body, **bad}, headers=admin)
        assert answer.status_code == 422, answer.text
        assert says in answer.json()["error"]["message"]
    good = client.post("/v1/jobs", json={**body, "min_gpus": 2}, headers=admin).json()
    assert (good["gpus"], good["min_gpus"], good["gpus_multiple"]) == (4, 2, 1)


# Saves on SIGTERM (each one: it writes stopped-{attempt}-{n}), and exits 143 only once the
# test writes `go`: a second notice reaches it while it is still saving for the first.
SLOW_SAVE = """
import os, pathlib, signal, sys, time
attempt = os.environ["PREEMPTIBLE_ATTEMPT"]
pathlib.Path(f"attempt-{attempt}.json").write_text(sys.argv[1])
n = 0
def stop(*_):
    global n
    n += 1
    pathlib.Path(f"stopped-{attempt}-{n}").write_text("x")
signal.signal(signal.SIGTERM, stop)
while not (n and pathlib.Path("go").exists()):
    time.sleep(0.05)
sys.exit(143)
"""


def test_a_job_evicted_while_it_saves_for_a_shrink_leaves_and_frees_all_it_held(tmp_path):
    config = {
        **CONFIG,
        "preemption": {**CONFIG["preemption"], "tier_patience": "0s", "min_runtime_max": "0s"},
        "queues": [{"name": "a", "nominal": {"gpus": 4}}],
    }
    m = build_manager(parse_config(config), tmp_path / "state", url="http://127.0.0.1:9")
    _MANAGERS.append(m)
    job = m.submit(
        SubmitRequest(
            queue="a",
            command=[PY, "-c", SLOW_SAVE, "{gpus}"],
            gpus=4,
            min_gpus=2,
            tier="low",
            estimate_s=3600.0,
            cwd=str(tmp_path),
        )
    )
    until(m, (tmp_path / "attempt-1.json").exists)
    reports_its_cost(m, job.id)
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    normal = m.submit(SubmitRequest(queue="a", command=sleep, gpus=2, tier="normal"))
    until(m, (tmp_path / "stopped-1-1").exists)  # told to shrink to 2: it saves
    assert m.jobs[job.id].notice.kind == "resize"
    high = m.submit(SubmitRequest(queue="a", command=sleep, gpus=2, tier="high"))
    until(m, (tmp_path / "stopped-1-2").exists)  # evicted while it saves: the notice replaced
    record = m.jobs[job.id]
    assert record.notice.kind != "resize" and record.state is JobState.PREEMPTING
    assert "replaces its shrink to 2 GPUs" in record.notice.reason
    m.checkpointed(job.id, step=10, at=None)
    (tmp_path / "go").write_text("x")
    until(m, lambda: m.get_job(job.id).state is JobState.PENDING)
    assert record.preemptions == 1 and record.resizes == 0
    until(m, lambda: all(m.get_job(j.id).state is JobState.RUNNING for j in (normal, high)))
    assert {*m.get_job(normal.id).gpu_ids, *m.get_job(high.id).gpu_ids} == {0, 1, 2, 3}
    state = m.shell.state
    assert not state.shrinking and state.leaving["a"].gpus == 0
    for j in (job.id, normal.id, high.id):
        m.cancel(j)
