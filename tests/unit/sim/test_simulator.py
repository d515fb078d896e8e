import json
from pathlib import Path

import pytest

from preemptible.errors import TraceFormatError
from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim import SimOptions, Simulator, TraceJob, read_trace, summarize, write_trace
from preemptible.sim.importers import (
    import_trace,
    offered_gpus,
    quota_shortfalls,
    suggest_config,
)
from preemptible.sim.synth import generate

DATA = Path(__file__).parent / "data"
SHARED = Path(__file__).parents[3].parent / "shared" / "traces"
EXPECTED = json.loads((DATA / "expected_ranges.json").read_text())
SCHEMA_KEYS = {
    "jobs",
    "p95_wait_s",
    "max_wait_s",
    "mean_jct_s",
    "p95_jct_s",
    "utilization",
    "goodput",
    "preemptions",
    "preemptions_per_hour",
    "lost_gpu_s",
    "lost_gpu_s_per_preemption",
}


@pytest.mark.parametrize("policy", sorted(k for k in EXPECTED if not k.startswith("_")))
def test_small_trace_metrics_stay_in_their_ranges(small_report, policy):
    overall = small_report["policies"][policy]["overall"]
    bands = {k: v for k, v in EXPECTED[policy].items() if not k.startswith("_")}
    for key, (lo, hi) in bands.items():
        assert lo <= overall[key] <= hi, f"{policy} {key} = {overall[key]} not in [{lo}, {hi}]"


def test_the_derived_bounds_of_the_ranges_match_the_trace(small_trace, small_config):
    # The goodput ceiling of expected_ranges.json comes from the trace: no schedule ends before
    # the latest submit + duration, so goodput <= work / (gpus x that horizon).
    derived = EXPECTED["_derived"]
    jobs = read_trace(small_trace)
    work = sum(j.gpus * j.duration_s for j in jobs)
    first = min(j.submit_s for j in jobs)
    horizon = max(max(j.submit_s + j.duration_s for j in jobs) - first, work / derived["gpus"])
    assert parse_config_text(small_config.read_text()).cluster.gpus == derived["gpus"]
    assert work == pytest.approx(derived["work_gpu_s"])
    assert horizon == pytest.approx(derived["shortest_horizon_s"])
    ceiling = work / (derived["gpus"] * horizon)
    assert derived["goodput_ceiling"] == pytest.approx(ceiling, abs=0.001)
    for policy, bands in EXPECTED.items():
        if not policy.startswith("_"):
            assert bands["goodput"][1] == derived["goodput_ceiling"], policy


def test_every_job_completes_and_accounting_adds_up(small_report, small_trace):
    n = len(read_trace(small_trace))
    for name, metrics in small_report["policies"].items():
        overall, queues = metrics["overall"], metrics["queues"]
        assert overall["jobs"] == n == sum(q["jobs"] for q in queues.values()), name
        assert overall["utilization"] == pytest.approx(
            sum(q["utilization"] for q in queues.values())
        )
        assert 0 <= overall["goodput"] <= overall["utilization"] <= 1
        assert overall["max_wait_least_served_s"] == max(q["max_wait_s"] for q in queues.values())


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_lost_work_is_what_each_job_held_beyond_its_own_work(small_trace, small_config, policy):
    # Every GPU-second a job held is its own work or lost (unsaved work, a save after a notice,
    # a restore), so lost work and goodput in the ranges are exact, not estimates.
    cfg = parse_config_text(small_config.read_text())
    options = SimOptions(cycle_interval_s=10.0, default_checkpoint_s=60.0)  # as run_sim's defaults
    result = Simulator(read_trace(small_trace), cfg, POLICIES[policy], options).run()
    for r in result.records:
        held = r.trace.gpus * sum(end - start for start, end in r.runs)
        own = r.trace.gpus * r.trace.duration_s
        assert held - own == pytest.approx(r.lost_gpu_s, abs=1e-6), r.trace.job_id


def test_same_trace_twice_gives_identical_output(small_trace, small_config):
    from preemptible.cli.sim import run_sim

    def strip(report):
        for metrics in report["policies"].values():
            metrics["overall"].pop("sim_seconds")
        return report

    first = run_sim(trace=small_trace, config=small_config, policy="all")
    second = run_sim(trace=small_trace, config=small_config, policy="all")
    assert json.dumps(strip(first), sort_keys=True) == json.dumps(strip(second), sort_keys=True)


