"""Crashes and hangs in the simulator: each number of the hand-built traces is worked out in the
comments beside it from the rules of docs/evaluation/simulator.md, with the failures placed by
fixing the countdowns the model would draw."""

import json
import math
import statistics

import pytest

from preemptible.errors import ConfigError
from preemptible.queue.core import POLICIES, RestartSettings, parse_config_text
from preemptible.sim import SimOptions, Simulator, TraceJob, read_trace, summarize
from preemptible.sim.failures import FailureKind, FailureModel, FailureRates, GaveUp

# Every hand-built trace: checkpoints every 30 min (1800 s), saves and restores of 60 s.
INTERVAL, SAVE = 1800.0, 60.0
RATES = FailureRates(crashes_per_1000_gpu_h=1.0, hangs_per_1000_gpu_h=1.0, seed=3)


def _job(job_id, duration, *, submit=0.0, gpus=2, tier="normal", save=SAVE):
    return TraceJob(
        job_id=job_id,
        submit_s=submit,
        duration_s=duration,
        gpus=gpus,
        queue="a",
        tier=tier,
        checkpoint_s=save,
    )


def _config(gpus=2, extra=""):
    queue = f"[[queues]]\nname = 'a'\nnominal = {{ gpus = {gpus} }}\n"
    return parse_config_text(f"[cluster]\ngpus = {gpus}\n{extra}\n{queue}")


@pytest.fixture
def countdowns(monkeypatch):
    """Place failures by hand: {(job, kind): [GPU-seconds of running before its 1st, 2nd...
    failure of that kind]}; a job or failure not listed never comes."""
    table: dict[tuple[str, FailureKind], list[float]] = {}

    def countdown(self, job_id, kind, n):
        given = table.get((job_id, kind), [])
        return given[n] if n < len(given) else math.inf

    monkeypatch.setattr(FailureModel, "_countdown", countdown)
    return table


def _run(jobs, cfg, policy="fifo", rates=RATES):
    options = SimOptions(checkpoint_interval_s=INTERVAL, failures=rates)
    result = Simulator(jobs, cfg, POLICIES[policy], options).run()
    return {r.trace.job_id: r for r in result.records}, summarize(result)["overall"]


def test_a_crash_loses_exactly_the_work_since_the_last_checkpoint(countdowns):
    countdowns[("j", FailureKind.CRASH)] = [2 * 4000.0]  # 2 GPUs: after 4000 s of running
    records, overall = _run([_job("j", 10_000.0)], _config())
    j = records["j"]
    # Starts at 0, checkpoints at 1800 and 3600, crashes at 4000: 400 s of 2 GPUs lost, and
    # the restore (60 s of 2 GPUs) its restart will need.
    assert j.failures.log == [(4000.0, 2 * 400.0 + 2 * SAVE, FailureKind.CRASH)]
    assert j.lost_gpu_s == 0.0  # nothing of it counts as a preemption's
    # Back-off 10 s (the first failure, which made progress), then the restore and the 6400 s
    # of work left: done at 4010 + 60 + 6400.
    assert j.runs == [(0.0, 4000.0), (4010.0, 10_470.0)]
    assert j.wait_s == 10.0
    assert j.end_s == 10_470.0
    assert (overall["crashes"], overall["restarts"], overall["jobs_failed"]) == (1, 1, 0)
    assert overall["failure_lost_gpu_s"] == overall["crash_lost_gpu_s"] == 920.0
    # Goodput: held (20,000 of work + 920 lost) less the loss, over 2 GPUs x 10,470 s.
    assert overall["goodput"] == pytest.approx(20_000.0 / (2 * 10_470.0))


def test_a_hang_holds_its_gpus_until_the_bound_and_the_grace(countdowns):
    countdowns[("j", FailureKind.HANG)] = [2 * 3000.0]
    # k needs both GPUs from 3100: it waits for the hung job to be killed.
    jobs = [_job("j", 10_000.0), _job("k", 1000.0, submit=3100.0)]
    records, overall = _run(jobs, _config(extra="[restarts]\nhang_after = '15m'"))
    j, k = records["j"], records["k"]
    grace = 1.5 * SAVE + 10.0  # the [preemption] defaults: 1.5 x the save, plus 10 s
    killed = 3000.0 + 900.0 + grace  # the hang, the configured bound, the notice's grace
    assert k.first_start_s == killed
    assert j.runs[0] == (0.0, killed)
    # Lost: from the checkpoint at 1800 (none after the hang, though the run lasts past 3600)
    # to the kill on 2 GPUs, and the restore of the restart.
    assert j.failures.log == [(killed, 2 * (killed - 1800.0) + 2 * SAVE, FailureKind.HANG)]
    # j rejoins after its 10 s back-off, behind k: it restarts when k ends and does its 8200 s.
    assert j.runs[1] == (killed + 1000.0, killed + 1000.0 + SAVE + 8200.0)
    assert (overall["hangs"], overall["crashes"], overall["restarts"]) == (1, 0, 1)
    assert overall["hang_lost_gpu_s"] == overall["failure_lost_gpu_s"]


