"""The queue manager with real processes, real signals and a real SQLite file.

The manager is stepped by the test (`step()`), not by its thread, so that each assertion sees
a known moment; the processes run for real. The GPUs are virtual: a job that "holds" one holds
an exclusive lock on a file named after it (`gpu-N.lock`), so the next job on that GPU can tell
whether it is really free.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from preemptible.errors import JobNotFoundError, JobStateError, RequestError, StateStoreError
from preemptible.queue.core import parse_config
from preemptible.queue.service import containment
from preemptible.queue.service.app import create_app
from preemptible.queue.service.auth import Tokens
from preemptible.queue.service.containment import Mechanism
from preemptible.queue.service.executor import ProcessExecutor
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.metrics import ApiMetrics
from preemptible.queue.service.server import build_manager
from preemptible.queue.service.steady_clock import SteadyClock
from preemptible.queue.service.store import FILE_NAME, Store
from preemptible.queue.service.views import CostView, JobState, SubmitRequest, TokenOwner
from tests.polling import wait_until

CONFIG = {
    "cluster": {"gpus": 2},
    "preemption": {"grace_min": "1s", "grace_max": "3s", "min_runtime": "0s", "cooldown": "0s"},
    "queues": [
        {"name": "a", "nominal": {"gpus": 1}},
        {"name": "b", "nominal": {"gpus": 1}, "borrowing_limit": {"gpus": 1}},
    ],
}
PY = sys.executable
# Saves on SIGTERM (as the SDK does: here a file), then exits 143; else runs a minute.
SAVER = (
    "import signal, sys, time, pathlib\n"
    "def stop(*a):\n"
    "    pathlib.Path('saved').write_text('x'); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


_MANAGERS: list[QueueManager] = []


def manager(state: Path, mechanism: Mechanism | None = None) -> QueueManager:
    """A manager on `state`; its jobs contained by `mechanism` (default: the host's best)."""
    executor = None if mechanism is None else ProcessExecutor(containment=mechanism)
    m = build_manager(parse_config(CONFIG), state, url="http://127.0.0.1:9", executor=executor)
    _MANAGERS.append(m)
    return m


@pytest.fixture(autouse=True)
def no_job_outlives_its_test():
    """Jobs still running when a test ends (a requeued borrower runs again) are killed, every
    process of them, and waited for (their cgroups are removed)."""
    yield
    while _MANAGERS:
        kill_every_job(_MANAGERS.pop())


def kill_every_job(m: QueueManager) -> None:
    """Kill every attempt of `m` still running, every process of it, and wait until it is gone."""
    for record in m.jobs.values():
        handle = record.handle
        if handle is not None:
            m.executor.kill(handle)
            deadline = time.monotonic() + 10
            while m.executor.poll(handle) is None and time.monotonic() < deadline:
                time.sleep(0.01)


CHOSEN_AND_SUBREAPER = [None, Mechanism.SUBREAPER]
"""The host's best (a cgroup where it offers one), and the subreaper forced."""


@pytest.fixture(params=CHOSEN_AND_SUBREAPER, ids=["chosen", "subreaper"])
def mechanism(request: pytest.FixtureRequest) -> Mechanism | None:
    forced = request.param
    if forced is not None and not containment.probe(forced).available:
        pytest.skip(f"{forced} is not offered here: {containment.probe(forced).why}")
    return forced


def submit(
    m: QueueManager,
    queue: str,
    code: str,
    *,
    gpus: int = 1,
    tier: str = "normal",
    cwd=None,
    max_restarts: int | None = None,
):
    return m.submit(
        SubmitRequest(
            queue=queue,
            command=[PY, "-c", code],
            gpus=gpus,
            tier=tier,
            cwd=str(cwd) if cwd else None,
            max_restarts=max_restarts,
        )
    )


def until(m: QueueManager, check, *, timeout: float = 20.0):
    """Step the manager until `check()` is true (and return its value)."""

    def stepped():
        m.step()
        return check()

    def jobs() -> str:
        return "jobs: " + ", ".join(
            f"{j.id} {j.state} {j.gpu_ids} {j.reason}" for j in m.list_jobs()
        )

    what = "the stepped manager to reach the test's condition"
    return wait_until(stepped, what, timeout=timeout, describe=jobs)


def running(m: QueueManager, job_id: str) -> None:
    """Step until the job runs and has installed its signal handlers (it prints 'ready')."""
    until(m, lambda: state_of(m, job_id) is JobState.RUNNING)
    until(m, lambda: "ready" in m.log_path(job_id).read_text())


def state_of(m: QueueManager, job_id: str) -> JobState:
    return m.get_job(job_id).state


# A job whose main process starts a holder as a daemonising launcher does (fork, setsid, fork
# again, the middle one exits): the holder takes the job's GPUs (locks gpu-N.lock for each N
# in CUDA_VISIBLE_DEVICES), ignores SIGTERM and holds them for two minutes. The main process
# then prints 'ready' and saves and exits on SIGTERM, or ignores it (with "ignores" in
# HOLDER_JOB's place of STOP).
HOLDER_JOB = (
    "import fcntl, os, signal, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "        gpus = os.environ['CUDA_VISIBLE_DEVICES'].split(',')\n"
    "        held = [open(f'gpu-{gpu}.lock', 'w') for gpu in gpus]\n"
    "        for lock in held:\n"
    "            fcntl.flock(lock, fcntl.LOCK_EX)\n"
    "        open('holder.tmp', 'w').write(f'{os.getpid()}\\n')\n"
    "        os.rename('holder.tmp', 'holder')\n"
    "        time.sleep(120)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "while not os.path.exists('holder'):\n"
    "    time.sleep(0.005)\n"
    "STOP\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)
SAVES = "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))"
IGNORES = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
# The next job on those GPUs: when it starts, it tries each GPU's lock without waiting.
NEXT_JOB = (
    "import fcntl, json, os, time\n"
    "started = time.time()\n"
    "gpus = os.environ['CUDA_VISIBLE_DEVICES'].split(',')\n"
    "free = []\n"
    "for gpu in gpus:\n"
    "    try:\n"
    "        fcntl.flock(open(f'gpu-{gpu}.lock', 'w'), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    "        free.append(gpu)\n"
    "    except BlockingIOError:\n"
    "        pass\n"
    "json.dump({'started': started, 'gpus': gpus, 'free': free}, open('next.json', 'w'))\n"
)


def holder_pid(workdir: Path) -> int:
    return int((workdir / "holder").read_text())


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].split()[0] in "ZX"


def assert_next_job_got_the_gpus_after(m: QueueManager, first: str, workdir: Path) -> None:
    """The next job ran on the first job's GPUs and found them free when it started, after
    the first job's run had ended (as recorded), and no process of the first job is left."""
    seen = json.loads((workdir / "next.json").read_text())
    assert seen["gpus"] == ["0", "1"]
    assert seen["free"] == ["0", "1"], "the next job started while the holder held its GPUs"
    assert seen["started"] > m.jobs[first].runs[-1][1]
    assert gone(holder_pid(workdir))


@pytest.mark.parametrize("main", [SAVES, IGNORES], ids=["saves", "ignores-the-notice"])
def test_a_cancelled_job_keeps_its_gpus_until_its_last_process_is_gone(tmp_path, mechanism, main):
    m = manager(tmp_path / "state", mechanism)
    first = submit(m, "a", HOLDER_JOB.replace("STOP", main), gpus=2, cwd=tmp_path)
    running(m, first.id)
    holder = holder_pid(tmp_path)
    handle = m.jobs[first.id].handle

    m.cancel(first.id)
    nxt = submit(m, "a", NEXT_JOB, gpus=2, cwd=tmp_path)

    until(m, lambda: state_of(m, first.id) is JobState.CANCELLED)
    assert gone(holder)
    until(m, lambda: state_of(m, nxt.id) is JobState.COMPLETED)
    assert_next_job_got_the_gpus_after(m, first.id, tmp_path)
    killed = [e.data["killed"] for e in m.events(job_id=first.id) if e.kind == "cancelled"]
    assert killed == [main == IGNORES]  # killed at the deadline only when it ignored the notice
    expected_cgroup = (mechanism or m.executor.containment.mechanism).is_cgroup
    assert (handle.cgroup is not None) == expected_cgroup


def test_a_restarted_manager_reaches_every_process_of_an_adopted_job(tmp_path, mechanism):
    state = tmp_path / "state"
    m = manager(state, mechanism)
    first = submit(m, "a", HOLDER_JOB.replace("STOP", SAVES), gpus=2, cwd=tmp_path)
    running(m, first.id)
    holder = holder_pid(tmp_path)
    m.store.close()
    del m  # the manager dies without a word (its thread never ran)

    again = manager(state)  # it chooses afresh; the handle says how the job is contained
    assert state_of(again, first.id) is JobState.RUNNING
    again.cancel(first.id)
    nxt = submit(again, "a", NEXT_JOB, gpus=2, cwd=tmp_path)

    until(again, lambda: state_of(again, first.id) is JobState.CANCELLED)
    assert gone(holder)
    until(again, lambda: state_of(again, nxt.id) is JobState.COMPLETED)
    assert_next_job_got_the_gpus_after(again, first.id, tmp_path)


def test_a_restart_finds_a_contained_run_whose_launch_it_did_not_save(
    tmp_path, monkeypatch, mechanism
):
    # The manager dies between launching a job and saving its handle: once restarted, it finds
    # the runner by its command line, which also says how the job is contained.
    state = tmp_path / "state"
    m = manager(state, mechanism)
    first = submit(m, "a", HOLDER_JOB.replace("STOP", SAVES), gpus=2, cwd=tmp_path)
    monkeypatch.setattr(m.book, "save", lambda record: None)  # the handle never reaches the file
    running(m, first.id)
    launched = m.jobs[first.id].handle
    holder = holder_pid(tmp_path)
    assert m.store.load_jobs()[0][3]["handle"] is None
    m.store.close()
    del m
    monkeypatch.undo()

    again = manager(state)
    assert again.jobs[first.id].handle == launched
    again.cancel(first.id)
    nxt = submit(again, "a", NEXT_JOB, gpus=2, cwd=tmp_path)

    until(again, lambda: state_of(again, nxt.id) is JobState.COMPLETED)
    assert state_of(again, first.id) is JobState.CANCELLED
    assert_next_job_got_the_gpus_after(again, first.id, tmp_path)
    assert gone(holder)


def test_a_restart_kills_what_a_dead_runner_left_before_handing_its_gpus_on(tmp_path):
    # The runner is SIGKILLed alone while the manager is down: in a cgroup, its job lives on
    # (a subreaper's adopted orphans would go to init with it: that one has no cgroup to find).
    chosen = containment.choose()
    if not chosen.mechanism.is_cgroup:
        pytest.skip(f"no cgroup on this host: {chosen.why}")
    state = tmp_path / "state"
    m = manager(state)
    first = submit(m, "a", HOLDER_JOB.replace("STOP", IGNORES), gpus=2, cwd=tmp_path)
    running(m, first.id)
    holder = holder_pid(tmp_path)
    runner_pid = m.jobs[first.id].handle.pid
    m.store.close()
    del m
    os.kill(runner_pid, signal.SIGKILL)

    again = manager(state)
    recovered = [e.reason for e in again.events(job_id=first.id) if e.kind == "recovered"]
    assert recovered == [
        "its runner was gone but not all its processes: they are killed, then it ends"
    ]
    again.cancel(first.id)  # else it would run again, as a job that vanished does
    nxt = submit(again, "a", NEXT_JOB, gpus=2, cwd=tmp_path)

    until(again, lambda: state_of(again, nxt.id) is JobState.COMPLETED)
    assert state_of(again, first.id) is JobState.CANCELLED
    assert_next_job_got_the_gpus_after(again, first.id, tmp_path)
    assert gone(holder)


def test_a_job_runs_with_its_gpus_and_token_and_its_exit_is_recorded(tmp_path):
    m = manager(tmp_path / "state")
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['PREEMPTIBLE_JOB_ID'])"
    ok = submit(m, "a", code)
    bad = submit(m, "b", "import sys; sys.exit(3)", max_restarts=0)
    until(m, lambda: state_of(m, ok.id).finished and state_of(m, bad.id).finished)
    assert state_of(m, ok.id) is JobState.COMPLETED
    assert m.log_path(ok.id).read_text().split() == ["0", ok.id]
    failed = m.get_job(bad.id)
    assert failed.state is JobState.FAILED and failed.exit_code == 3
    assert "exited with 3" in failed.reason and failed.attempts == 1
    kinds = [e.kind for e in m.events(job_id=ok.id)]
    assert kinds == ["submitted", "admitted", "completed"]