def _job(job_id, submit, duration, gpus=1, queue="a", tier="normal", ckpt=None):
    return TraceJob(
        job_id=job_id,
        submit_s=submit,
        duration_s=duration,
        gpus=gpus,
        queue=queue,
        tier=tier,
        checkpoint_s=ckpt,
    )


CFG = parse_config_text(
    "[cluster]\ngpus = 2\n[preemption]\nmin_runtime = '5m'\n"
    "[[queues]]\nname = 'a'\nnominal = { gpus = 2 }\n"
)


@pytest.mark.parametrize(
    ("mode", "at", "lost"),
    [
        ("aware", 4600, 2 * 100.0),
        ("periodic", 4600, 1000.0 + 100.0),  # last periodic checkpoint at 3600 s
        ("periodic", 1000, 1000.0),  # before the first: nothing to restore, it starts over
    ],
    ids=[
        "aware-loses-save-and-restore",
        "periodic-loses-work-since-checkpoint-and-restore",
        "periodic-before-any-checkpoint-loses-the-work-only",
    ],
)
def test_preemption_costs_depend_on_checkpointing(mode, at, lost):
    jobs = [_job("low", 0, 10_000, tier="low", ckpt=100.0), _job("high", at, 600, tier="high")]
    opts = SimOptions(checkpoint_mode=mode, checkpoint_interval_s=1800.0, cycle_interval_s=0.0)
    cfg = parse_config_text(  # the notice at the high job's arrival: no tier patience
        "[cluster]\ngpus = 1\n[preemption]\ntier_patience = 0\n"
        "[[queues]]\nname = 'a'\nnominal = { gpus = 1 }\n"
    )
    result = Simulator(jobs, cfg, POLICIES["preemptible"], opts).run()
    low = next(r for r in result.records if r.trace.job_id == "low")
    assert (low.preemptions, low.moves) == (1, 0)
    assert low.lost_gpu_s == pytest.approx(lost)
    # the victim finishes all its work: duration plus what it lost and re-did
    assert low.admitted_gpu_s == pytest.approx(10_000 + lost, rel=1e-6)


NONE_BY_KIND = dict.fromkeys(("tier", "reclaim", "beyond_limit", "loan", "move"), 0)


def test_lost_work_is_counted_apart_by_the_rule_that_sent_the_notice():
    # Two GPUs, nominal 1 each. b borrows a's GPU at 0 and a's job, within its nominal quota,
    # reclaims it (after its patience). Later a critical job of b preempts one of b's own
    # normal-tier jobs. Each victim saves 50 s and restores 50 s.
    cfg = parse_config_text(
        "[cluster]\ngpus = 2\n[preemption]\ntier_patience = 0\nmin_runtime = 0\n"
        "[[queues]]\nname = 'a'\nnominal = { gpus = 1 }\n"
        "[[queues]]\nname = 'b'\nnominal = { gpus = 1 }\n"
    )
    jobs = [
        _job("b1", 0, 20_000, queue="b", ckpt=50.0),
        _job("b2", 0, 20_000, queue="b", ckpt=50.0),
        _job("a-owed", 100, 1000, queue="a", ckpt=50.0),
        _job("b-critical", 5000, 1000, queue="b", tier="critical", ckpt=50.0),
    ]
    result = Simulator(jobs, cfg, POLICIES["preemptible"], SimOptions(cycle_interval_s=0.0)).run()
    logged = sorted((at, kind) for r in result.records for at, _, kind in r.lost_log)
    assert [kind for _, kind in logged] == ["reclaim", "tier"]
    assert logged[0][0] < 5000 <= logged[1][0]
    summary = summarize(result)
    overall = summary["overall"]
    assert overall["preemptions_by_kind"] == {**NONE_BY_KIND, "reclaim": 1, "tier": 1}
    assert overall["lost_gpu_s_by_kind"] == pytest.approx(
        {**NONE_BY_KIND, "reclaim": 100.0, "tier": 100.0}
    )
    assert sum(overall["lost_gpu_s_by_kind"].values()) == pytest.approx(overall["lost_gpu_s"])
    assert summary["queues"]["b"]["preemptions_by_kind"] == overall["preemptions_by_kind"]
    assert summary["queues"]["a"]["preemptions_by_kind"] == NONE_BY_KIND