def test_a_hung_job_never_completes(countdowns):
    countdowns[("j", FailureKind.HANG)] = [2 * 4000.0]
    records, _ = _run([_job("j", 4300.0)], _config())
    # It would have finished at 4300; hung at 4000, it is killed after hang_min and the grace
    # and redoes its last 700 s after its back-off and restore.
    killed = 4000.0 + 600.0 + 1.5 * SAVE + 10.0
    assert records["j"].runs == [(0.0, killed), (killed + 10.0, killed + 10.0 + SAVE + 700.0)]


def test_a_hang_being_killed_is_not_preempted(countdowns):
    countdowns[("j", FailureKind.HANG)] = [2 * 4000.0]
    killed = 4000.0 + 600.0 + 1.5 * SAVE + 10.0
    # h arrives once the hang is noticed: kueue would preempt the low-tier j for it at once,
    # but j is already on its way out (its GPUs free at the kill).
    late = _job("h", 500.0, submit=4000.0 + 600.0 + 5.0, tier="high")
    records, _ = _run([_job("j", 10_000.0, tier="low"), late], _config(), "kueue")
    assert records["j"].preemptions == 0
    assert records["h"].first_start_s == killed


def test_a_hang_without_hang_after_is_noticed_after_hang_min(countdowns):
    countdowns[("j", FailureKind.HANG)] = [2 * 4000.0]
    records, _ = _run([_job("j", 10_000.0)], _config(extra="[restarts]\nhang_min = '20m'"))
    assert records["j"].runs[0][1] == 4000.0 + 1200.0 + 1.5 * SAVE + 10.0


def test_a_hung_job_preempted_before_the_hang_is_noticed_charges_both(countdowns):
    countdowns[("j", FailureKind.HANG)] = [2 * 4000.0]
    # kueue preempts the low-tier j for h at once, with its fixed grace; a 10 s save fits in it.
    grace = POLICIES["kueue"].fixed_grace_s
    save = 10.0
    assert save < grace
    low = _job("j", 10_000.0, tier="low", save=save)
    records, overall = _run([low, _job("h", 500.0, submit=4100.0, tier="high")], _config(), "kueue")
    j = records["j"]
    [(noticed, preempt_lost, _)] = j.lost_log
    assert 4100.0 <= noticed < 4000.0 + 600.0  # told to go before hang_min
    # It cannot save, so it is killed at the end of its grace, not after its save.
    assert j.runs[0] == (0.0, noticed + grace)
    # The hang is charged from the checkpoint at 3600 to the notice; the notice its grace and
    # the restore.
    assert j.failures.log == [(noticed, 2 * (noticed - 3600.0), FailureKind.HANG)]
    assert preempt_lost == 2 * grace + 2 * save
    assert (overall["hangs"], overall["restarts"], j.preemptions) == (1, 0, 1)
    held = 2 * sum(end - start for start, end in j.runs)
    assert held == pytest.approx(2 * 10_000.0 + j.lost_gpu_s + j.failures.lost_gpu_s)


def test_out_of_restarts_the_job_fails_and_its_work_is_never_done(countdowns):
    countdowns[("j", FailureKind.CRASH)] = [2 * 2000.0] * 5  # past one checkpoint each run
    jobs = [_job("j", 10_000.0), _job("m", 100.0, submit=50.0, gpus=2)]
    records, overall = _run(jobs, _config(gpus=4, extra="[restarts]\nmax_restarts = 2"))
    j = records["j"]
    # Runs: 0-2000 (saved 1800), 2010-4010 (60 s restore, then 1940 s: saved 3600),
    # 4020-6020 (saved 5400); the third failure finds both restarts used.
    assert j.runs == [(0.0, 2000.0), (2010.0, 4010.0), (4020.0, 6020.0)]
    assert j.failures.gave_up is GaveUp.NO_RESTART_LEFT
    assert j.end_s == 6020.0
    # Lost: 200 s + restore, 140 s + restore, 140 s and no restore (none follows).
    assert j.failures.lost_gpu_s == 2 * 200.0 + 2 * SAVE + 2 * 140.0 + 2 * SAVE + 2 * 140.0
    assert (overall["crashes"], overall["restarts"], overall["jobs_failed"]) == (3, 2, 1)
    assert overall["crash_loops"] == 0
    assert overall["unfinished_gpu_s"] == 2 * (10_000.0 - 5400.0)
    assert overall["mean_jct_s"] == 100.0  # m's alone: a failed job never completed