def test_a_job_token_names_its_job_and_says_when_the_job_has_finished(tmp_path):
    m = manager(tmp_path / "state")
    job = submit(m, "a", "import time; time.sleep(60)")
    token = m._job_token(job.id)
    assert m.job_for_token(token) == TokenOwner(job_id=job.id, state=JobState.PENDING)
    until(m, lambda: state_of(m, job.id) is JobState.RUNNING)
    m.cancel(job.id)
    until(m, lambda: state_of(m, job.id).finished)
    assert m.job_for_token(token) == TokenOwner(job_id=job.id, state=JobState.CANCELLED)
    assert m.job_for_token("not-a-token") is None


def test_bad_submissions_are_refused_and_nothing_is_stored(tmp_path):
    m = manager(tmp_path / "state")
    with pytest.raises(RequestError, match="no queue named 'c'"):
        submit(m, "c", "pass")
    with pytest.raises(RequestError, match="3 GPUs but the machine has 2"):
        submit(m, "a", "pass", gpus=3)
    with pytest.raises(RequestError, match="unknown tier"):
        submit(m, "a", "pass", tier="urgent")
    with pytest.raises(JobNotFoundError):
        m.get_job("j99")
    assert m.list_jobs() == [] and m.events() == []


def test_a_borrower_is_noticed_saves_and_is_requeued_and_the_grace_follows_its_exit(tmp_path):
    m = manager(tmp_path / "state")
    low = submit(m, "b", SAVER, gpus=2, tier="low", cwd=tmp_path)
    running(m, low.id)
    m.report_cost(low.id, CostView(save_seconds_p95=0.5, restore_seconds=0.1))
    high = submit(m, "a", "print('hi')", tier="high")
    until(m, lambda: state_of(m, high.id) is JobState.COMPLETED)
    assert (tmp_path / "saved").exists()  # it saved on SIGTERM
    requeued = m.get_job(low.id)
    assert requeued.state in (JobState.PENDING, JobState.RUNNING) and requeued.attempts >= 1
    assert requeued.cost.observed_exit_seconds is not None
    assert requeued.cost.observed_exit_seconds < 3.0
    notice = next(e for e in m.events(job_id=low.id) if e.kind == "notice")
    assert "reclaims capacity b borrowed" in notice.reason
    back = next(e for e in m.events(job_id=low.id) if e.kind == "requeued")
    assert back.data["killed"] is False and back.data["took_s"] < 3.0
    # one preemption in queue b: the interval hint is sqrt(2 C M), M from it, after a restart too
    hint = m.report_cost(low.id, CostView(save_seconds_p95=0.5)).checkpoint_interval_hint_s
    assert hint is not None and hint > 0
    m.store.close()
    again = manager(tmp_path / "state")
    assert again._mtbp("b", m.clock()) is not None and again._mtbp("a", m.clock()) is None


