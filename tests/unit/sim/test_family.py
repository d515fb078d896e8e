"""preemptible.sim.family, its goals (preemptible.sim.evaluation.family_goals, family_summary)
and benchmarks/policy_family.py: the workload family and its goals."""

import collections
import dataclasses
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from preemptible.queue.core import parse_config_text
from preemptible.sim.evaluation.family_goals import (
    BASELINES,
    HELD_OUT_REFERENCE,
    OURS,
    PROPOSED,
    judge,
    replay,
)
from preemptible.sim.evaluation.family_summary import (
    ceiling,
    clause_counts,
    counts,
    draw_report,
    gain_per_lost,
    lost_by_kind,
    worst,
)
from preemptible.sim.family import (
    DAY_S,
    Arrivals,
    Knobs,
    TierLayout,
    config_text,
    draw_knobs,
    held_out_knobs,
    held_out_workload,
    team_names,
    workload,
)

ROOT = Path(__file__).resolve().parents[3]
BENCHMARK = ROOT / "benchmarks" / "policy_family.py"
MANY = range(300)


def small(seed: int, jobs: int = 300) -> Knobs:
    """Draw `seed` with fewer jobs, for speed (every other knob as drawn)."""
    return dataclasses.replace(draw_knobs(seed), jobs=jobs)


def demand_ratio(jobs) -> float:
    """GPU-seconds submitted / GPU-seconds offered from the first to the last submission."""
    span = max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)
    return sum(j.gpus * j.duration_s for j in jobs) / span


# --- the generator ---------------------------------------------------------------------------


def test_a_seed_gives_the_same_knobs_and_jobs_every_time():
    assert draw_knobs(7) == draw_knobs(7)
    assert draw_knobs(7) != draw_knobs(8)
    assert workload(small(7)) == workload(small(7))
    assert workload(small(7))[0] != workload(dataclasses.replace(small(7), seed=8))[0]


