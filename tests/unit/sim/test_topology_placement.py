"""GPU ids within nodes in the simulator (`--node-topology`, `--placement`, `--split-slowdown`):
each number of the hand-built trace is worked out in the comments beside it from the rules of
docs/evaluation/simulator.md, "GPU placement within nodes"."""

import json
import math

import pytest

from preemptible.errors import ConfigError
from preemptible.queue.core import POLICIES, Cluster, parse_config_text
from preemptible.sim import SimOptions, Simulator, TraceJob, read_trace, summarize
from preemptible.sim.failures import FailureKind, FailureRates
from preemptible.sim.gpu_ids import GpuIds, JobGpus, NodeTopology, PlacementMode

from .test_failures import countdowns  # noqa: F401  (a fixture)

TIERS = ("high", "normal", "normal")
ISLAND_KEYS = {
    "jobs_split",
    "jobs_split_share",
    "jobs_split_needlessly",
    "split_gpu_s",
    "slowdown_lost_gpu_s",
}


def _job(job_id, duration, *, submit=0.0, gpus=2, min_gpus=None, tier="normal"):
    return TraceJob(
        job_id=job_id,
        submit_s=submit,
        duration_s=duration,
        gpus=gpus,
        queue="a",
        tier=tier,
        checkpoint_s=60.0,
        min_gpus=min_gpus,
    )


def _config(nodes=1, per_node=8):
    return parse_config_text(
        f"[cluster]\ngpus = {nodes * per_node}\nnodes = {nodes}\ngpus_per_node = {per_node}\n"
        f"[[queues]]\nname = 'a'\nnominal = {{ gpus = {nodes * per_node} }}\n"
    )


# a and b (2 GPUs each) take GPUs 0-1 and 2-3 at 0, the first island; b is done at 100 and
# leaves 2-3 free beside the whole second island 4-7. c (4 GPUs) comes at 200: the lowest free
# ids are 2-5, over both islands; placed by topology it gets the whole second island, 4-7.
HOLE = [_job("a", 1000.0), _job("b", 100.0), _job("c", 1000.0, submit=200.0, gpus=4)]


def _run(jobs, layout, *, policy="fifo", cfg=None, **options):
    options = SimOptions(node_topology=layout, **options)
    result = Simulator(jobs, cfg or _config(), POLICIES[policy], options).run()
    return {r.trace.job_id: r for r in result.records}, summarize(result)["overall"]


def _layout(placement="topology", slowdown=0.0):
    return NodeTopology(
        islands=2,
        gpus_per_island=4,
        placement=PlacementMode(placement),
        split_slowdown=slowdown,
    )


def test_lowest_ids_split_the_4_gpu_job_and_topology_does_not():
    low, low_overall = _run(HOLE, _layout("lowest"))
    top, top_overall = _run(HOLE, _layout("topology"))
    assert [r.gpu_ids.split_placements for r in low.values()] == [0, 0, 1]
    assert [r.gpu_ids.split_placements for r in top.values()] == [0, 0, 0]
    # three multi-GPU jobs; c spans two islands where its 4 GPUs need one: needlessly split
    assert (low_overall["jobs_split"], low_overall["jobs_split_needlessly"]) == (1, 1)
    assert low_overall["jobs_split_share"] == pytest.approx(1 / 3)
    assert low_overall["split_gpu_s"] == 4 * 1000.0  # c's 4 GPUs from 200 to 1200
    assert (top_overall["jobs_split"], top_overall["split_gpu_s"]) == (0, 0.0)
    # Idle GPU-seconds (free GPUs x time) and those in partly used islands:
    #   0-100     a, b on 0-3: 4 idle, in the whole free second island       -> 400, 0
    #   100-200   2-3 free in the first island, 4-7 whole                     -> 600, 200
    #   200-1000  lowest: 6-7 free in a partly used island; topology: 2-3     -> 1600, 1600
    #   1000-1200 a done; lowest: 0-1 and 6-7, both partly used islands       -> 800, 800
    #             topology: the first island whole again                      -> 800, 0
    assert low_overall["island_fragmentation"] == pytest.approx(2600 / 3400)
    assert top_overall["island_fragmentation"] == pytest.approx(1800 / 3400)


def test_a_split_job_runs_exactly_1_plus_f_times_longer():
    low, low_overall = _run(HOLE, _layout("lowest", slowdown=0.5))
    top, top_overall = _run(HOLE, _layout("topology", slowdown=0.5))
    assert low["c"].runs == [(200.0, 200.0 + 1.5 * 1000.0)]  # split: 1000 s of work in 1500
    assert top["c"].runs == [(200.0, 1200.0)]
    assert low["a"].end_s == top["a"].end_s == 1000.0  # a is in one island under both
    assert low["c"].gpu_ids.split_gpu_s == 4 * 1500.0
    # the 500 s of its 4 GPUs beyond its work did none: lost, and goodput counts it so
    assert low["c"].gpu_ids.slowdown_lost_gpu_s == pytest.approx(4 * 500.0)
    assert low_overall["slowdown_lost_gpu_s"] == pytest.approx(2000.0)
    held = 2 * 1000.0 + 2 * 100.0 + 4 * 1500.0  # a, b, c
    assert low_overall["goodput"] == pytest.approx((held - 2000.0) / (8 * 1700.0))
    assert top_overall["goodput"] == pytest.approx((2 * 1000.0 + 2 * 100.0 + 4000.0) / 9600.0)