def test_a_job_that_ignores_its_notice_is_killed_at_the_deadline(tmp_path):
    m = manager(tmp_path / "state")
    low = submit(m, "b", STUBBORN, gpus=2, tier="low")
    running(m, low.id)
    submit(m, "a", "print('hi')", tier="high")
    until(m, lambda: state_of(m, low.id) is JobState.PREEMPTING)
    noticed = time.monotonic()
    back = until(m, lambda: [e for e in m.events(job_id=low.id) if e.kind == "requeued"])
    took = time.monotonic() - noticed
    assert back[0].data["killed"] is True
    grace = back[0].data["grace_s"]
    assert grace - 0.5 <= took <= grace + 3.0
    # the next grace is negotiated from what it took, within the bounds
    answer = m.report_cost(low.id, CostView(save_seconds_p95=0.1))
    assert answer.grace_s == pytest.approx(3.0)  # observed ~grace -> clamp at grace_max


def test_checkpointed_after_a_notice_hands_the_gpus_on_before_the_grace(tmp_path):
    m = manager(tmp_path / "state")
    low = submit(m, "b", STUBBORN, gpus=2, tier="low")
    running(m, low.id)
    high = submit(m, "a", "print('hi')", tier="high")
    until(m, lambda: state_of(m, low.id) is JobState.PREEMPTING)
    acked = time.monotonic()
    m.checkpointed(low.id, step=7, at=None)
    until(m, lambda: state_of(m, high.id) is not JobState.PENDING)
    # the manager kills it ACK_EXIT_S after the ack at most, not at the end of the grace
    assert time.monotonic() - acked < 3.0 + 5.0
    assert any(e.kind == "checkpointed" for e in m.events(job_id=low.id))


