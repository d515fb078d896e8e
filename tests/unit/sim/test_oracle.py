"""preemptible.sim.evaluation.oracle and benchmarks/policy_oracle.py: hindsight schedules and
refutations of the policy family's four goals."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim import Simulator, TraceJob
from preemptible.sim.evaluation.oracle import (
    Bounds,
    one_draw,
    schedule_metrics,
    schedule_model,
    small_knobs,
    solve,
    tenths,
)
from preemptible.sim.family import workload

ROOT = Path(__file__).resolve().parents[3]
BENCHMARK = ROOT / "benchmarks" / "policy_oracle.py"


def job(name: str, submit_s: float, duration_s: float, gpus: int, save_s: float) -> TraceJob:
    return TraceJob(
        job_id=name,
        submit_s=submit_s,
        duration_s=duration_s,
        gpus=gpus,
        queue="q",
        checkpoint_s=save_s,
    )


def bounds(max_wait_s: float, *, loss_gpu_s: float = 0.0) -> Bounds:
    """Every job within `max_wait_s` (none late), no goodput asked for."""
    tenth = round(max_wait_s * 10)
    return Bounds(
        p95_wait=tenth, max_wait=tenth, late=0, window=10, held=0, loss=round(loss_gpu_s * 10)
    )


def outcome(jobs, gpus, b, loss) -> str:
    model, _ = schedule_model(jobs, gpus, b, loss=loss)
    return solve(model, 10.0)[1]


def test_two_jobs_that_fill_the_cluster_cannot_both_start_within_less_than_a_run():
    jobs = [job("a", 0.0, 100.0, 4, 1000.0), job("b", 0.0, 100.0, 4, 1000.0)]
    assert outcome(jobs, 4, bounds(99.9), 0) == "infeasible"
    assert outcome(jobs, 4, bounds(100.0), 0) == "feasible"
    assert outcome(jobs, 8, bounds(0.0), 0) == "feasible"


def test_lost_runs_lend_a_job_pending_time_only_up_to_the_loss_budget():
    # Saves of 1,000 s cost more than the budget: no preemption can keep progress, but an
    # earlier run that is thrown away takes up to budget / GPUs off b's pending time.
    jobs = [job("a", 0.0, 100.0, 4, 1000.0), job("b", 0.0, 100.0, 4, 1000.0)]
    short = bounds(50.0, loss_gpu_s=4 * 40.0)
    enough = bounds(50.0, loss_gpu_s=4 * 50.0)
    assert outcome(jobs, 4, short, short.loss) == "infeasible"
    assert outcome(jobs, 4, enough, enough.loss) == "feasible"


def test_a_job_cheap_enough_to_preempt_is_left_out_of_the_refutation():
    jobs = [job("a", 0.0, 100.0, 4, 1.0), job("b", 0.0, 100.0, 4, 1.0)]
    b = bounds(10.0, loss_gpu_s=4 * 1.0)
    model, starts = schedule_model(jobs, 4, b, loss=b.loss)
    assert starts == [None, None]
    assert solve(model, 10.0)[1] == "feasible"
    assert outcome(jobs, 4, b, 0) == "infeasible"


def test_the_metrics_of_a_schedule_refuse_more_gpus_than_the_cluster():
    jobs = [job("a", 0.0, 100.0, 4, 1.0), job("b", 0.0, 100.0, 4, 1.0)]
    back_to_back = schedule_metrics(jobs, 4, [0.0, 100.0])
    assert back_to_back["least_served_max_wait_s"] == 100.0
    assert back_to_back["goodput"] == 0.0  # the window (first to last submission) is empty
    with pytest.raises(AssertionError, match="8 GPUs in use"):
        schedule_metrics(jobs, 4, [0.0, 99.9])


def test_a_reachable_draw_gets_a_witness_that_meets_the_four_goals():
    d = one_draw(9, 60, 64, 30.0)
    o = d["oracle"]
    assert o["verdict"] == "reachable" and o["witness"]["outcome"] == "feasible"
    knobs = small_knobs(9, 60, 64)
    jobs, _ = workload(knobs)
    again = schedule_metrics(jobs, 64, o["starts_s"])  # raises if over the cluster
    assert again == o["witness_metrics"]
    waits = sorted(s - j.submit_s for s, j in zip(o["starts_s"], jobs, strict=True))
    assert waits[-1] * 10 <= o["bounds"]["max_wait"] + 1e-6
    assert waits[56] * 10 <= o["bounds"]["p95_wait"] + 1e-6  # the 57th of 60: nearest rank


def test_a_draw_where_no_policy_may_preempt_is_refuted_and_every_policy_misses():
    d = one_draw(3, 60, 64, 30.0)
    assert d["kueue_lost_gpu_h"] == 0.0  # goal 4 then allows no lost work at all
    assert d["oracle"]["verdict"] == "out of reach"
    assert d["oracle"]["refutation"] == {
        "outcome": "infeasible",
        "wall_s": d["oracle"]["refutation"]["wall_s"],
        "dropped": 0,
    }
    assert d["meet_ours_goals"] == []


def test_ours_own_schedule_fits_the_witness_model_where_it_meets_the_goals_losing_nothing():
    knobs = small_knobs(1, 60, 64)
    jobs, cfg = workload(knobs)
    d = one_draw(1, 60, 64, 30.0)
    assert d["all_four"]["preemptible"] and d["goals"]["lost"]["ours"] == 0.0
    result = Simulator(jobs, parse_config_text(cfg), POLICIES["preemptible"]).run()
    first = {r.trace.job_id: r.first_start_s for r in result.records}
    assert all(r.preemptions == 0 for r in result.records)
    b = Bounds(**d["oracle"]["bounds"])
    model, starts = schedule_model(jobs, 64, b, loss=0)
    for j, start in zip(jobs, starts, strict=True):
        model.add(start == tenths(first[j.job_id]))
    assert solve(model, 10.0)[1] == "feasible"


def test_the_rest_of_the_simulator_does_not_need_ortools():
    modules = ["preemptible.sim", "preemptible.cli.sim"]
    modules += [f"preemptible.sim.evaluation.{m}" for m in ("family_summary", "goodput_draws")]
    code = f"import sys, {', '.join(modules)}; print('ortools' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_command_reports_verdicts_and_writes_json(tmp_path):
    out = tmp_path / "oracle.json"
    cmd = [sys.executable, str(BENCHMARK), "--only", "3,9", "--time-limit", "20"]
    done = subprocess.run(
        [*cmd, "--workers", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "draw 3: out of reach" in done.stderr and "draw 9: reachable" in done.stderr
    assert re.search(r"^  reachable +1 of 2$", done.stdout, re.M)
    assert re.search(r"^  out of reach +1 of 2$", done.stdout, re.M)
    report = json.loads(out.read_text())
    assert [d["seed"] for d in report["draws"]] == [3, 9]
    assert report["tally"]["verdicts"] == {"reachable": 1, "out of reach": 1, "open": 0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jobs", "10"], "--jobs must be 20 or more"),
        (["--gpus", "16"], "--gpus must be 36 or more"),
        (["--time-limit", "0"], "must be positive"),
        (["--only", "x"], "seeds separated by commas"),
    ],
)
def test_bad_arguments_are_refused(args, message):
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr
