"""preemptible.sim.evaluation.goodput_draws and benchmarks/goodput_draws.py: goodput over jitter
draws, ours beside its peers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from preemptible.sim.evaluation.goodput_draws import by_policy

ROOT = Path(__file__).resolve().parents[3]
BENCHMARK = ROOT / "benchmarks" / "goodput_draws.py"
TIRESIAS = ROOT.parent / "shared" / "traces" / "tiresias" / "60_job.csv"


def run(draw: int, policy: str, goodput: float) -> dict:
    return {"draw": draw, "policy": policy, "goodput_while_arriving": goodput}


def test_summary_counts_draws_meeting_the_goal_and_compares_draw_by_draw():
    runs = [
        run(0, "preemptible", 0.902),
        run(1, "preemptible", 0.899),
        run(2, "preemptible", 0.905),
        run(0, "slurm", 0.904),
        run(1, "slurm", 0.897),
        run(2, "slurm", 0.900),
    ]
    s = by_policy(runs)
    assert s["preemptible"]["meets_goal"] == 2
    assert s["slurm"]["meets_goal"] == 2  # exactly 90% meets it
    assert (s["preemptible"]["min"], s["preemptible"]["max"]) == (0.899, 0.905)
    assert s["slurm"]["median"] == 0.900
    assert s["slurm"]["ours_higher"] == 2  # draws 1 and 2, not draw 0
    assert s["slurm"]["ours_ratio_median"] == pytest.approx(0.899 / 0.897)
    assert "ours_higher" not in s["preemptible"]


@pytest.mark.skipif(not TIRESIAS.exists(), reason="shared traces absent")
def test_a_real_run_replays_every_draw_under_every_policy(tmp_path):
    out = tmp_path / "draws.json"
    cmd = [sys.executable, str(BENCHMARK), "--trace", "tiresias-60", "--draws", "2"]
    cmd += ["--policies", "preemptible,fifo", "--workers", "2", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "meets goal" in done.stdout
    report = json.loads(out.read_text())
    assert sorted((r["draw"], r["policy"]) for r in report["runs"]) == [
        (d, p) for d in range(3) for p in ("fifo", "preemptible")
    ]
    assert report["summary"]["fifo"]["draws"] == 3


def test_bad_input_is_refused_with_the_choices(tmp_path):
    # Whether or not the shared traces are at hand: the arguments are checked first.
    for shared in (tmp_path, ROOT.parent / "shared" / "traces"):
        cmd = [sys.executable, str(BENCHMARK), "--policies", "preemptible,nope"]
        cmd += ["--shared", str(shared)]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert done.returncode == 2
        assert "unknown policy nope" in done.stderr and "kueue" in done.stderr
    cmd = [sys.executable, str(BENCHMARK), "--shared", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert "trace file missing" in done.stderr and "--shared" in done.stderr