def test_a_checkpoint_committed_before_the_notice_is_not_the_ack(tmp_path):
    m = manager(tmp_path / "state")
    job = submit(m, "a", STUBBORN)
    running(m, job.id)
    before = time.time()
    m.cancel(job.id)  # a notice
    m.checkpointed(job.id, step=3, at=before - 1)  # a periodic save, reported late
    assert m.jobs[job.id].notice.acked_at is None
    m.checkpointed(job.id, step=4, at=None)  # the notice save
    assert m.jobs[job.id].notice.acked_at is not None
    reasons = [e.reason for e in m.events(job_id=job.id) if e.kind == "checkpointed"]
    assert reasons == ["saved", "saved after the notice: exiting"]
    until(m, lambda: state_of(m, job.id) is JobState.CANCELLED)


def test_a_cost_report_logs_new_terms_once_and_counts_its_checkpoint(tmp_path):
    m = manager(tmp_path / "state")
    job = submit(m, "a", SAVER, cwd=tmp_path)
    running(m, job.id)
    saved_at = time.time() - 5
    report = CostView(save_seconds_p95=1.0, last_checkpoint_step=9, last_checkpoint_time=saved_at)
    answer = m.report_cost(job.id, report)
    m.report_cost(job.id, report)  # the same terms: no second event
    m.report_cost(job.id, CostView(save_seconds_p95=1.04))  # a small move: none either
    negotiated = [e for e in m.events(job_id=job.id) if e.kind == "negotiated"]
    assert len(negotiated) == 1 and negotiated[0].data["grace_s"] == answer.grace_s
    assert m.jobs[job.id].last_checkpoint_at == saved_at
    assert m.shell.state.running[job.id].last_checkpoint_at == saved_at
    assert not any(e.kind == "checkpointed" for e in m.events(job_id=job.id))  # not an ack
    m.report_cost(job.id, CostView(save_seconds_p95=2.5))  # slower saves: a longer grace
    assert len([e for e in m.events(job_id=job.id) if e.kind == "negotiated"]) == 2
    m.cancel(job.id)
    until(m, lambda: state_of(m, job.id) is JobState.CANCELLED)


