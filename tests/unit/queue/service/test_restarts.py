"""Crashes, hangs, holds and dependencies under the queue manager, with real processes and a
real SQLite file.

A job that fails is restarted after a back-off, up to its limit; failures in a row without
progress are a crash loop and stop; a job whose step stands still is told to go, killed at its
deadline and restarted. The manager is stepped by the test; the jobs' step beats and
checkpoints are the calls the SDK makes over HTTP, made here directly.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from preemptible.errors import ConfigError, JobNotFoundError, JobSpecError, JobStateError
from preemptible.queue.core import RestartSettings, parse_config_text
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.metrics import ManagerCollector
from preemptible.queue.service.runs import output_tail
from preemptible.queue.service.views import JobState, SubmitRequest
from tests.unit.queue.service.real_managers import no_job_outlives_its_test, real_manager  # noqa: F401 (a fixture)
from tests.unit.queue.service.test_manager import until

PY = sys.executable
RESTARTS = {"backoff": "0.2s", "backoff_max": "1s", "hang_min": "1s"}
# Fails on its first two attempts (saying why on stderr), then succeeds.
FLAKY = (
    "import os, sys\n"
    "attempt = int(os.environ['PREEMPTIBLE_ATTEMPT'])\n"
    "if attempt <= 2:\n"
    "    print(f'CUDA error: an illegal memory access (attempt {attempt})', file=sys.stderr)\n"
    "    sys.exit(1)\n"
    "print('done')\n"
)
SEGFAULT = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
STUBBORN = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def manager(state: Path, **restarts: Any) -> QueueManager:
    config = {
        "cluster": {"gpus": 2},
        "preemption": {"grace_min": "1s", "grace_max": "1s", "min_runtime": "0s"},
        "restarts": {**RESTARTS, **restarts},
        "queues": [{"name": "a", "nominal": {"gpus": 2}}],
    }
    return real_manager(config, state)


def submit(m: QueueManager, code: str, **fields: Any):
    return m.submit(SubmitRequest(queue="a", command=[PY, "-c", code], gpus=1, **fields))


def kinds(m: QueueManager, job_id: str) -> list[str]:
    return [e.kind for e in m.events(job_id=job_id)]


def test_a_failed_job_restarts_after_its_back_off_and_keeps_why(tmp_path):
    m = manager(tmp_path / "state")
    job = submit(m, FLAKY, cwd=str(tmp_path))
    until(m, lambda: m.get_job(job.id).state is JobState.COMPLETED)
    done = m.get_job(job.id)
    assert (done.attempts, done.restarts, done.max_restarts) == (3, 2, 3)
    restarting = [e for e in m.events(job_id=job.id) if e.kind == "restarting"]
    assert [e.reason for e in restarting] == [
        "exited with 1; restart 1 of 3 in 0.2 s",
        "exited with 1; restart 2 of 3 in 0.4 s",  # no progress in between: it doubles
    ]
    first = restarting[0].data
    assert first["tail"] == ["CUDA error: an illegal memory access (attempt 1)"]
    assert first["error"] is None, "no Error: line"
    assert (first["exit_code"], first["attempt"], first["step"]) == (1, 1, None)
    admitted = [e.at for e in m.events(job_id=job.id) if e.kind == "admitted"]
    assert admitted[1] - restarting[0].at >= 0.2, "the back-off was waited"
    assert m.jobs[job.id].restart_at is None


def test_a_job_that_never_progresses_is_failed_as_a_crash_loop(tmp_path):
    m = manager(tmp_path / "state", crash_loop_after=2)
    job = submit(m, SEGFAULT)
    until(m, lambda: m.get_job(job.id).state.finished)
    failed = m.get_job(job.id)
    assert failed.state is JobState.FAILED and failed.attempts == 2
    assert failed.reason == (
        "failed: crash loop: 2 failures in a row without progress (no checkpoint ever); "
        "not restarted. Last: exited with 139"
    ), failed.reason
    assert kinds(m, job.id).count("restarting") == 1
    assert m.jobs[job.id].failures[-1]["signal"] == 11
    failures = m.metrics_snapshot()["failures"]
    assert failures == {("a", "restarted"): 1, ("a", "crash_loop"): 1}
    registry = CollectorRegistry()
    registry.register(ManagerCollector(m))
    scraped = generate_latest(registry).decode()
    assert 'preemptible_queue_failures_total{outcome="crash_loop",queue="a"} 1.0' in scraped


def test_progress_resets_the_crash_loop_and_max_restarts_still_ends_it(tmp_path):
    """A job that checkpoints further each attempt is no crash loop: it is restarted until its
    own max_restarts is used."""
    m = manager(tmp_path / "state", crash_loop_after=1)
    job = submit(m, STUBBORN, max_restarts=2)
    for attempt in (1, 2, 3):
        until(m, lambda a=attempt: m.jobs[job.id].attempts == a and m.jobs[job.id].handle)
        until(m, lambda: "ready" in m.log_path(job.id).read_text())
        m.checkpointed(job.id, step=10 * attempt, at=None)  # a newer checkpoint each time
        m.executor.kill(m.jobs[job.id].handle)  # it dies (an OOM kill, say)
        until(m, lambda: m.get_job(job.id).state is not JobState.RUNNING)
    until(m, lambda: m.get_job(job.id).state.finished)
    failed = m.get_job(job.id)
    assert failed.state is JobState.FAILED and failed.attempts == 3 and failed.restarts == 2
    assert "no restart left (2 used: max_restarts)" in failed.reason
    reasons = [e.reason for e in m.events(job_id=job.id) if e.kind == "restarting"]
    assert reasons[0].endswith("(last checkpoint reported: step 10)"), reasons


def test_a_job_may_ask_for_fewer_restarts_never_more(tmp_path):
    m = manager(tmp_path / "state", max_restarts=2)
    with pytest.raises(JobSpecError, match="asks for max_restarts 5 but queue 'a' allows 2"):
        submit(m, "pass", max_restarts=5)
    assert submit(m, "pass").max_restarts == 2
    assert submit(m, "pass", max_restarts=0).max_restarts == 0


def test_a_job_cancelled_in_its_back_off_is_never_restarted(tmp_path):
    m = manager(tmp_path / "state", backoff="30s", backoff_max="1m")
    job = submit(m, "import sys; sys.exit(2)")
    until(m, lambda: m.jobs[job.id].restart_at is not None)
    m.cancel(job.id)
    for _ in range(5):
        m.step()
    assert m.get_job(job.id).state is JobState.CANCELLED and m.jobs[job.id].attempts == 1
    assert job.id not in m.runs.restarting


def test_a_restarted_manager_keeps_the_back_off_and_then_restarts(tmp_path):
    state = tmp_path / "state"
    m = manager(state, backoff="1s")
    job = submit(m, FLAKY, cwd=str(tmp_path))
    until(m, lambda: m.jobs[job.id].restart_at is not None)
    m.store.close()
    again = manager(state, backoff="1s")
    assert again.runs.restarting == {job.id: again.jobs[job.id].restart_at}
    until(again, lambda: again.get_job(job.id).state is JobState.COMPLETED)
    assert again.get_job(job.id).attempts == 3


def test_a_hung_job_is_noticed_killed_at_its_deadline_and_restarted(tmp_path):
    m = manager(tmp_path / "state", hang_after="1s", crash_loop_after=3)
    job = submit(m, STUBBORN)
    until(m, lambda: "ready" in m.log_path(job.id).read_text())
    m.progress(job.id, step=5, step_s=0.01)
    m.progress(job.id, step=6, step_s=0.01)  # then it stands still (a deadlocked collective)
    until(m, lambda: m.jobs[job.id].attempts == 2, timeout=30)
    events = [e for e in m.events(job_id=job.id) if e.kind in ("notice", "killed", "restarting")]
    assert [e.kind for e in events] == ["notice", "killed", "restarting"]
    notice, killed, restarting = events
    assert notice.reason.startswith("hung: step 6 has not advanced for ")
    assert notice.reason.endswith("(bound 1 s: the queue's hang_after)")
    assert notice.data["hung"] is True
    assert killed.reason == "SIGKILL: still running at its notice's deadline (1 s)"
    assert restarting.data["step"] == 6 and restarting.data["signal"] == 9
    assert restarting.reason.startswith("hung: step 6") and "restart 1 of 3" in restarting.reason
    assert m.jobs[job.id].observed_exit_s is None, "a hang is no measure of its exit"
    assert m.metrics_snapshot()["hangs"] == {("a", "step"): 1}


def test_a_job_that_never_beats_is_not_watched_and_the_bound_is_learned(tmp_path):
    m = manager(tmp_path / "state", hang_min="2s", hang_factor=10)
    job = submit(m, STUBBORN)
    until(m, lambda: "ready" in m.log_path(job.id).read_text())
    record = m.jobs[job.id]
    assert m.runs.hang_bound(record) is None, "no step reported: not watched"
    m.progress(job.id, step=1, step_s=None)
    assert m.runs.hang_bound(record) == (2.0, "hang_min")
    m.progress(job.id, step=2, step_s=0.5)
    assert m.runs.hang_bound(record) == (5.0, "10x its slowest step, 0.5 s")
    m.progress(job.id, step=3, step_s=0.1)  # the slowest stays
    assert m.runs.hang_bound(record)[0] == 5.0
    record.hang_after_s = 42.0
    assert m.runs.hang_bound(record) == (42.0, "its hang_after")
    m.cancel(job.id)
    until(m, lambda: m.get_job(job.id).state is JobState.CANCELLED)
    assert job.id not in m.runs.progress, "what its beats said goes with the attempt"


def test_the_output_tail_is_bounded_and_finds_the_first_error(tmp_path):
    log = tmp_path / "log"
    noise = [f"line {i}" for i in range(50)]
    first = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    later = "[rank1]: RuntimeError: Connection closed by peer"
    log.write_text("\n".join(["x" * 70000, "ok", first, *noise, later, "tail"]) + "\n")
    tail, error = output_tail(log)
    assert tail == [*noise[-18:], later, "tail"] and error == first
    log.write_bytes(b"A" * 70000)  # one huge line, cut: nothing whole to show
    assert output_tail(log) == ([], None)
    log.write_bytes(b"ok\n\xff\xfe broken utf-8 " + b"y" * 400 + b"\nSegmentation fault\n")
    tail, error = output_tail(log)
    assert tail[0] == "ok" and len(tail[1]) == 300 and error == "Segmentation fault"
    log.write_text("RuntimeErrors are fine here\nError rate 0.1, no error here\n")
    assert output_tail(log)[1] is None
    assert output_tail(tmp_path / "missing") == ([], None)


def test_the_restarts_table_is_checked_and_explained():
    config = parse_config_text(
        '[cluster]\ngpus = 1\n[restarts]\nmax_restarts = 5\nbackoff = "5s"\n'
        '[[queues]]\nname = "a"\nmax_restarts = 1\n[[queues]]\nname = "b"\n'
    )
    assert config.restart_limit("a") == 1 and config.restart_limit("b") == 5
    assert config.restarts.backoff_s == 5.0
    defaults = RestartSettings()
    assert [defaults.backoff(n) for n in (1, 2, 3, 10)] == [10.0, 20.0, 40.0, 300.0]
    for text, message in (
        ("[restarts]\nmax_restarts = -1", "restarts.max_restarts: must be at least 0"),
        ("[restarts]\nmax_restarts = 1.5", "expected a whole number"),
        ("[restarts]\ncrash_loop_after = 0", "to never restart a job, set max_restarts = 0"),
        ('[restarts]\nbackoff = "1m"\nbackoff_max = "10s"', "backoff_max (10s) is shorter"),
        ('[restarts]\nhang_after = "0s"', "restarts.hang_after: must be longer than 0s"),
        ("[restarts]\nhang_factor = 0.5", "must be at least 1"),
        ("[restarts]\nretries = 3", "unknown key 'retries'"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_config_text(f"[cluster]\ngpus = 1\n{text}\n")


def test_a_held_job_waits_out_of_its_queue_until_released_even_across_a_restart(tmp_path):
    state = tmp_path / "state"
    m = manager(state)
    held = submit(m, "print('ran')", hold=True)
    assert held.held and held.reason.startswith("held: ")
    for _ in range(3):
        m.step()
    assert m.get_job(held.id).state is JobState.PENDING and m.jobs[held.id].attempts == 0
    m.store.close()
    m = manager(state)  # recovered: still held, in no queue
    for _ in range(3):
        m.step()
    assert m.jobs[held.id].attempts == 0 and held.id not in m.shell.state.pending
    released = m.release(held.id)
    assert not released.held and released.reason == "pending: released"
    until(m, lambda: m.get_job(held.id).state is JobState.COMPLETED)
    assert kinds(m, held.id) == ["submitted", "released", "admitted", "completed"]
    with pytest.raises(JobStateError, match="not held"):
        m.release(held.id)


def test_hold_and_release_a_pending_job_and_one_in_its_back_off(tmp_path):
    m = manager(tmp_path / "state", backoff="1s", backoff_max="2s")
    big = m.submit(SubmitRequest(queue="a", command=[PY, "-c", STUBBORN], gpus=2))
    until(m, lambda: m.get_job(big.id).state is JobState.RUNNING)
    with pytest.raises(JobStateError, match="only a pending job can be held"):
        m.hold(big.id)
    waiting = submit(m, "pass")
    m.step()
    assert m.hold(waiting.id).held and waiting.id not in m.shell.state.pending
    assert m.hold(waiting.id).held, "holding a held job changes nothing"
    m.release(waiting.id)
    assert waiting.id in m.shell.state.pending
    m.cancel(waiting.id)
    m.cancel(big.id)
    crashing = submit(m, "import sys; sys.exit(1)", max_restarts=1)
    until(m, lambda: m.jobs[crashing.id].restart_at is not None)
    m.hold(crashing.id)
    time.sleep(1.2)
    for _ in range(3):
        m.step()
    assert m.jobs[crashing.id].attempts == 1, "held: its back-off ended, it did not restart"
    m.release(crashing.id)
    until(m, lambda: m.get_job(crashing.id).state.finished)
    assert m.jobs[crashing.id].attempts == 2
    assert m.get_job(waiting.id).state is JobState.CANCELLED


def test_a_job_after_another_starts_when_it_succeeds_and_is_cancelled_when_it_fails(tmp_path):
    m = manager(tmp_path / "state")
    first = submit(m, "import time; time.sleep(0.5)")
    then = submit(m, "pass", after=[first.id])
    started = submit(m, "pass", after=[f"{first.id}:started"])
    assert then.reason == f"pending: waiting for {first.id} to succeed" and then.after == [
        f"{first.id}:ok"
    ]
    until(m, lambda: m.get_job(started.id).state.finished)
    assert m.jobs[then.id].attempts == 0 or m.get_job(first.id).state.finished
    until(m, lambda: m.get_job(then.id).state is JobState.COMPLETED)
    admitted = {e.job_id: e.at for e in m.events() if e.kind == "admitted"}
    finished = next(e.at for e in m.events(job_id=first.id) if e.kind == "completed")
    assert admitted[then.id] >= finished and admitted[started.id] <= finished
    assert "dependency" in kinds(m, then.id)

    failing = submit(m, "import sys; sys.exit(4)", max_restarts=0)
    doomed = submit(m, "pass", after=[f"{failing.id}:ok"])
    anyway = submit(m, "pass", after=[f"{failing.id}:any"])
    until(m, lambda: m.get_job(doomed.id).state.finished and m.get_job(anyway.id).state.finished)
    cancelled = m.get_job(doomed.id)
    assert cancelled.state is JobState.CANCELLED and cancelled.attempts == 0
    assert cancelled.reason == (
        f"cancelled: its dependency {failing.id} failed before it could succeed (it waited "
        f"for {failing.id} to succeed)"
    )
    assert m.get_job(anyway.id).state is JobState.COMPLETED


def test_dependencies_survive_a_restart_and_a_held_dependent_waits_for_its_release(tmp_path):
    state = tmp_path / "state"
    m = manager(state)
    gate = submit(m, "pass", hold=True)
    dependent = submit(m, "pass", after=[gate.id], hold=True)
    with pytest.raises(JobNotFoundError):
        submit(m, "pass", after=["j999"])
    m.store.close()
    m = manager(state)
    assert m.runs.waiting == {dependent.id}
    m.release(gate.id)
    until(m, lambda: m.get_job(gate.id).state is JobState.COMPLETED)
    until(m, lambda: not m.jobs[dependent.id].after)
    for _ in range(3):
        m.step()
    assert m.jobs[dependent.id].attempts == 0, "met, but still held"
    m.release(dependent.id)
    until(m, lambda: m.get_job(dependent.id).state is JobState.COMPLETED)
    late = submit(m, "pass", after=[f"{dependent.id}:any"])  # met already: it just runs
    until(m, lambda: m.get_job(late.id).state is JobState.COMPLETED)
    blocked = submit(m, "pass", after=[gate.id], hold=True)
    m.cancel(blocked.id)  # waiting and held: cancelled all the same
    assert m.get_job(blocked.id).state is JobState.CANCELLED and blocked.id not in m.runs.waiting