def test_failures_in_a_row_without_a_checkpoint_are_a_crash_loop(countdowns):
    countdowns[("j", FailureKind.CRASH)] = [2 * 1000.0] * 5  # each before the first checkpoint
    records, overall = _run([_job("j", 10_000.0)], _config())
    j = records["j"]
    # Back-offs of 10 s, then 20 s (doubling without progress); the third failure in a row
    # without progress fails it, with a restart left.
    assert j.runs == [(0.0, 1000.0), (1010.0, 2010.0), (2030.0, 3030.0)]
    assert j.wait_s == 30.0
    assert j.failures.gave_up is GaveUp.CRASH_LOOP
    assert (overall["jobs_failed"], overall["crash_loops"], overall["restarts"]) == (1, 1, 2)


def test_max_restarts_zero_fails_the_first_failure(countdowns):
    countdowns[("j", FailureKind.CRASH)] = [2 * 4000.0]
    cfg = _config(extra="[restarts]\nmax_restarts = 0")
    records, _ = _run([_job("j", 10_000.0)], cfg)
    assert records["j"].end_s == 4000.0
    assert records["j"].failures.gave_up is GaveUp.NO_RESTART_LEFT


def test_draws_come_from_the_seed_the_job_and_the_count_alone():
    model = FailureModel(RATES, RestartSettings())
    first = model.new_job("j1")
    assert model.new_job("j1") == first
    other = FailureModel(FailureRates(crashes_per_1000_gpu_h=1.0, seed=4), RestartSettings())
    assert other.new_job("j1").crash_left_gpu_s != first.crash_left_gpu_s
    assert model.new_job("j2").crash_left_gpu_s != first.crash_left_gpu_s


def test_countdowns_are_exponential_with_the_rate_as_mean():
    # 2 crashes per 1,000 GPU-hours: 500 GPU-hours apart on average.
    model = FailureModel(FailureRates(crashes_per_1000_gpu_h=2.0), RestartSettings())
    draws = [model.new_job(f"j{i}").crash_left_gpu_s / 3600.0 for i in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(500.0, rel=0.03)
    assert statistics.median(draws) == pytest.approx(500.0 * math.log(2), rel=0.03)
    assert model.new_job("j").hang_left_gpu_s == math.inf  # no hang rate: never


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_gpu_second_held_is_work_or_lost(small_trace, small_config, policy):
    # Lost to preemptions and lost to failures are apart, and together are what each job held
    # beyond the work it kept; a failed job kept what it had checkpointed.
    cfg = parse_config_text(small_config.read_text())
    rates = FailureRates(crashes_per_1000_gpu_h=20.0, hangs_per_1000_gpu_h=20.0, seed=1)
    result = Simulator(read_trace(small_trace), cfg, POLICIES[policy], SimOptions(failures=rates))
    records = result.run().records
    assert sum(r.failures.crashes + r.failures.hangs for r in records) > 20
    for r in records:
        held = r.trace.gpus * sum(end - start for start, end in r.runs)
        kept = r.trace.duration_s if r.failures.gave_up is None else r.saved_s
        lost = r.lost_gpu_s + r.failures.lost_gpu_s
        assert held - r.trace.gpus * kept == pytest.approx(lost, abs=1e-6), r.trace.job_id


def test_the_same_seed_gives_the_same_report_and_another_seed_another(small_trace, small_config):
    from preemptible.cli.sim import run_sim

    def report(seed):
        rates = FailureRates(crashes_per_1000_gpu_h=10.0, hangs_per_1000_gpu_h=5.0, seed=seed)
        out = run_sim(trace=small_trace, config=small_config, policy="all", failures=rates)
        for metrics in out["policies"].values():
            metrics["overall"].pop("sim_seconds")
        return json.dumps(out, sort_keys=True)

    first = report(1)
    assert report(1) == first
    assert report(2) != first
    ours = json.loads(first)["policies"]["preemptible"]["overall"]
    assert ours["crashes"] > 0 and ours["hangs"] > 0
    failures = json.loads(first)["failures"]
    assert failures["seed"] == 1 and failures["hang_bound_s"] == RestartSettings().hang_min_s


def test_zero_rates_change_nothing(small_trace, small_config, small_report):
    from preemptible.cli.sim import run_sim

    zero = run_sim(
        trace=small_trace, config=small_config, policy="all", failures=FailureRates(seed=9)
    )
    assert "failures" not in zero
    for name, metrics in zero["policies"].items():
        before = small_report["policies"][name]
        for got, expected in [(metrics["overall"], before["overall"])] + [
            (metrics["queues"][q], before["queues"][q]) for q in before["queues"]
        ]:
            assert got.keys() == expected.keys()
            assert not {"crashes", "failure_lost_gpu_s", "jobs_failed"} & got.keys()
            assert {k: v for k, v in got.items() if k != "sim_seconds"} == {
                k: v for k, v in expected.items() if k != "sim_seconds"
            }


@pytest.mark.parametrize("field", ["crashes_per_1000_gpu_h", "hangs_per_1000_gpu_h"])
@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf])
def test_a_rate_that_is_not_a_rate_is_refused_with_the_fix(field, value):
    with pytest.raises(ConfigError, match=r"per 1,000 GPU-hours of running, 0 or more"):
        FailureRates(**{field: value})