def test_two_tiers_negotiate_from_the_local_save_and_show_the_upload(tmp_path):
    # On one machine the next attempt reads the local tier: the upload changes no term.
    m = manager(tmp_path / "state")
    job = submit(m, "a", SAVER, cwd=tmp_path)
    running(m, job.id)
    one_tier = m.report_cost(job.id, CostView(save_seconds_p95=1.0, restore_seconds=0.5))
    two_tiers = CostView(save_seconds_p95=1.0, restore_seconds=0.5, upload_seconds_p95=300.0)
    assert m.report_cost(job.id, two_tiers) == one_tier
    assert m.get_job(job.id).cost.upload_seconds_p95 == 300.0
    assert m.jobs[job.id].to_doc()["cost"]["upload_seconds_p95"] == 300.0  # what the store keeps
    m.cancel(job.id)
    until(m, lambda: state_of(m, job.id) is JobState.CANCELLED)


def test_a_week_long_cost_claim_is_preempted_after_a_bounded_minimum_runtime(tmp_path):
    # One GPU, one queue: the high-tier job can only take the low one by tier preemption, which
    # waits out the victim's minimum runtime. The claim is a week of save and of restore; the
    # caps are grace_max (3 s) and 3 x grace_max (9 s), so it buys 10 x (3 + 9) = 120 s.
    config = parse_config(
        {
            "cluster": {"gpus": 1},
            "preemption": {**CONFIG["preemption"], "tier_patience": "0s"},
            "queues": [{"name": "a", "nominal": {"gpus": 1}}],
        }
    )
    ahead = [0.0]  # the manager's clock runs this far ahead of the wall clock
    state = tmp_path / "state"
    m = QueueManager(
        config,
        Store(state),
        ProcessExecutor(),
        state_dir=state,
        url="http://127.0.0.1:9",
        clock=lambda: time.time() + ahead[0],
    )
    _MANAGERS.append(m)
    low = submit(m, "a", SAVER, tier="low", cwd=tmp_path)
    running(m, low.id)
    week = 604800.0
    terms = m.report_cost(low.id, CostView(save_seconds_p95=week, restore_seconds=week))
    assert (terms.grace_s, terms.min_runtime_s) == (3.0, 120.0)
    assert m.get_job(low.id).cost.restore_seconds == week  # the record keeps the claim
    high = submit(m, "a", "print('hi')", tier="high")
    for _ in range(3):
        m.step()
    assert state_of(m, low.id) is JobState.RUNNING and state_of(m, high.id) is JobState.PENDING
    assert m.why(low.id).clamped == [
        "claimed save 604800 s, counted as 3 s (max_claimed_save)",
        "claimed restore 604800 s, counted as 9 s (max_claimed_restore)",
    ]
    ahead[0] += 120.0 + 120.0  # past the minimum runtime and the failed search's back-off
    until(m, lambda: state_of(m, high.id) is JobState.COMPLETED)
    assert (tmp_path / "saved").exists()  # it was told to go, and saved
    notice = next(e for e in m.events(job_id=low.id) if e.kind == "notice")
    assert "tier low yields to high" in notice.reason
    # its quick exit now checks the save claim; the restore claim is still only capped
    assert m.why(low.id).clamped == [
        "claimed restore 604800 s, counted as 9 s (max_claimed_restore)"
    ]
    negotiated = next(e for e in m.events(job_id=low.id) if e.kind == "negotiated")
    assert "claimed restore 604800 s, counted as 9 s (max_claimed_restore)" in negotiated.reason
    assert [c["setting"] for c in negotiated.data["clamped"]] == [
        "max_claimed_save",
        "max_claimed_restore",
    ]
    assert negotiated.data["restore_s"] == week