def test_a_draw_does_not_depend_on_the_processs_hash_seed():
    code = (
        "import hashlib, dataclasses; from preemptible.sim.family import draw_knobs, workload; "
        "k = dataclasses.replace(draw_knobs(3), jobs=200); "
        "print(hashlib.sha256(repr(workload(k)).encode()).hexdigest())"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={"PYTHONHASHSEED": hash_seed, "PATH": ""},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        digests.add(done.stdout.strip())
    here = hashlib.sha256(repr(workload(small(3, 200))).encode()).hexdigest()
    assert digests == {here}


def test_knobs_stay_in_their_ranges_over_many_seeds():
    seen = collections.defaultdict(set)
    for seed in MANY:
        k = draw_knobs(seed)
        assert k.seed == seed
        assert 4000 <= k.jobs <= 10000
        assert k.gpus in (64, 128, 256) and k.gpus_per_node in (8, None)
        assert 2.0 <= k.span_days <= 10.0 and 0.8 <= k.load <= 1.3
        assert 2 <= k.teams <= 8 and len(k.demand) == k.teams
        assert math.isclose(sum(k.weights), 1.0) and math.isclose(sum(k.demand), 1.0)
        assert min(k.weights) > 0 and min(k.demand) > 0
        assert len(k.tier_mix) == 4 and math.isclose(sum(k.tier_mix), 1.0)
        assert 0.0 <= k.gang_share <= 0.25
        assert k.gang_gpus[0] == 16 and max(k.gang_gpus) <= k.gpus // 4
        assert set(k.gang_gpus) <= {16, 32, 64}
        assert 0.3 <= k.burst_share <= 0.8 and 0.8 <= k.duration_sigma <= 2.0
        assert 0.0 <= k.estimate_share <= 1.0
        assert 0.5 <= k.estimate_low <= 1.0 <= k.estimate_high <= 4.0
        assert 5.0 <= k.checkpoint_median_s <= 300.0
        assert 0.5 <= k.nominal_fraction <= 1.0
        assert k.borrowing_factor is None or 0.5 <= k.borrowing_factor <= 2.0
        seen["gpus"].add(k.gpus)
        seen["nodes"].add(k.gpus_per_node)
        seen["teams"].add(k.teams)
        seen["tiers"].add(sum(p > 0 for p in k.tier_mix))
        seen["layout"].add(k.tier_layout)
        seen["arrivals"].add(k.arrivals)
        seen["full quota"].add(k.nominal_fraction == 1.0)
        seen["limit"].add(k.borrowing_factor is None)
        seen["gangs"].add(max(k.gang_gpus))
    # Every choice of every knob comes up.
    assert seen["gpus"] == {64, 128, 256} and seen["nodes"] == {8, None}
    assert seen["teams"] == set(range(2, 9)) and seen["tiers"] == {1, 2, 3, 4}
    assert seen["layout"] == set(TierLayout) and seen["arrivals"] == set(Arrivals)
    assert seen["full quota"] == seen["limit"] == {True, False}
    assert seen["gangs"] == {16, 32, 64}


def test_every_drawn_config_parses_with_quotas_as_drawn():
    for seed in MANY:
        k = draw_knobs(seed)
        cfg = parse_config_text(config_text(k, [max(k.gang_gpus)] * k.teams))
        assert cfg.cluster.gpus == k.gpus
        assert cfg.cluster.gpus_per_node == k.gpus_per_node
        assert [q.name for q in cfg.queues] == team_names(k.teams)
        assert sum(q.nominal.gpus for q in cfg.queues) == round(k.nominal_fraction * k.gpus)
        for q in cfg.queues:
            if k.borrowing_factor is None:
                assert q.borrowing_limit.gpus == math.inf
            else:
                assert q.nominal.gpus + q.borrowing_limit.gpus >= max(k.gang_gpus)


def test_every_job_fits_its_queue_and_the_cluster():
    for seed in range(12):
        k = small(seed, 1000)
        jobs, text = workload(k)
        cfg = parse_config_text(text)
        queues = {q.name: q for q in cfg.queues}
        assert len(jobs) == k.jobs and len({j.job_id for j in jobs}) == k.jobs
        for j in jobs:
            q = queues[j.queue]
            assert j.gpus <= min(k.gpus, q.nominal.gpus + q.borrowing_limit.gpus)
            assert j.checkpoint_s is not None and 1.0 <= j.checkpoint_s <= 900.0
            assert j.duration_s >= 1.0


@pytest.mark.parametrize("arrivals", list(Arrivals))
def test_the_load_is_gpu_seconds_submitted_over_those_offered_while_jobs_arrive(arrivals):
    k = dataclasses.replace(small(11, 2000), arrivals=arrivals)
    jobs, _ = workload(k)
    assert min(j.submit_s for j in jobs) == 0.0
    assert max(j.submit_s for j in jobs) == pytest.approx(k.span_days * DAY_S, abs=0.1)
    assert demand_ratio(jobs) / k.gpus == pytest.approx(k.load, rel=1e-3)


# --- the held-out workload ------------------------------------------------------------------


def test_the_held_out_workload_has_the_properties_it_promises():
    jobs, text = held_out_workload()
    assert held_out_workload() == (jobs, text)
    cfg = parse_config_text(text)
    assert cfg.cluster.gpus == 256
    assert [(q.nominal.gpus, q.borrowing_limit.gpus) for q in cfg.queues] == [
        (128, 128),
        (64, 64),
        (64, 64),
    ]
    tiers = collections.defaultdict(set)
    for j in jobs:
        tiers[j.queue].add(j.tier)
    assert len(tiers) == 3
    assert all(t == {"low", "normal", "high", "critical"} for t in tiers.values())
    sizes = collections.Counter(j.gpus for j in jobs)
    assert {g for g in sizes if g > 8} == {16}
    assert sum(n for g, n in sizes.items() if g <= 8) > 0.8 * len(jobs)
    assert all(j.estimate_s is not None for j in jobs)
    assert demand_ratio(jobs) / 256 == pytest.approx(1.11, rel=1e-3)
    assert max(j.submit_s for j in jobs) == pytest.approx(10 * DAY_S, abs=0.1)
    # Each team bursts on a day of its own: its busiest day, at least 3x its mean day.
    busiest = {}
    for team in tiers:
        per_day = collections.Counter(int(j.submit_s // DAY_S) for j in jobs if j.queue == team)
        day, n = per_day.most_common(1)[0]
        assert n > 3 * sum(per_day.values()) / 10
        busiest[team] = day
    assert len(set(busiest.values())) == 3
    assert held_out_knobs().tier_layout is TierLayout.SPREAD


# --- the goals -------------------------------------------------------------------------------


def numbers(goodput, p95_h, least_h, lost_gpu_h, delivered_gpu_h=50_000.0):
    return {
        "goodput": goodput,
        "p95_wait_s": p95_h * 3600,
        "least_served_max_wait_s": least_h * 3600,
        "lost_gpu_h": lost_gpu_h,
        "delivered_gpu_h": delivered_gpu_h,
    }


REFERENCE = {  # the held-out workload's reference table, as the goals read it (no mean JCT)
    policy: numbers(goodput, p95_h, least_h, lost_gpu_h)
    for policy, (goodput, p95_h, least_h, _jct_h, lost_gpu_h) in HELD_OUT_REFERENCE.items()
}


def test_the_goals_on_the_held_out_reference_table():
    assert REFERENCE["fifo"] == numbers(0.913, 30.9, 39.1, 0)
    g = judge(REFERENCE)
    # 1. under kueue's 87.9% and more than 2 points under fifo's 91.3%: the bound is 89.3%.
    assert g["goodput"]["best_policy"] == "fifo"
    assert g["goodput"]["excess"] == pytest.approx(0.913 - 0.02 - 0.874)
    assert not g["goodput"]["met"]
    # 2. against slurm's 29.4 h: 42.6 / 29.4 = 1.45x.
    assert g["p95_wait"]["best_policy"] == "slurm"
    assert g["p95_wait"]["ratio"] == pytest.approx(42.6 / 29.4)
    assert not g["p95_wait"]["met"]
    # 3. fifo's 39.1 h does not count (it ignores tiers); priority's 5.7 d does: 8.9 / 5.7.
    assert g["least_served"]["best_policy"] == "priority"
    assert g["least_served"]["ratio"] == pytest.approx(8.9 / 5.7)
    assert not g["least_served"]["met"]
    # 4. 190 GPU-h: 0.38% of 50,000 and under half of kueue's 800.
    assert g["lost"]["share"] == pytest.approx(190 / 50_000)
    assert g["lost"]["met"]
    assert g["lost"]["excess"] == pytest.approx((190 - 400) / 50_000)  # 210 GPU-h to spare
    assert not g["goodput"]["vs_quota_peer"] and not g["goodput"]["vs_best"]
    assert not g["all"]["met"]


def test_each_bound_is_met_exactly_at_its_edge():
    edge = {
        "fifo": numbers(0.92, 10, 50, 0),
        "priority": numbers(0.80, 20, 20, 0),
        "kueue": numbers(0.89, 30, 40, 100),
        "slurm": numbers(0.85, 40, 30, 0),
        "preemptible": numbers(0.90, 11, 22, 50, delivered_gpu_h=5001),
    }
    g = judge(edge)
    assert g["goodput"]["met"]  # best 92% - 2 points = 90%, and above kueue's 89%
    assert g["p95_wait"]["met"] and g["p95_wait"]["ratio"] == pytest.approx(1.1)
    assert g["least_served"]["met"]  # 22 h against priority's 20 h
    assert g["lost"]["met"]  # 50 = half of kueue's 100, and 50 / 5001 < 1%
    assert g["all"]["met"]
    edge["preemptible"] = numbers(0.90, 11, 22, 50, delivered_gpu_h=5000)
    assert not judge(edge)["lost"]["met"]  # exactly 1% is not under 1%
    edge["kueue"] = numbers(0.905, 30, 40, 100)
    assert not judge(edge)["goodput"]["met"]  # under kueue's


def test_waits_under_a_minute_count_as_a_minute_and_lost_work_against_none():
    quiet = {p: numbers(0.9, 5 / 3600, 30 / 3600, 0) for p in BASELINES}
    quiet["preemptible"] = numbers(0.9, 50 / 3600, 59 / 3600, 0)
    g = judge(quiet)
    assert g["p95_wait"]["met"] and g["least_served"]["met"] and g["lost"]["met"]
    quiet["preemptible"] = numbers(0.9, 50 / 3600, 59 / 3600, 0.5)
    g = judge(quiet)
    assert not g["lost"]["met"]  # kueue lost nothing: half of nothing is the bound
    assert g["lost"]["under_1pct"] and not g["lost"]["vs_quota_peer"]
    assert g["lost"]["excess"] == pytest.approx(0.5 / 50_000)  # beyond the bound, of delivered


def test_a_baseline_is_judged_against_the_other_four():
    g = judge(REFERENCE, "kueue")
    assert g["goodput"]["quota_peer"] == 0.874  # ours stands in for kueue
    assert g["p95_wait"]["best_policy"] == "slurm"
    assert g["least_served"]["best_policy"] == "priority"
    assert not g["lost"]["met"]  # 800 > half of ours' 190
    fifo = judge(REFERENCE, "fifo")
    assert fifo["goodput"]["met"] and fifo["least_served"]["met"]


def test_the_proposed_readings_change_only_the_peers_and_goal_4s_floor():
    m = {
        "fifo": numbers(0.90, 10, 20, 0),  # ignores tiers: best p95, no longer a peer
        "priority": numbers(0.85, 40, 30, 0),  # best least-served, no longer a peer
        "kueue": numbers(0.89, 25, 60, 0),  # loses nothing
        "slurm": numbers(0.88, 20, 50, 0),
        "preemptible": numbers(0.90, 22, 55, 49.9, delivered_gpu_h=50_000),
    }
    written, read = judge(m), judge(m, reading=PROPOSED)
    assert written["goodput"] == read["goodput"]
    assert written["p95_wait"]["best_policy"] == "fifo" and not written["p95_wait"]["met"]
    assert read["p95_wait"]["best_policy"] == "slurm" and read["p95_wait"]["met"]  # 22 / 20
    assert written["least_served"]["best_policy"] == "priority"
    assert not written["least_served"]["met"]
    assert read["least_served"]["best_policy"] == "slurm" and read["least_served"]["met"]
    # 49.9 GPU-h is under 0.1% of 50,000: within the floor, though kueue lost nothing.
    assert not written["lost"]["met"] and read["lost"]["met"] and read["lost"]["excess"] < 0
    assert not written["all"]["met"] and read["all"]["met"]
    m["preemptible"] = numbers(0.90, 22, 55, 50, delivered_gpu_h=50_000)
    assert not judge(m, reading=PROPOSED)["lost"]["met"]  # 0.1% is not under
    # kueue judged: its peers are the others that the reading names, ours among them.
    kueue = judge(m, "kueue", PROPOSED)
    assert kueue["least_served"]["best_policy"] == "slurm"
    assert kueue["p95_wait"]["best_policy"] == "slurm"


def test_counts_and_worst_draws():
    better = dict(REFERENCE, preemptible=numbers(0.92, 20, 100, 10))
    draws = [
        draw_report(str(s), small(s), m) for s, m in ((1, REFERENCE), (2, better), (3, REFERENCE))
    ]
    c = counts(draws)
    assert c["preemptible"] == {
        "goodput": 1,
        "p95_wait": 1,
        "least_served": 1,
        "lost": 3,
        "all": 1,
    }
    assert clause_counts(draws) == {
        "goodput": {"vs_quota_peer": 1, "vs_best": 1},
        "lost": {"under_1pct": 3, "vs_quota_peer": 3},
    }
    assert [d["seed"] for d in worst(draws, "p95_wait")] == [1, 3, 2]  # ties by seed


def test_lost_work_by_rule_and_what_it_buys_where_only_kueues_half_is_missed():
    def draw(seed, ours_goodput, kueue_lost, by_kind):
        metrics = dict(REFERENCE, kueue=numbers(0.80, 47.0, 9.0 * 24, kueue_lost))
        ours = numbers(ours_goodput, 42.6, 8.9 * 24, sum(by_kind.values()))
        metrics["preemptible"] = ours | {"offered_gpu_h": 10_000.0, "lost_gpu_h_by_kind": by_kind}
        return draw_report(str(seed), small(seed), metrics)

    draws = [
        draw(1, 0.90, 0.0, {"beyond_limit": 80.0, "loan": 20.0}),  # kueue lost nothing
        draw(2, 0.85, 300.0, {"beyond_limit": 50.0, "loan": 50.0}),  # goal 4 met
        draw(3, 0.81, 10.0, {"beyond_limit": 0.0, "loan": 50.0}),
        draw(4, 0.95, 0.0, {"beyond_limit": 600.0, "loan": 0.0}),  # 1.2% of delivered
    ]
    assert [d["goals"]["lost"]["met"] for d in draws] == [False, True, False, False]
    assert lost_by_kind(draws) == {
        "beyond_limit": (730.0, 680.0),
        "loan": (120.0, 70.0),
    }
    # 10 points of 10,000 GPU-h for 100 lost; 1 point for 50; draw 4 misses the 1% bound too.
    assert gain_per_lost(draws) == pytest.approx({"1": 10.0, "3": 2.0})


def test_the_ceiling_counts_a_draw_when_one_candidate_meets_all_four():
    # Draw 1: the reference table with fifo's p95 doubled: only a variant meets all four.
    # Draw 2: no variant meets the goodput goal, and fifo, judged as ours is, meets all four.
    slow_fifo = dict(REFERENCE, fifo=numbers(0.913, 61.8, 39.1, 0))
    better = dict(slow_fifo, preemptible=numbers(0.92, 20, 100, 10))
    fifo_wins = {
        "fifo": numbers(0.95, 10, 20, 0),
        "priority": numbers(0.90, 50, 30, 0),
        "kueue": numbers(0.90, 40, 40, 100),
        "slurm": numbers(0.91, 30, 50, 0),
        "preemptible": numbers(0.80, 40, 25, 10),
    }
    run = [draw_report(str(s), small(s), m) for s, m in ((1, slow_fifo), (2, fifo_wins))]
    variant = [
        draw_report("1", small(1), better),
        draw_report("2", small(2), fifo_wins),
    ]
    result = ceiling({"ours": run, "variant": variant})
    assert result["candidates"] == ["fifo", "priority", "kueue", "slurm", "ours", "variant"]
    assert result["per_draw"] == {"1": ["variant"], "2": ["fifo"]}
    assert result["met"]["all"] == 2 and result["met"]["least_served"] == 2
    assert ceiling({"ours": run})["per_draw"] == {"1": [], "2": ["fifo"]}
    with pytest.raises(ValueError, match="lacks draw 2"):
        ceiling({"ours": run, "variant": variant[:1]})


# --- a real replay ---------------------------------------------------------------------------


def test_one_tiny_draw_under_all_five_policies():
    k = small(9, 150)
    metrics = {p: replay(k, p) for p in (*BASELINES, OURS)}
    report = draw_report("9", k, metrics)
    assert report["summary"] == k.summary() and report["knobs"]["jobs"] == 150
    ours, kueue = metrics["preemptible"], metrics["kueue"]
    assert ours["demand_ratio"] == pytest.approx(k.load, rel=1e-3)
    assert all(m["jobs"] == 150 for m in metrics.values())
    baselines = [metrics[p] for p in BASELINES]
    best_goodput = max(m["goodput"] for m in baselines)
    goals = report["goals"]
    assert goals["goodput"]["met"] == (
        ours["goodput"] >= max(kueue["goodput"], best_goodput - 0.02)
    )
    best_p95 = min(max(m["p95_wait_s"], 60) for m in baselines)
    assert goals["p95_wait"]["met"] == (max(ours["p95_wait_s"], 60) <= 1.1 * best_p95)
    tiered = [metrics[p]["least_served_max_wait_s"] for p in ("priority", "kueue", "slurm")]
    assert goals["least_served"]["met"] == (
        max(ours["least_served_max_wait_s"], 60) <= 1.1 * max(min(tiered), 60)
    )
    assert goals["lost"]["met"] == (
        ours["lost_gpu_h"] < 0.01 * ours["delivered_gpu_h"]
        and ours["lost_gpu_h"] <= 0.5 * kueue["lost_gpu_h"]
    )


def test_the_command_replays_named_draws_and_writes_json(tmp_path):
    out = tmp_path / "family.json"
    cmd = [sys.executable, str(BENCHMARK), "--only", "4,2", "--jobs", "120", "--workers", "2"]
    done = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "draw 4 done" in done.stderr and "draw 2 done" in done.stderr
    assert "--only" in done.stdout and "all four" in done.stdout
    report = json.loads(out.read_text())
    assert [d["seed"] for d in report["draws"]] == [4, 2]
    assert set(report["counts"]) == {"fifo", "priority", "kueue", "slurm", "preemptible"}
    assert report["proposed_counts"]["preemptible"]["all"] >= 0
    assert "under the readings proposed" in done.stdout


def test_a_rule_switched_off_replays_ours_only_against_saved_baselines(tmp_path):
    out = tmp_path / "family.json"
    cmd = [sys.executable, str(BENCHMARK), "--only", "4,2", "--jobs", "120", "--workers", "2"]
    first = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert first.returncode == 0, first.stderr
    variant = [*cmd, "--baselines", str(out), "--switch", "loan_backfill=false"]
    again = subprocess.run(
        [*variant, "--json", str(tmp_path / "v.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "2 draws x 1 policies on 2 workers --switch loan_backfill=false" in again.stdout
    assert "--only 4 --jobs 120 --switch loan_backfill=false" in again.stdout  # replayable
    before = {d["seed"]: d["policies"] for d in json.loads(out.read_text())["draws"]}
    after = {
        d["seed"]: d["policies"] for d in json.loads((tmp_path / "v.json").read_text())["draws"]
    }
    for seed in (4, 2):
        assert all(
            after[seed][p] == before[seed][p] for p in ("fifo", "priority", "kueue", "slurm")
        )
    best_of = subprocess.run(
        [sys.executable, str(BENCHMARK), "--ceiling", str(out), str(tmp_path / "v.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert best_of.returncode == 0, best_of.stderr
    assert "the best of 6 policies per draw" in best_of.stdout and "draw   4:" in best_of.stdout
    for bad in (
        ["--switch", "loans=false"],
        ["--baselines", str(tmp_path / "none.json")],
        ["--ceiling", str(tmp_path / "none.json")],
        ["--ceiling", str(out), str(out)],
    ):
        done = subprocess.run([*cmd, *bad], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert done.returncode == 2 and "error:" in done.stderr, done.stderr


def test_the_command_replays_the_held_out_workload_beside_its_reported_numbers():
    cmd = [sys.executable, str(BENCHMARK), "--held-out", "--jobs", "120", "--workers", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "the held-out workload, seed 0" in done.stdout
    assert "91.3%, 30.9h, 39.1h, 18.0h, 0" in done.stdout  # the reference table's fifo row
    assert "all four" not in done.stdout  # one draw: no counts
    cmd[3:3] = ["0,1"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "seed 1" in done.stdout and "--held-out 1" in done.stdout


def test_bad_arguments_are_refused(tmp_path):
    for args in (["--only", "x"], ["--draws", "0"], ["--jobs", "0"], ["--held-out", "-1"]):
        done = subprocess.run(
            [sys.executable, str(BENCHMARK), *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, args