def _on_two_nodes(jobs, policy: str):
    """`jobs` on two 8-GPU nodes, one queue, a cycle at every event."""
    cfg = parse_config_text(
        "[cluster]\ngpus = 16\nnodes = 2\ngpus_per_node = 8\n"
        "[[queues]]\nname = 'a'\nnominal = { gpus = 16 }\n"
    )
    return Simulator(jobs, cfg, POLICIES[policy], SimOptions(cycle_interval_s=0.0)).run()


def test_small_jobs_move_off_a_node_and_a_gang_starts_on_it():
    # Two nodes of 8. At 1000 s the 5-GPU job on node 0 ends, leaving 5 free there beside three
    # 1-GPU jobs and 3 free on node 1 beside a 5-GPU job: 8 free, no block of 8. Ours moves the
    # three to node 1 (each saves 20 s and restores 20 s) and the gang starts on node 0.
    jobs = [
        _job("a5", 0, 1000, gpus=5, ckpt=20.0),
        _job("b5", 0, 50_000, gpus=5, ckpt=20.0),
        *(_job(f"s{i}", 1, 50_000, ckpt=20.0) for i in range(3)),
        _job("gang", 1000, 3600, gpus=8, ckpt=20.0),
    ]
    result = _on_two_nodes(jobs, "preemptible")
    records = {r.trace.job_id: r for r in result.records}
    overall = summarize(result)["overall"]
    assert (overall["preemptions"], overall["moves"]) == (3, 3)
    assert overall["preemptions_by_kind"] == {**NONE_BY_KIND, "move": 3}
    assert overall["lost_gpu_s_by_kind"] == pytest.approx({**NONE_BY_KIND, "move": 3 * 40.0})
    for i in range(3):
        small = records[f"s{i}"]
        assert small.preemptions == small.moves == 1
        assert small.lost_gpu_s == pytest.approx(20.0 + 20.0)
        assert [start for start, _ in small.runs] == [1.0, 1020.0]  # back after its save
    assert records["gang"].wait_s == pytest.approx(20.0)
    # kueue does not move: the gang waits for node 1's long jobs or the small ones to end.
    records = {r.trace.job_id: r for r in _on_two_nodes(jobs, "kueue").records}
    assert records["gang"].wait_s > 40_000
    assert all(records[f"s{i}"].preemptions == 0 for i in range(3))


def test_a_moved_job_restarts_on_the_place_held_for_it_not_on_the_node_it_left():
    # Two jobs move off node 0 with saves of 10 s and 100 s. The first is back after 10 s,
    # when node 0 is its best fit again: it must take the GPUs held for it on node 1.
    jobs = [
        _job("a4", 0, 2000, gpus=4, ckpt=10.0),
        _job("ma", 0.1, 50_000, gpus=2, ckpt=10.0),
        _job("mb", 0.2, 50_000, gpus=2, ckpt=100.0),
        _job("w1", 0.3, 50_000, tier="high", ckpt=10.0),
        _job("gang", 2000, 3600, gpus=8, ckpt=10.0),
    ]
    records = {r.trace.job_id: r for r in _on_two_nodes(jobs, "preemptible").records}
    assert records["gang"].wait_s == pytest.approx(100.0)  # the slower save
    assert records["ma"].preemptions == records["mb"].preemptions == 1


def test_utilisation_does_not_depend_on_the_order_jobs_are_given_in():
    jobs = [_job("late", 1000, 1000), _job("early", 0, 1000)]
    cfg = parse_config_text("[cluster]\ngpus = 1\n[[queues]]\nname = 'a'\nnominal = { gpus = 1 }\n")
    result = summarize(Simulator(jobs, cfg, POLICIES["fifo"]).run())["overall"]
    assert result["utilization"] == pytest.approx(1.0)


def test_unknown_queue_in_trace_is_a_clear_error():
    with pytest.raises(TraceFormatError, match=r"queue .zzz.*add a \[\[queues\]\] entry"):
        Simulator([_job("x", 0, 10, queue="zzz")], CFG, POLICIES["fifo"])


def test_job_larger_than_cluster_is_a_clear_error():
    with pytest.raises(TraceFormatError, match="more than the whole cluster"):
        Simulator([_job("x", 0, 10, gpus=3)], CFG, POLICIES["fifo"])