def test_notice_long_poll_returns_the_notice_with_its_deadline(tmp_path):
    m = manager(tmp_path / "state")
    low = submit(m, "b", SAVER, gpus=2, tier="low", cwd=tmp_path)
    running(m, low.id)
    assert m.wait_notice(low.id, 0.1) is None
    submit(m, "a", "print('hi')", tier="high")
    until(m, lambda: state_of(m, low.id) is not JobState.RUNNING)
    notice = m.wait_notice(low.id, 0.1) or m.get_job(low.id)
    assert notice is not None


def test_cancel_pending_and_running_and_finished(tmp_path):
    m = manager(tmp_path / "state")
    job = submit(m, "a", SAVER, gpus=2, cwd=tmp_path)
    running(m, job.id)
    waiting = submit(m, "b", "pass", gpus=2)
    m.step()
    assert m.cancel(waiting.id).state is JobState.CANCELLED
    m.cancel(job.id)
    until(m, lambda: state_of(m, job.id) is JobState.CANCELLED)
    assert (tmp_path / "saved").exists()  # the notice let it save
    with pytest.raises(JobStateError, match="already cancelled"):
        m.cancel(job.id)


def test_a_restarted_manager_adopts_running_jobs_and_requeues_vanished_ones(tmp_path):
    state = tmp_path / "state"
    m = manager(state)
    alive = submit(m, "a", SAVER, cwd=tmp_path)
    gone = submit(m, "b", SAVER, cwd=tmp_path)
    running(m, alive.id)
    running(m, gone.id)
    pgid = m.jobs[gone.id].handle.pid
    m.store.close()
    del m  # the manager dies without a word (its thread never ran)
    os.killpg(pgid, signal.SIGKILL)  # one job dies while nobody watches
    time.sleep(0.3)
    again = manager(state)
    assert state_of(again, alive.id) is JobState.RUNNING
    assert again.get_job(alive.id).gpu_ids  # its GPUs are still its own
    lost = again.get_job(gone.id)
    assert lost.state in (JobState.PENDING, JobState.RUNNING)
    assert any(e.kind == "recovered" for e in again.events(job_id=alive.id))
    assert any(e.kind == "requeued" for e in again.events(job_id=gone.id))
    again.cancel(alive.id)
    until(again, lambda: state_of(again, alive.id) is JobState.CANCELLED)


def test_a_restart_learns_the_exit_of_a_run_whose_launch_it_did_not_save(tmp_path, monkeypatch):
    # The manager dies between launching a job and saving its handle; the job ends before the
    # restart. Its runner is gone, but its status file says it completed: it must not run again.
    state = tmp_path / "state"
    m = manager(state)
    job = submit(m, "a", "print('once')")
    launched = []
    launch = m.executor.launch
    monkeypatch.setattr(
        m.executor, "launch", lambda spec: launched.append(launch(spec)) or launched[-1]
    )
    monkeypatch.setattr(m.book, "save", lambda record: None)  # the handle never reaches the file
    m.step()
    assert launched and m.store.load_jobs()[0][3]["handle"] is None
    executor = m.executor  # not stepped: the manager never sees the exit
    wait_until(lambda: not executor.alive(launched[0]), "the job's exit", timeout=20)
    m.store.close()
    del m
    again = manager(state)
    done = again.get_job(job.id)
    assert done.state is JobState.COMPLETED and done.attempts == 1
    assert [e.kind for e in again.events(job_id=job.id)] == ["submitted", "admitted", "completed"]
    assert again.log_path(job.id).read_text() == "once\n"


