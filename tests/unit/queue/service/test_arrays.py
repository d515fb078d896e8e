"""Job arrays: the spec, the limit kept by the real manager with real processes and a real
SQLite file, and the command line against that manager served over HTTP."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from preemptible.cli.queue import app as cli_app
from preemptible.errors import JobSpecError, JobStateError
from preemptible.queue import arrays
from preemptible.queue.service.app import create_app
from preemptible.queue.service.auth import resolve_tokens
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.views import JobState, SubmitRequest
from tests.unit.queue.service.fake_manager import live_server
from tests.unit.queue.service.real_managers import no_job_outlives_its_test, real_manager, retire  # noqa: F401 (a fixture)
from tests.unit.queue.service.test_manager import until

PY = sys.executable
TOKEN = "team-a-" + "7" * 32
# Each job writes its index (from the variable, and from `{index}` in its command), then
# waits until the test removes the gate file, so that the test sees who runs at once.
WORKER = (
    "import os, sys, time\n"
    "out, gate = sys.argv[1], sys.argv[2]\n"
    "with open(os.path.join(out, os.environ['PREEMPTIBLE_ARRAY_INDEX']), 'w') as f:\n"
    "    f.write(os.environ['PREEMPTIBLE_ARRAY_ID'] + ' ' + sys.argv[3])\n"
    "while os.path.exists(gate):\n"
    "    time.sleep(0.02)\n"
)


def manager(state: Path) -> QueueManager:
    config = {
        "cluster": {"gpus": 4},
        "preemption": {"grace_min": "1s", "grace_max": "1s", "min_runtime": "0s"},
        "restarts": {"backoff": "0.2s", "backoff_max": "1s"},
        "queues": [{"name": "a", "nominal": {"gpus": 4}, "token": "env:TEAM_A_TOKEN"}],
    }
    return real_manager(config, state)


def submit_array(m: QueueManager, spec: str, out: Path, gate: Path, **fields: Any):
    command = [PY, "-c", WORKER, str(out), str(gate), "index={index}"]
    return m.submit(SubmitRequest(queue="a", command=command, array=spec, **fields))


def members(m: QueueManager, array_id: str) -> list[Any]:
    return m.list_jobs(array=array_id)


def active(m: QueueManager, array_id: str) -> set[str]:
    """The array's jobs in their queue or running."""
    state = m.shell.state
    return {j.id for j in members(m, array_id) if j.id in state.pending or j.id in state.running}


# --- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "indices", "limit"),
    [
        ("0-3%2", (0, 1, 2, 3), 2),
        ("7", (7,), None),
        ("1,3,10-20:5", (1, 3, 10, 15, 20), None),
        ("4-6,5,0", (0, 4, 5, 6), None),
    ],
)
def test_a_spec_reads_as_sbatch_reads_it(spec, indices, limit):
    assert arrays.parse(spec) == arrays.ArraySpec(indices=indices, limit=limit)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("0-99%0", "at least 1"),
        ("0-99%x", "whole number"),
        ("5-1", "goes down; write 1-5"),
        ("0-10:0", "step of 0"),
        ("a-b", "cannot read 'a-b'"),
        ("0-1000", "more than 1000 jobs"),
        ("0-5000:2", "more than 1000 jobs"),
        ("1,,2", "cannot read ''"),
        ("999999-1000000", "below 1000000"),
    ],
)
def test_a_bad_spec_says_what_to_write(spec, says):
    with pytest.raises(JobSpecError, match=says.replace("(", r"\(")):
        arrays.parse(spec)


@given(st.sets(st.integers(min_value=0, max_value=5000), min_size=1, max_size=300))
def test_compressed_indices_read_back_as_the_same_indices(indices):
    assert arrays.parse(arrays.compress(list(indices))).indices == tuple(sorted(indices))


# --- the manager ---------------------------------------------------------------------------------


def test_an_array_runs_each_index_with_at_most_its_limit_at_once(tmp_path):
    m = manager(tmp_path / "state")
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    gate.touch()
    first = submit_array(m, "0-5%2", out, gate, name="sweep")
    array_id = first.array_id
    assert array_id == f"a{first.id[1:]}" and first.array_index == 0
    jobs = members(m, array_id)
    assert [j.array_index for j in jobs] == [0, 1, 2, 3, 4, 5]
    assert [j.name for j in jobs] == [f"sweep[{i}]" for i in range(6)]
    until(m, lambda: len(list(out.iterdir())) == 2)
    for _ in range(5):  # capacity for all six, but the limit holds them back
        m.step()
        assert len(active(m, array_id)) == 2
    waiting = m.get_job(jobs[5].id)
    assert waiting.reason == f"pending: array {array_id} runs at most 2 at once"
    gate.unlink()  # every job may now finish; each finished one lets the next in
    until(m, lambda: all(m.get_job(j.id).state is JobState.COMPLETED for j in jobs))
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        str(i): f"{array_id} index={i}" for i in range(6)
    }
    starts = sorted((m.jobs[j.id].started_at or 0.0, j.array_index) for j in jobs)
    assert [i for _, i in starts][:2] == [0, 1], "lowest indices first"
    runs = [run for j in jobs for run in m.jobs[j.id].runs]  # [start, end, GPUs] of each
    most = max(sum(1 for s, e, _ in runs if s <= t < e) for t, _, _ in runs)
    assert most == 2, "never more than the limit running at once"