def test_missing_column_names_column_and_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_s,duration_s,gpus,queue\n1,0,10,1,a\n")
    with pytest.raises(TraceFormatError, match=r"bad\.csv: missing column 'tier'"):
        read_trace(bad)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("1,0,ten,1,a,normal", "'duration_s': 'ten' is not a number"),
        ("1,0,10,1.5,a,normal", "'gpus': 1.5 is not a whole number"),
        ("1,0,10,1,a,urgent", "'tier': 'urgent'"),
        ("1,-5,10,1,a,normal", "'submit_s'"),
        ("1,0,10,1,,normal", "'queue' is empty"),
    ],
    ids=["not-a-number", "fractional-gpus", "bad-tier", "negative", "no-queue"],
)
def test_bad_values_name_line_and_column(tmp_path, row, message):
    bad = tmp_path / "t.csv"
    bad.write_text("job_id,submit_s,duration_s,gpus,queue,tier\n" + row + "\n")
    with pytest.raises(TraceFormatError, match=r"t\.csv:2: .*" + message.replace("(", r"\(")):
        read_trace(bad)


def test_trace_round_trips(tmp_path):
    jobs = generate(jobs=50, gpus=16, seed=3)
    write_trace(tmp_path / "t.csv", jobs)
    assert read_trace(tmp_path / "t.csv") == sorted(jobs, key=lambda j: j.submit_s)


def test_synthetic_generator_is_deterministic_and_mixed():
    a, b = generate(jobs=400, gpus=64, seed=5), generate(jobs=400, gpus=64, seed=5)
    assert a == b and len(a) == 400
    assert generate(jobs=400, gpus=64, seed=6) != a
    shapes = {j.gpus for j in a}
    assert {1, 8} <= shapes
    assert {j.tier for j in a} >= {"low", "normal"}
    assert len({j.queue for j in a}) == 3
    load = sum(j.gpus * j.duration_s for j in a) / (64 * (a[-1].submit_s - a[0].submit_s))
    assert 0.8 < load < 2.0


@pytest.mark.skipif(
    not (SHARED / "tiresias" / "60_job.csv").exists(), reason="shared traces absent"
)
def test_importer_converts_a_public_trace_and_sizes_a_cluster():
    imported = import_trace(SHARED / "tiresias" / "60_job.csv", teams=3)
    assert imported.layout == "tiresias" and len(imported.jobs) == 60
    assert imported.jobs[0].submit_s == 0.0
    assert {j.queue for j in imported.jobs} <= {"team-a", "team-b", "team-c"}
    cfg = parse_config_text(suggest_config(imported.jobs))
    assert cfg.cluster.gpus >= max(j.gpus for j in imported.jobs)
    assert cfg.cluster.gpus >= offered_gpus(imported.jobs)
    result = Simulator(imported.jobs, cfg, POLICIES["preemptible"]).run()
    assert summarize(result)["overall"]["jobs"] == 60


def _two_queues(nominal_a: int, nominal_b: int):
    return parse_config_text(
        "[cluster]\ngpus = 16\n"
        f"[[queues]]\nname = 'a'\nweight = 1\nnominal = {{ gpus = {nominal_a} }}\n"
        f"[[queues]]\nname = 'b'\nweight = 1\nnominal = {{ gpus = {nominal_b} }}\n"
    )


def test_quota_shortfalls_name_queues_whose_jobs_exceed_their_nominal_quota():
    jobs = [
        TraceJob(job_id=str(i), submit_s=0, duration_s=60, gpus=g, queue=q)
        for i, (g, q) in enumerate([(8, "a"), (6, "a"), (4, "a"), (12, "b"), (1, "b")])
    ]
    (found,) = quota_shortfalls(jobs, _two_queues(4, 12))
    assert (found.queue, found.jobs, found.largest_gpus, found.nominal_gpus) == ("a", 2, 8, 4)
    assert "a has 2 jobs of up to 8 GPUs" in found.describe()
    assert "a nominal quota of 8 or more" in found.describe()
    # Weights only: nothing is guaranteed to anyone, so nothing falls short.
    assert quota_shortfalls(jobs, _two_queues(0, 0)) == []
    assert [f.queue for f in quota_shortfalls(jobs, _two_queues(0, 16))] == ["a"]