def test_a_notice_stored_but_not_sent_before_a_crash_is_sent_at_restart(tmp_path, monkeypatch):
    # The manager dies between storing a notice and sending SIGTERM: once restarted, it must
    # send it (with the whole grace), not SIGKILL at the deadline a job that was never told.
    class Died(Exception):
        pass

    def die(handle):
        raise Died

    state = tmp_path / "state"
    m = manager(state)
    low = submit(m, "b", SAVER, gpus=2, tier="low", cwd=tmp_path)
    running(m, low.id)
    submit(m, "a", "print('hi')", tier="high")
    monkeypatch.setattr(m.executor, "terminate", die)
    with pytest.raises(Died):
        until(m, lambda: False)
    assert state_of(m, low.id) is JobState.PREEMPTING
    m.store.close()
    del m
    time.sleep(1.5)  # the manager is down a while: no part of the job's exit time
    again = manager(state)
    back = until(again, lambda: [e for e in again.events(job_id=low.id) if e.kind == "requeued"])
    assert back[0].data["killed"] is False  # it left on its SIGTERM
    assert back[0].data["took_s"] < 1.0  # counted from the SIGTERM, not from the decision
    assert (tmp_path / "saved").exists()
    recovered = [e for e in again.events(job_id=low.id) if e.kind == "recovered"]
    assert "notice, never sent, sent now" in recovered[0].reason
    again.cancel(low.id)  # it was requeued: leave no job running
    until(again, lambda: state_of(again, low.id) is JobState.CANCELLED)


def test_a_restarted_manager_keeps_the_fair_share_usage(tmp_path):
    state = tmp_path / "state"
    m = manager(state)
    done = submit(m, "a", "import time; time.sleep(1)")
    held = submit(m, "b", SAVER, cwd=tmp_path)
    until(m, lambda: state_of(m, done.id) is JobState.COMPLETED, timeout=30)
    running(m, held.id)
    m.store.close()
    at = time.time()
    again = QueueManager(
        m.config, Store(state), ProcessExecutor(), state_dir=state, clock=lambda: at
    )
    m.shell.tracker.advance(at)
    before, after = m.shell.tracker.averages(), again.shell.tracker.averages()
    assert before["a"] > 0 and before["b"] > 0  # one ran and ended, one still runs
    # A restart that lost the history would give 0. The two differ a little: the tracker ended
    # the 1 s run when the manager polled it, the rebuilt usage at its recorded exit (5.5% apart
    # once on a loaded machine).
    assert after == pytest.approx(before, rel=0.2)
    again.cancel(held.id)
    until(again, lambda: state_of(again, held.id) is JobState.CANCELLED)


def test_a_corrupt_or_newer_state_file_is_refused_and_left_alone(tmp_path):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / FILE_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateStoreError, match="left as it is"):
        manager(corrupt)
    assert (corrupt / FILE_NAME).read_bytes() == b"this is not a database" * 100

    newer = tmp_path / "newer"
    manager(newer).store.close()
    db = sqlite3.connect(newer / FILE_NAME)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    before = (newer / FILE_NAME).read_bytes()
    with pytest.raises(StateStoreError, match="newer preemptible"):
        manager(newer)
    assert (newer / FILE_NAME).read_bytes() == before


def test_a_wall_clock_jump_neither_kills_a_job_early_nor_holds_it_late(tmp_path, caplog):
    m = manager(tmp_path / "state")
    assert isinstance(m.clock, SteadyClock)  # what `queue serve` runs with
    jumped = [0.0]
    m.clock = SteadyClock(wall=lambda: time.time() + jumped[0])  # its wall under our control
    job = submit(m, "a", STUBBORN, cwd=tmp_path)
    running(m, job.id)
    m.cancel(job.id)
    grace = m.jobs[job.id].notice.grace_s
    jumped[0] = 86400.0  # a day forward: every deadline on the wall clock has passed
    m.step()
    assert m.jobs[job.id].notice.killed_at is None, "killed at once by a clock jump"
    assert "the wall clock jumped +86400 s" in caplog.text
    jumped[0] = -3600.0  # an hour back: the deadline must still come
    until(m, lambda: state_of(m, job.id) is JobState.CANCELLED, timeout=grace + 10)
    ended = [e for e in m.events(job_id=job.id) if e.kind == "cancelled"][-1]
    assert ended.data["killed"] and ended.data["took_s"] >= grace - 0.1