def test_a_split_job_checkpoints_less_work_per_interval(countdowns):  # noqa: F811
    # c crashes after 450 s of running (1800 GPU-seconds on 4 GPUs), at 650. Checkpoints every
    # 100 s of its run saved 400 s of running, 400 / 1.5 of work. It restarts after its 10 s
    # back-off at 660 on 2-5 again (a still holds 0-1), restores for 60 s and runs the rest
    # of its work 1.5 times slower: 660 + 60 + (1000 - 400 / 1.5) x 1.5 = 1820.
    countdowns[("c", FailureKind.CRASH)] = [4 * 450.0]
    rates = FailureRates(crashes_per_1000_gpu_h=1.0, seed=1)
    low, _ = _run(
        HOLE, _layout("lowest", slowdown=0.5), failures=rates, checkpoint_interval_s=100.0
    )
    assert low["c"].runs == [(200.0, 650.0), (660.0, pytest.approx(1820.0))]
    assert low["c"].gpu_ids.split_placements == 2


def test_an_elastic_job_grows_into_its_island_and_keeps_it_when_it_shrinks():
    ids = GpuIds(1, _layout(), start_s=0.0)
    job, other = JobGpus(), JobGpus()
    ids.place(other, ((0, 1),), 0.0)  # GPU 0
    ids.place(job, ((0, 2),), 0.0)  # best fit: the first island, 1-2
    assert (other.ids, job.ids) == ({0: [0]}, {0: [1, 2]})
    ids.resize(job, ((0, 5),), 10.0)  # grows near what it holds: 3, then the other island
    assert job.ids == {0: [1, 2, 3, 4, 5]} and job.split
    assert not ids.kept_split(job, ((0, 3),))  # a shrink to 3 keeps 1-3, its fullest island
    ids.resize(job, ((0, 3),), 20.0)
    assert job.ids == {0: [1, 2, 3]} and not job.split
    assert ids.free == [{4, 5, 6, 7}]
    assert not ids.frees_an_island(job) and not ids.frees_an_island(other)  # each leaves one
    ids.release(other, 30.0)
    assert ids.frees_an_island(job)  # now its going frees the whole first island
    assert (job.placements, job.split_placements) == (3, 1)


def test_ids_follow_the_cores_counts_through_resizes_moves_and_failures(monkeypatch):
    """Before every cycle each node has as many free ids as the core has free GPUs there, and
    at the end every id is free again."""
    jobs = [
        _job(f"j{k}", 3000.0 + 97 * k, submit=50.0 * k, gpus=8, min_gpus=2) for k in range(20)
    ] + [
        _job(f"s{k}", 900.0, submit=50.0 * k + 7, gpus=1 + k % 4, tier=TIERS[k % 3])
        for k in range(20)
    ]
    rates = FailureRates(crashes_per_1000_gpu_h=100.0, hangs_per_1000_gpu_h=50.0, seed=2)
    checked = []
    rank = Simulator._rank_victims

    def check_then_rank(sim):
        checked.append([len(f) for f in sim.gpu_ids.free] == sim.state.pool.free)
        rank(sim)

    monkeypatch.setattr(Simulator, "_rank_victims", check_then_rank)
    for placement in ("topology", "lowest"):
        sim = Simulator(
            jobs,
            _config(nodes=2),
            POLICIES["preemptible"],
            SimOptions(node_topology=_layout(placement, 0.3), failures=rates),
        )
        overall = summarize(sim.run())["overall"]
        assert overall["shrinks"] and overall["grows"] and overall["preemptions"]
        assert overall["crashes"] and overall["hangs"]
        assert checked and all(checked)
        assert sim.gpu_ids is not None and sim.gpu_ids.free == [set(range(8))] * 2


# --- no islands, or no slowdown: nothing changes ------------------------------------------------


def _without_keys(overall):
    return {k: v for k, v in overall.items() if k not in ISLAND_KEYS | {"sim_seconds"}}


def _summaries(trace, cfg, policy, layout):
    options = SimOptions(node_topology=layout)
    summary = summarize(Simulator(trace, cfg, POLICIES[policy], options).run())
    summary["overall"].pop("island_fragmentation", None)
    return _without_keys(summary["overall"]), {
        q: _without_keys(m) for q, m in summary["queues"].items()
    }