def test_chronus_layout_maps_minutes_queues_and_tiers(tmp_path):
    src = tmp_path / "chronus.csv"
    src.write_text(
        "job_id,user,num_gpu,submit_time,iterations,model_name,duration,interval,"
        "expect_time_list,expect_value_list,best_effort,job_type\n"
        "0,vc_x,2,10,1,m,30,1,40,10,0,strict\n"
        "1,vc_y,0,11,1,m,30,1,40,10,0,best\n"
        "2,vc_y,1,12,1,m,30,1,40,10,1,best\n"
    )
    imported = import_trace(src)
    assert imported.dropped == 1
    first, second = imported.jobs
    assert (first.queue, first.tier, first.duration_s, first.submit_s) == ("vc_x", "high", 1800, 0)
    assert (second.queue, second.tier, second.submit_s) == ("vc_y", "low", 120)


def test_unrecognised_layout_is_rejected(tmp_path):
    src = tmp_path / "x.csv"
    src.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="unknown trace layout"):
        import_trace(src)


def test_plots_are_written(tmp_path, small_trace, small_config):
    from preemptible.sim.plots import write_plots

    cfg = parse_config_text(small_config.read_text())
    result = Simulator(read_trace(small_trace), cfg, POLICIES["preemptible"]).run()
    paths = write_plots(result, tmp_path)
    assert len(paths) == 3
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_schema_keys(small_report):
    for metrics in small_report["policies"].values():
        assert metrics["overall"].keys() >= SCHEMA_KEYS
        assert {"max_wait_least_served_s", "sim_seconds"} <= metrics["overall"].keys()
        for q in metrics["queues"].values():
            assert q.keys() >= SCHEMA_KEYS


def test_a_two_gpu_job_is_not_starved_by_a_stream_of_one_gpu_jobs_of_its_own_queue():
    # Eight 1-GPU jobs fill two 4-GPU nodes and overrun the default estimate (4 h); a 2-GPU
    # job then waits behind a stream of 1-GPU jobs of the same queue. Fair share judged "with
    # the job admitted", sized by the job, put every 1-GPU job that had aged past the aging cap
    # ahead of it, for as long as the stream lasted (437 h). Within a queue, age decides.
    cfg = parse_config_text(
        "[cluster]\ngpus = 8\nnodes = 2\ngpus_per_node = 4\n"
        "[[queues]]\nname = 'a'\nnominal = { gpus = 8 }\n"
    )
    hour = 3600.0
    jobs = [_job(f"fill{i}", 0.0, 5 * hour + i * 600.0) for i in range(8)]
    jobs.append(_job("pair", 60.0, hour, gpus=2))
    jobs += [_job(f"s{i:03d}", 120.0 + i * 300.0, 6 * hour) for i in range(48 * 12)]
    result = Simulator(jobs, cfg, POLICIES["preemptible"], SimOptions(cycle_interval_s=0.0)).run()
    pair = next(r for r in result.records if r.trace.job_id == "pair")
    # The fill jobs on one node end between 5 h and 5.5 h: the pair starts by then.
    assert pair.wait_s <= 6 * hour, pair.wait_s / hour


@pytest.mark.parametrize(
    ("limit", "longest_h"), [("1d", (24, 26)), (0, (48, 400))], ids=["1d-limit", "no-limit"]
)
def test_a_burst_above_its_queues_share_waits_no_longer_than_the_starvation_limit(limit, longest_h):
    # Team a used the whole cluster alone for three weeks, so its decayed usage stays above its
    # share for days (7-day half-life); b then keeps the cluster full while a bursts. Past the
    # limit a's oldest job goes first whatever a's share; without one, a waits until its usage
    # has decayed below its share (110 h here).
    cfg = parse_config_text(
        "[cluster]\ngpus = 4\n"
        f"[policy]\nstarvation_limit = {limit!r}\n"
        "[[queues]]\nname = 'a'\n[[queues]]\nname = 'b'\n"
    )
    hour = 3600.0
    start = 500 * hour
    jobs = [_job(f"a-old{i}", 0.0, start, queue="a") for i in range(4)]
    jobs += [_job(f"a-burst{i}", start + 60.0, hour, queue="a") for i in range(4)]
    b_from = start - hour  # b's backlog has formed when the burst arrives
    jobs += [_job(f"b{i:04d}", b_from + i * 450.0, hour, queue="b") for i in range(8 * 24 * 4)]
    result = Simulator(jobs, cfg, POLICIES["preemptible"]).run()
    burst = [r.wait_s / hour for r in result.records if r.trace.job_id.startswith("a-burst")]
    lo, hi = longest_h
    assert lo <= max(burst) <= hi, burst