def test_the_audit_log_says_who_submitted_reported_saved_and_cancelled(tmp_path):
    m = manager(tmp_path / "state")
    tokens = Tokens(admin="admin-token", queues={"a": "a-token", "b": "b-token"})
    client = TestClient(create_app(m, tokens=tokens))
    team_a, admin = {"Authorization": "Bearer a-token"}, {"Authorization": "Bearer admin-token"}
    body = {"queue": "a", "command": [PY, "-c", SAVER], "gpus": 1, "cwd": str(tmp_path)}
    job = client.post("/v1/jobs", json=body, headers=team_a).json()["id"]
    waiting = client.post("/v1/jobs", json={**body, "gpus": 2}, headers=admin).json()["id"]
    running(m, job)
    own = {"Authorization": f"Bearer {m._job_token(job)}"}
    assert client.post(f"/v1/jobs/{job}/cost", json={"save_seconds_p95": 2.0}, headers=own)
    assert client.post(f"/v1/jobs/{job}/checkpointed", json={"step": 3}, headers=own)
    assert client.delete(f"/v1/jobs/{waiting}", headers=team_a).status_code == 202
    assert client.delete(f"/v1/jobs/{job}", headers=admin).status_code == 202
    until(m, lambda: state_of(m, job) is JobState.CANCELLED)

    def who(job_id: str) -> dict[str, object]:
        events = client.get("/v1/events", params={"job_id": job_id}, headers=admin).json()
        return {e["kind"]: e["by"] for e in events}

    as_team_a, as_admin = {"kind": "queue", "name": "a"}, {"kind": "admin", "name": "admin"}
    as_job = {"kind": "job", "name": job}
    assert who(job) == {
        "submitted": as_team_a,
        "admitted": None,  # the manager's own decision
        "negotiated": as_job,
        "checkpointed": as_job,
        "notice": as_admin,  # the cancel's notice
        "cancelled": as_admin,  # and the cancel, once the job has exited
    }
    assert who(waiting) == {"submitted": as_admin, "cancelled": as_team_a}


class RefusingExecutor(ProcessExecutor):
    """The real executor, whose `poll` fails as it would with no descriptor left while
    `refusing` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = False
        self.refused = 0

    def poll(self, handle):
        if self.refusing:
            self.refused += 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().poll(handle)


def test_a_failing_step_is_logged_once_per_outage_and_counted(tmp_path, caplog):
    executor = RefusingExecutor()
    m = QueueManager(
        parse_config(CONFIG),
        Store(tmp_path / "state"),
        executor,
        state_dir=tmp_path / "state",
        poll_s=0.01,
    )
    _MANAGERS.append(m)
    job = submit(m, "a", "import time; time.sleep(60)")
    until(m, lambda: state_of(m, job.id) is JobState.RUNNING)
    caplog.set_level(logging.INFO, logger="preemptible.queue")
    executor.refusing = True
    m.start()
    try:
        # 30 failed steps: 0.3 s at a step every 0.01 s
        wait_until(lambda: executor.refused >= 30, "30 failed steps", timeout=20, every=0.01)
        executor.refusing = False
        steps = m.steps_run
        wait_until(lambda: m.steps_run >= steps + 5, "5 more steps", timeout=20, every=0.01)
    finally:
        m.stop()
    said = [r for r in caplog.records if r.name == "preemptible.queue"]
    assert [r.exc_info is not None for r in said] == [True, False], [r.getMessage() for r in said]
    assert "Too many open files" in caplog.text
    assert re.search(r"works again after (\d+) failures", said[1].getMessage())
    assert m.step_failures >= 30 and state_of(m, job.id) is JobState.RUNNING
    text = ApiMetrics(m).render().decode()
    assert f"preemptible_queue_loop_step_failures_total {m.step_failures}.0" in text
    assert "preemptible_queue_loop_steps_total" in text and "loop_step_gap_seconds_bucket" in text


def test_pages_of_finished_jobs_show_what_they_were_and_are_made_once(tmp_path):
    m = manager(tmp_path / "state")
    done = submit(m, "a", "pass")
    waiting = submit(m, "b", "import time; time.sleep(60)", gpus=2)
    until(m, lambda: state_of(m, done.id) is JobState.COMPLETED)
    first = {v.id: v for v in m.list_jobs()}
    assert first[done.id] == m.get_job(done.id) and first[done.id].state is JobState.COMPLETED
    again = {v.id: v for v in m.list_jobs()}
    assert again[done.id] is first[done.id]  # a finished job's view is kept
    assert again[waiting.id] is not first[waiting.id]  # a live one is made again
    m.cancel(waiting.id)