# --- the command line and the reports ---------------------------------------------------------


def test_the_cli_prints_and_writes_what_failures_cost(tmp_path, small_trace, small_config):
    from .test_cli import run_cli
    from .test_html_report import Page

    out, html = tmp_path / "m.json", tmp_path / "r.html"
    args = ["--trace", str(small_trace), "--config", str(small_config), "--policy", "all"]
    rates = ["--crash-rate", "10", "--hang-rate", "5", "--failure-seed", "4"]
    proc = run_cli(*args, *rates, "--json", str(out), "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["failures"]["crashes_per_1000_gpu_h"] == 10.0
    assert report["failures"]["max_restarts"] == {"team-a": 3, "team-b": 3, "team-c": 3}
    first_line = " ".join(proc.stdout.split("summary:")[0].split())  # as wrapped to the width
    assert "10 crashes and 5 hangs per 1,000 GPU-hours of running (seed 4)" in first_line
    table = proc.stdout.split("crashes and hangs, per policy")[1]
    page = Page(html.read_text())
    cells = page.table("failures", "comparison").body()
    for name, metrics in report["policies"].items():
        o = metrics["overall"]
        row = next(line for line in table.splitlines() if f" {name} " in line)
        numbers = [c.strip() for c in row.split("│") if c.strip()][1:]
        expected = [f"{o[k]:,}" for k in ("crashes", "hangs", "restarts", "jobs_failed")]
        assert numbers[:4] == expected, row
        assert numbers[4] == f"{o['crash_lost_gpu_s'] / 3600:,.1f}", row
        assert [float(c.value) for c in cells[name]][:2] == [o["crashes"], o["hangs"]]
        assert set(metrics["queues"]["team-a"]) >= {"crashes", "hangs", "failure_lost_gpu_s"}
    assert "failure seed" in "".join(page.text)


def test_a_negative_rate_or_a_repeated_one_is_refused(small_trace, small_config):
    from .test_cli import run_cli

    args = ["--trace", str(small_trace), "--config", str(small_config), "--policy", "fifo"]
    proc = run_cli(*args, "--hang-rate", "-1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: --hang-rate must be a number of hangs per 1,000 GPU-hours of running, "
        "0 or more (0: none), not -1.0"
    )
    proc = run_cli(*args, "--crash-rate", "1", "--crash-rate", "2")
    assert proc.returncode == 2 and "--crash-rate" in proc.stderr


def test_help_states_the_unit_of_each_rate():
    from .test_cli import run_cli

    proc = run_cli("--help")
    flat = " ".join(proc.stdout.replace("│", " ").split())
    assert "Crashes per 1,000 GPU-hours of running" in flat
    assert "Hangs per 1,000 GPU-hours of running" in flat
    assert "--failure-seed" in flat


# --- the policy family with failures ----------------------------------------------------------


def _with_failures(metrics, *, crashes=0, failure_lost_gpu_h=0.0):
    return {
        **metrics,
        "crashes": crashes,
        "hangs": 1,
        "jobs_failed": 0,
        "failure_lost_gpu_h": failure_lost_gpu_h,
        "unfinished_gpu_h": 0.0,
    }


def test_the_failure_summary_sets_goodput_with_failures_beside_goodput_without():
    from preemptible.sim.evaluation.family_summary import draw_report, failure_summary

    from .test_family import REFERENCE, numbers, small

    def draw(seed, ours_goodput, kueue_goodput, lost):
        metrics = dict(
            REFERENCE,
            kueue=numbers(kueue_goodput, 47.0, 216.0, 800.0),
            preemptible=numbers(ours_goodput, 42.6, 213.6, 190.0),
        )
        failing = {
            p: _with_failures(m, crashes=2, failure_lost_gpu_h=lost) for p, m in metrics.items()
        }
        return draw_report(str(seed), small(seed), failing)

    # ours 0.90 and 0.86 against kueue's 0.88 and 0.87, without failures both 0.874 vs 0.879
    with_failures = [draw(1, 0.90, 0.88, 100.0), draw(2, 0.86, 0.87, 300.0)]
    without = [draw_report(str(s), small(s), REFERENCE) for s in (2, 1)]  # in another order
    s = failure_summary(with_failures, without)
    ours, kueue = s["preemptible"], s["kueue"]
    assert ours["median_goodput"] == pytest.approx(0.88)
    assert kueue["median_goodput"] == pytest.approx(0.875)
    assert kueue["ours_higher"] == 1 and kueue["ours_higher_without"] == 0
    assert ours["median_goodput_without"] == 0.874
    assert ours["median_change"] == pytest.approx(((0.90 - 0.874) + (0.86 - 0.874)) / 2)
    assert (ours["crashes"], ours["hangs"], ours["failure_lost_gpu_h"]) == (4, 2, 400.0)
    assert ours["failure_lost_share"] == pytest.approx(400.0 / (2 * 50_000.0))
    assert "ours_higher" not in ours
    with pytest.raises(ValueError, match="lacks the draws 2"):
        failure_summary(with_failures, without[1:])


def test_a_family_replay_with_failures_says_what_they_cost():
    from preemptible.sim.evaluation.family_goals import replay

    from .test_family import small

    rates = FailureRates(crashes_per_1000_gpu_h=50.0, hangs_per_1000_gpu_h=20.0, seed=1)
    plain, failing = replay(small(9, 150), "kueue"), replay(small(9, 150), "kueue", None, rates)
    assert "crashes" not in plain
    assert failing["crashes"] > 0 and failing["failure_lost_gpu_h"] > 0
    assert failing["goodput"] < plain["goodput"]


def test_the_family_command_compares_goodput_with_and_without_failures(tmp_path):
    import subprocess
    import sys

    from .test_family import BENCHMARK, ROOT

    cmd = [sys.executable, str(BENCHMARK), "--only", "4,2", "--jobs", "120", "--workers", "2"]

    def run(*args):
        return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)

    plain, failing = tmp_path / "plain.json", tmp_path / "failing.json"
    assert run("--json", str(plain)).returncode == 0
    rates = ["--crash-rate", "20", "--hang-rate", "10", "--failure-seed", "2"]
    done = run(*rates, "--compare-with", str(plain), "--json", str(failing))
    assert done.returncode == 0, done.stderr
    assert "with 20 crashes and 10 hangs per 1,000 GPU-hours of running (seed 2)" in done.stdout
    assert "--only 4 --jobs 120 --crash-rate 20 --hang-rate 10 --failure-seed 2" in done.stdout
    saved = json.loads(failing.read_text())
    assert saved["failures"] == {
        "crashes_per_1000_gpu_h": 20.0,
        "hangs_per_1000_gpu_h": 10.0,
        "seed": 2,
    }
    table = done.stdout.split("GPU-hours of running (seed 2)")[1]
    row = next(line for line in table.splitlines() if line.startswith("  preemptible "))
    with_them, without = (
        [d["policies"]["preemptible"]["goodput"] for d in json.loads(f.read_text())["draws"]]
        for f in (failing, plain)
    )
    assert row.split()[1:3] == [f"{sum(with_them) / 2:.2%}", f"{sum(without) / 2:.2%}"]
    for bad in (
        ["--crash-rate", "-1"],
        ["--compare-with", str(plain)],  # no rate
        [*rates, "--compare-with", str(failing)],  # a run with failures
        [*rates, "--baselines", str(plain)],
    ):
        refused = run(*bad)
        assert refused.returncode == 2 and "error:" in refused.stderr, bad