@pytest.mark.parametrize("policy", list(POLICIES))
def test_absent_knobs_or_lowest_ids_without_slowdown_change_nothing(
    small_trace, small_config, policy
):
    trace = read_trace(small_trace)
    cfg = parse_config_text(small_config.read_text())
    plain = _summaries(trace, cfg, policy, NodeTopology())
    assert _summaries(trace, cfg, policy, NodeTopology.parse(None)) == plain
    assert _summaries(trace, cfg, policy, _layout("lowest")) == plain
    slowed = _summaries(trace, cfg, policy, _layout("lowest", 0.3))
    assert slowed != plain  # the 8-GPU jobs span both islands of a node: they run slower


def test_without_islands_the_report_has_none_of_their_keys(small_report):
    for metrics in small_report["policies"].values():
        assert not ISLAND_KEYS & metrics["overall"].keys()
        assert "island_fragmentation" not in metrics["overall"]
    assert "node_topology" not in small_report


# --- bad knobs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "placement", "slowdown", "message"),
    [
        ("2by4", None, 0.0, "--node-topology takes ISLANDSxGPUS"),
        ("0x8", None, 0.0, "both 1 or more"),
        ("2x4", "best", 0.0, "--placement must be topology or lowest, not 'best'"),
        (None, "lowest", 0.0, "--placement needs --node-topology"),
        (None, None, 0.3, "--split-slowdown needs --node-topology"),
        ("2x4", None, -0.1, "--split-slowdown must be 0 or more"),
        ("2x4", None, math.nan, "--split-slowdown must be 0 or more"),
    ],
)
def test_a_bad_knob_is_refused_with_the_fix(shape, placement, slowdown, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        NodeTopology.parse(shape, placement, slowdown)


def test_islands_that_do_not_make_the_nodes_or_a_cluster_without_nodes_are_refused():
    with pytest.raises(ConfigError, match="2x3 makes 6 GPUs per node, but the configuration's"):
        NodeTopology.parse("2x3").check(Cluster(gpus=16, nodes=2, gpus_per_node=8))
    flat = parse_config_text("[cluster]\ngpus = 8\n[[queues]]\nname = 'a'\n")
    with pytest.raises(ConfigError, match="give a configuration with nodes"):
        Simulator(HOLE, flat, POLICIES["fifo"], SimOptions(node_topology=_layout()))


# --- the command line -------------------------------------------------------------------------


def test_the_cli_prints_and_writes_the_placement_per_policy(tmp_path, small_trace, small_config):
    from .test_cli import run_cli
    from .test_html_report import Page

    out, html = tmp_path / "m.json", tmp_path / "r.html"
    args = ["--trace", str(small_trace), "--config", str(small_config), "--policy", "all"]
    knobs = ["--node-topology", "2x4", "--placement", "lowest", "--split-slowdown", "0.3"]
    proc = run_cli(*args, *knobs, "--json", str(out), "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["node_topology"] == {
        "shape": "2x4",
        "islands_per_node": 2,
        "gpus_per_island": 4,
        "placement": "lowest",
        "split_slowdown": 0.3,
    }
    first_line = " ".join(proc.stdout.split("summary:")[0].split())
    assert "nodes of 2 NVLink islands of 4 GPUs, placement lowest, a split job 1.3x slower" in (
        first_line
    )
    table = proc.stdout.split("GPU placement within nodes")[1]
    cells = Page(html.read_text()).table("islands", "comparison").body()
    for name, metrics in report["policies"].items():
        o = metrics["overall"]
        assert o["jobs_split"] == 21  # the 8-GPU jobs: a node's 8 GPUs span both its islands
        row = next(line for line in table.splitlines() if f" {name} " in line)
        numbers = [c.strip() for c in row.split("│") if c.strip()][1:]
        assert numbers[0] == f"{o['jobs_split']:,}"
        assert numbers[4] == f"{o['slowdown_lost_gpu_s'] / 3600:,.1f}"
        assert numbers[5] == f"{100 * o['island_fragmentation']:.1f}"
        assert float(cells[name][0].value) == o["jobs_split"]
        assert {"jobs_split", "split_gpu_s"} <= metrics["queues"]["team-a"].keys()


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        (["--node-topology", "2x4", "--node-topology", "4x2"], "--node-topology"),
        (["--node-topology", "2x4", "--placement", "a", "--placement", "b"], "--placement"),
        (["--node-topology", "3x4"], "error: --node-topology 3x4 makes 12 GPUs per node"),
        (["--placement", "lowest"], "error: --placement needs --node-topology"),
        (["--node-topology", "2x4", "--split-slowdown", "-1"], "error: --split-slowdown must"),
    ],
)
def test_a_repeated_or_bad_knob_exits_2_with_one_line(small_trace, small_config, knobs, message):
    from .test_cli import run_cli

    args = ["--trace", str(small_trace), "--config", str(small_config), "--policy", "fifo"]
    proc = run_cli(*args, *knobs)
    assert proc.returncode == 2
    assert message in proc.stderr