def test_hold_priority_and_cancel_act_on_one_index_and_the_backlog_survives_a_restart(tmp_path):
    state = tmp_path / "state"
    m = manager(state)
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    gate.touch()
    first = submit_array(m, "0-3%1", out, gate)
    jobs = members(m, first.array_id)
    until(m, lambda: m.get_job(jobs[0].id).state is JobState.RUNNING)
    m.hold(jobs[1].id)  # index 1 is held: index 2 goes next
    m.set_tier(jobs[3].id, "high")
    assert m.get_job(jobs[3].id).tier == "high"
    with pytest.raises(JobStateError, match="only a pending job's tier"):
        m.set_tier(jobs[0].id, "low")
    retire(m)
    m = manager(state)  # index 0 was killed with the old manager; the rest wait as before
    assert m.runs.array_backlog[first.array_id] >= {jobs[2].id, jobs[3].id}
    assert m.get_job(jobs[1].id).held and m.get_job(jobs[3].id).tier == "high"
    until(m, lambda: m.get_job(jobs[0].id).state is JobState.RUNNING)
    m.cancel(jobs[0].id)
    until(m, lambda: m.get_job(jobs[2].id).state is JobState.RUNNING)
    assert m.get_job(jobs[3].id).state is JobState.PENDING, "the limit still holds after a restart"
    assert m.get_job(jobs[1].id).state is JobState.PENDING, "held: skipped"
    m.cancel(jobs[3].id)
    assert first.array_id not in m.runs.array_backlog
    gate.unlink()
    until(m, lambda: m.get_job(jobs[2].id).state is JobState.COMPLETED)
    m.release(jobs[1].id)
    until(m, lambda: m.get_job(jobs[1].id).state is JobState.COMPLETED)


def test_a_job_after_an_array_waits_for_each_of_its_jobs(tmp_path):
    m = manager(tmp_path / "state")
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    gate.touch()
    first = submit_array(m, "0-2", out, gate)
    then = m.submit(SubmitRequest(queue="a", command=[PY, "-c", "pass"], after=[first.array_id]))
    assert then.after == [f"{j.id}:ok" for j in members(m, first.array_id)]
    until(m, lambda: len(list(out.iterdir())) == 3)
    gate.unlink()
    until(m, lambda: m.get_job(then.id).state is JobState.COMPLETED)
    ended = max(m.jobs[j.id].finished_at or 0.0 for j in members(m, first.array_id))
    assert (m.jobs[then.id].started_at or 0.0) >= ended, "it started once all had succeeded"


# --- the command line ----------------------------------------------------------------------------


def test_the_command_line_submits_shows_and_acts_on_an_array(tmp_path, monkeypatch):
    monkeypatch.setenv("TEAM_A_TOKEN", TOKEN)
    m = manager(tmp_path / "state")
    tokens = resolve_tokens(m.config, {"TEAM_A_TOKEN": TOKEN})
    out, gate = tmp_path / "out", tmp_path / "gate"
    out.mkdir()
    gate.touch()
    runner = CliRunner()
    with live_server(create_app(m, tokens=tokens)) as url:

        def cli(*args: str):
            env = {"PREEMPTIBLE_QUEUE_URL": url, "PREEMPTIBLE_TOKEN": TOKEN, "COLUMNS": "200"}
            return runner.invoke(cli_app, list(args), env=env)

        command = ["--", PY, "-c", WORKER, str(out), str(gate), "{index}"]
        done = cli(
            "submit", "--queue", "a", "--gpus", "1", "--array", "0-9%3", "--name", "lr", *command
        )
        assert done.exit_code == 0, done.output
        array_id = m.list_jobs()[0].array_id
        ids = [j.id for j in members(m, array_id)]
        assert done.stdout.strip() == (
            f"submitted array {array_id} to a: 10 jobs, {ids[0]} to {ids[-1]}, at most 3 at once"
        )
        until(m, lambda: len(list(out.iterdir())) == 3)
        rows = [line for line in cli("status").stdout.splitlines() if array_id in line]
        assert len(rows) == 1, "one line for the array"
        assert "3 running (0-2), 7 pending (3-9); at most 3 at once" in rows[0]
        assert "lr " in rows[0] and "1 each" in rows[0]
        expanded = cli("status", "--expand").stdout
        assert all(job_id in expanded for job_id in ids) and "lr[9]" in expanded
        held = cli("hold", f"{array_id}_9")
        assert held.exit_code == 0 and held.stdout.startswith(f"{ids[9]}: pending")
        assert m.get_job(ids[9]).held
        raised = cli("priority", "high", array_id)  # every pending job of the array
        assert raised.exit_code == 0, raised.output
        assert [m.get_job(i).tier for i in ids] == ["normal"] * 3 + ["high"] * 7
        why = cli("why", f"{array_id}_4")
        assert why.exit_code == 0 and why.stdout.startswith(f"{ids[4]}: pending")
        missing = cli("why", f"{array_id}_42")
        assert missing.exit_code == 2 and "no such index" in missing.stderr
        whole = cli("why", array_id)
        assert whole.exit_code == 2 and f"give one of its jobs, {array_id}_INDEX" in whole.stderr
        unknown = cli("cancel", "a999")
        assert unknown.exit_code == 2 and "no array 'a999'" in unknown.stderr
        cancelled = cli("cancel", array_id)  # every active job of it
        assert cancelled.exit_code == 0, cancelled.output
        until(m, lambda: all(m.get_job(i).state.finished for i in ids))
        assert {m.get_job(i).state for i in ids} == {JobState.CANCELLED}
        nowhere = cli("submit", "--queue", "a", "--after", "a999", "--", "true")
        assert nowhere.exit_code == 2 and "no job 'a999'" in nowhere.stderr
        bad = cli("submit", "--queue", "a", "--array", "5-1", "--", "true")
        assert bad.exit_code == 2 and "goes down; write 1-5" in bad.stderr
        assert len(m.list_jobs()) == 10, "a refused array takes nothing"
