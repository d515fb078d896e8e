"""Our policy against the four baselines on a family of random workloads, goal by goal.

Each draw is a workload of `preemptible.sim.family` (knobs drawn from its seed: load, teams and
weights, tiers, gangs, arrivals, durations, estimates, checkpoint costs, quotas, nodes), replayed
under fifo, priority, kueue, slurm and preemptible with checkpoint-aware jobs (`SimOptions()`,
as `policy_quality.py` replays). Per draw and policy it keeps:

- goodput: `goodput_while_arriving`, GPU-seconds held minus GPU-seconds lost to preemption over
  the GPU-seconds the cluster offers from the first to the last submission (as the goodput goal
  of docs/evaluation/policy-evaluation.md; the drain after the last submission does not count);
- overall p95 wait: the 95th percentile of every job's total time pending (requeues included);
- least-served max wait: the largest max wait of any queue (`max_wait_least_served_s`);
- mean JCT, lost GPU-hours, and delivered GPU-hours (held, lost work included, as
  `lost_share_of_delivered` divides by).

The four goals of the policy family (`preemptible.sim.evaluation.family_goals`), per draw, for
ours, with waits under 60 s counted as 60 s as in docs/evaluation/policy-evaluation.md (so that
seconds against zero is no failure):

1. goodput at least kueue's and at least the best baseline's minus 2 points;
2. overall p95 wait at most 1.1x the lowest of the four baselines';
3. least-served max wait at most 1.1x the lowest of priority's, kueue's and slurm's (the
   baselines that respect tiers);
4. lost GPU-hours under 1% of delivered, and at most half of kueue's.

The same goals also judge each baseline against the other four policies (ours included), with
ours in kueue's place where kueue is the one judged: how much the goals ask of any policy.

Beside the goals as written, the report counts them under the readings proposed in
docs/evaluation/policy-evaluation.md (`family_goals.PROPOSED`): the p95 wait against the
baselines that respect tiers, the least-served max wait against those that also let work pass a
blocked job (kueue, slurm), and lost work under 0.1% of delivered as within kueue's bound
whatever kueue loses.

    .venv/bin/python benchmarks/policy_family.py [--draws 40] [--seed-base 0] [--workers N]
        [--only SEED[,SEED]] [--held-out [SEED[,SEED]]] [--json out.json] [--jobs N]
        [--crash-rate R] [--hang-rate R] [--failure-seed S] [--compare-with JSON]

`--only` replays the named draws (the worst draws are printed with that command); `--held-out`
replays the held-out workload (`family.held_out_workload`, seed 0 or the seeds given) beside the
reference numbers published with its description (`family_goals.HELD_OUT_REFERENCE`);
`--jobs` shrinks every draw to N jobs for a quick look (its numbers are not the family's).
Same seeds, same numbers: only the wall times differ between runs.

`--crash-rate` and `--hang-rate` (per 1,000 GPU-hours of running, as `preemptible sim` takes
them) replay every policy with jobs that crash and hang, the same jobs after the same GPU-hours
of running under every policy, restarted as the queue manager restarts them; the report then
ends with what they cost each policy and its goodput against the baselines', beside the same
draws without failures from `--compare-with` (an earlier `--json` run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from preemptible.queue.core import POLICIES, Policy
from preemptible.sim.evaluation.family_goals import (
    BASELINES,
    GOAL_TITLES,
    GOALS,
    HELD_OUT_REFERENCE,
    OURS,
    READING_TITLES,
    replay,
)
from preemptible.sim.evaluation.family_summary import (
    CLAUSES,
    ceiling,
    clause_counts,
    counts,
    draw_report,
    failure_summary,
    gain_per_lost,
    lost_by_kind,
    worst,
)
from preemptible.sim.failures import FailureRates
from preemptible.sim.family import Knobs, draw_knobs, held_out_knobs, parse_seeds


def run(
    draws: dict[str, Knobs],
    workers: int,
    switches: dict[str, bool] | None = None,
    baselines: dict[str, dict[str, dict[str, Any]]] | None = None,
    failures: FailureRates | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Every draw under every policy, in parallel; the reports in the given order and the wall
    time. A line per finished draw goes to stderr. Ours is the slowest replay, so its tasks go
    first. With `baselines` (per draw, from an earlier run's JSON) only ours is replayed.
    """
    order = [OURS] if baselines else [OURS, *BASELINES]
    started = time.perf_counter()
    got: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in draws}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(replay, knobs, p, switches, failures): name
            for p in order
            for name, knobs in draws.items()
        }
        for future in as_completed(futures):
            r = future.result()
            per = got[futures[future]]
            per[r["policy"]] = r
            if len(per) == len(order):
                done = sum(len(v) == len(order) for v in got.values())
                walls = " ".join(f"{p} {per[p]['wall_s']:.1f}s" for p in order)
                print(
                    f"[{time.perf_counter() - started:6.0f}s] draw {futures[future]} done "
                    f"({done}/{len(draws)}): {walls}",
                    file=sys.stderr,
                    flush=True,
                )
    wall = time.perf_counter() - started
    for name in draws if baselines else ():
        got[name].update({p: baselines[name][p] for p in BASELINES})
    reports = [
        draw_report(name, knobs, {p: got[name][p] for p in (*BASELINES, OURS)})
        for name, knobs in draws.items()
    ]
    return reports, wall


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.1f}h"


def _mark(met: bool) -> str:
    return "✓" if met else "✗"


def short_knobs(k: dict[str, Any]) -> str:
    """A few knobs in a table cell: GPUs (n: nodes, c: count only), teams, load, tier layout
    and tier count, gang share, arrivals, borrowing limit (bl) or not."""
    place = "n" if k["gpus_per_node"] else "c"
    tiers = sum(p > 0 for p in k["tier_mix"])
    layout = "spread" if k["tier_layout"] == "spread" else "byteam"
    bl = " bl" if k["borrowing_factor"] is not None else ""
    return (
        f"{k['gpus']}{place} {len(k['weights'])}t {k['load']:.2f}x {tiers}{layout} "
        f"g{k['gang_share'] * 100:.0f} {k['arrivals']}{bl}"
    )


def draw_line(d: dict[str, Any]) -> str:
    """One draw's row: knobs, then per goal ours against the bound's reference, met or not."""
    g = d["goals"]
    gp, p95, ls, lost = g["goodput"], g["p95_wait"], g["least_served"], g["lost"]
    return (
        f"{d['name']:>7}  {short_knobs(d['knobs']):<38}"
        f"{gp['ours']:6.1%} {gp['best']:6.1%} {gp['best_policy'][0]} {gp['quota_peer']:6.1%} "
        f"{_mark(gp['met'])}  "
        f"{_h(p95['ours']):>7} {_h(p95['best']):>7} {p95['best_policy'][0]} {_mark(p95['met'])}  "
        f"{_h(ls['ours']):>7} {_h(ls['best']):>7} {ls['best_policy'][0]} {_mark(ls['met'])}  "
        f"{lost['share']:6.2%} {lost['ours']:6.0f} {lost['quota_peer']:6.0f} {_mark(lost['met'])}"
        f"  {_mark(g['all']['met'])}"
    )


HEADER = (
    f"{'draw':>7}  {'knobs':<38}{'goodput: ours best    kueue':<30}"
    f"{'p95 wait: ours best':<22}{'least-served: ours best':<24}"
    f"{'lost: share GPU-h kueue':<26}all"
)


def print_report(draws: list[dict[str, Any]], wall: float, workers: int, flags: str = "") -> None:
    """The per-draw table, the counts, the worst draws (with `flags` in their replay command)."""
    print(HEADER)
    for d in draws:
        print(draw_line(d))
    print(
        "knobs: GPUs (n nodes of 8, c count only), teams, load, tiers in the mix and their layout, "
        "gang share %, arrivals, bl = borrowing limits; best: f fifo, p priority, k kueue, "
        "s slurm"
    )
    n = len(draws)
    c = counts(draws)
    print(f"\nours meets, on {n} draws:")
    by_clause = clause_counts(draws)
    for goal in GOALS:
        print(_count_line(GOAL_TITLES[goal], c[OURS][goal], n))
        if goal in by_clause:
            parts = [f"{CLAUSES[goal][k]} on {v}" for k, v in by_clause[goal].items()]
            print(f"     the bounds apart: {', '.join(parts)}")
    print(_count_line("all four", c[OURS]["all"], n))
    print_lost(draws)
    print("\nevery policy judged by the same goals against the other four:")
    print_counts(c)
    proposed = counts(draws, "proposed_by_policy")
    print("\nunder the readings proposed in docs/evaluation/policy-evaluation.md:")
    for goal in GOALS:
        print(_count_line(READING_TITLES[goal], proposed[OURS][goal], n))
    print(_count_line("all four", proposed[OURS]["all"], n))
    print("every policy under those readings, against the other four:")
    print_counts(proposed)
    for goal in GOALS:
        print(f"\nworst draws for {GOAL_TITLES[goal]}:")
        for d in worst(draws, goal):
            state = "met" if d["goals"][goal]["met"] else "missed"
            print(f"  {draw_line(d).strip()}")
            print(f"      {state}; {d['summary']}")
            again = (
                f"--held-out {d['seed']}"
                if d["name"].startswith("held-out")
                else f"--only {d['seed']}"
            )
            print(f"      replay: .venv/bin/python benchmarks/policy_family.py {again}{flags}")
    replays = sum(r["wall_s"] for d in draws for r in d["policies"].values())
    print(
        f"\n{n} draws x {len(POLICIES)} policies in {wall:.0f}s wall on {workers} workers "
        f"({replays:.0f}s of replays, counting baselines taken from --baselines)"
    )


def _count_line(title: str, met: int, n: int) -> str:
    return f"  {title:<66} {met:>3} ({met / n:.0%})"


def print_counts(c: dict[str, dict[str, int]]) -> None:
    """Per policy, the draws on which it meets each goal and all four."""
    print(f"  {'policy':<12}" + "".join(f"{g:>14}" for g in (*GOALS, "all")))
    for policy in (*BASELINES, OURS):
        print(f"  {policy:<12}" + "".join(f"{c[policy][g]:>14}" for g in (*GOALS, "all")))


def print_lost(draws: list[dict[str, Any]]) -> None:
    """What ours' lost work is made of, and what it buys where it alone misses goal 4."""
    kinds = lost_by_kind(draws)
    total = sum(t for t, _ in kinds.values()) or 1.0
    missed = sum(m for _, m in kinds.values()) or 1.0
    misses = sum(not d["goals"]["lost"]["met"] for d in draws)
    print("\nours' lost GPU-hours by the rule that sent the notice:")
    print(f"  {'rule':<14}{'all draws':>16}{f'the {misses} missing goal 4':>28}")
    for kind, (t, m) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"  {kind:<14}{t:>9.0f} ({t / total:4.0%}){m:>21.0f} ({m / missed:4.0%})")
    ratios = sorted(gain_per_lost(draws).values())
    if ratios:
        print(
            f"goal 4 missed only for losing more than half of kueue's loss: {len(ratios)} draws;\n"
            f"  there, for each GPU-hour ours loses, it delivers {ratios[0]:.1f} to "
            f"{ratios[-1]:.1f} (median {statistics.median(ratios):.1f}) more useful GPU-hours "
            "than kueue while jobs arrive"
        )


def print_failures(
    draws: list[dict[str, Any]], rates: FailureRates, without: list[dict[str, Any]] | None
) -> None:
    """What crashes and hangs cost each policy, and goodput against the baselines' with them
    (and without them, from `--compare-with`)."""
    s = failure_summary(draws, without)
    n = len(draws)
    print(
        f"\nwith {rates.crashes_per_1000_gpu_h:g} crashes and {rates.hangs_per_1000_gpu_h:g} "
        f"hangs per 1,000 GPU-hours of running (seed {rates.seed}), on {n} draws:"
    )
    print(
        f"  {'policy':<12}{'goodput median':>16}{'without':>9}{'change':>8}"
        f"{'ours higher':>13}{'without':>9}{'goal 1':>8}{'crashes':>9}{'hangs':>7}"
        f"{'failed':>8}{'lost to failures':>18}{'never done':>12}"
    )
    for policy, r in s.items():
        before = r.get("median_goodput_without")
        without = "" if before is None else f"{before:.2%}"
        change = "" if before is None else f"{100 * r['median_change']:+.2f}"
        print(
            f"  {policy:<12}{r['median_goodput']:>16.2%}{without:>9}{change:>8}"
            f"{_ratio(r.get('ours_higher'), n):>13}{_ratio(r.get('ours_higher_without'), n):>9}"
            f"{r['goodput_goal_met']:>8}{r['crashes']:>9,}{r['hangs']:>7,}{r['jobs_failed']:>8,}"
            f"{r['failure_lost_gpu_h']:>9,.0f} ({r['failure_lost_share']:.2%})"
            f"{r['unfinished_gpu_h']:>12,.0f}"
        )
    print(
        "goodput: median over the draws while jobs arrive; change: median per draw, points; "
        "ours higher: draws on which ours' goodput is above the policy's; goal 1: draws it meets "
        "the goodput goal against the other four; lost to failures: GPU-h (share of delivered); "
        "never done: GPU-h of work of jobs failed after max_restarts"
    )


def _ratio(count: int | None, n: int) -> str:
    return "" if count is None else f"{count}/{n}"


def print_held_out(d: dict[str, Any]) -> None:
    print(f"the held-out workload, seed {d['seed']}: {d['summary']}")
    print(
        f"{'policy':<12}{'goodput':>9}{'p95 wait':>10}{'least-served':>14}{'mean JCT':>10}"
        f"{'lost GPU-h':>12}   reported: goodput, p95, least-served, JCT, lost"
    )
    for policy, r in d["policies"].items():
        g, p95, ls, jct, lost = HELD_OUT_REFERENCE[policy]
        print(
            f"{policy:<12}{r['goodput']:>9.1%}{_h(r['p95_wait_s']):>10}"
            f"{_h(r['least_served_max_wait_s']):>14}{_h(r['mean_jct_s']):>10}"
            f"{r['lost_gpu_h']:>12.0f}   {g:.1%}, {p95:.1f}h, {ls:.1f}h, {jct:.1f}h, {lost:.0f}"
        )
    print(
        "goals: "
        + ", ".join(f"{g} {_mark(d['goals'][g]['met'])}" for g in GOALS)
        + f" (demand {d['policies'][OURS]['demand_ratio']:.3f}x)\n"
    )


def print_ceiling(result: dict[str, Any]) -> None:
    names = ", ".join(result["candidates"])
    print(
        f"the best of {len(result['candidates'])} policies per draw, chosen with hindsight ({names}):"
    )
    for goal in (*GOALS, "all"):
        title = GOAL_TITLES.get(goal, "all four, by one policy")
        print(f"  {title:<66} {result['met'][goal]:>3} of {result['draws']}")
    for name, winners in result["per_draw"].items():
        print(f"  draw {name:>3}: {', '.join(winners) if winners else '-'}")


def _ceiling_runs(
    parser: argparse.ArgumentParser, paths: list[Path]
) -> dict[str, list[dict[str, Any]]]:
    """Each file's draws, named by the file (a candidate's name in the report)."""
    runs = {}
    for path in paths:
        if path.stem in runs or path.stem in BASELINES:
            parser.error(
                f"--ceiling {path}: name each file apart from the others and the baselines"
            )
        try:
            runs[path.stem] = json.loads(path.read_text())["draws"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            parser.error(f"--ceiling {path}: not the --json output of this script ({e!r})")
    return runs


def _switches(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, bool]:
    """``--switch loan_backfill=false`` pairs, checked against ours' boolean rules."""
    names = {f.name for f in dataclasses.fields(Policy) if f.type in (bool, "bool")}
    out: dict[str, bool] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in names or value.lower() not in ("true", "false"):
            parser.error(f"--switch {item}: give RULE=true|false, RULE one of {sorted(names)}")
        out[name] = value.lower() == "true"
    return out


def _baselines(
    parser: argparse.ArgumentParser, path: Path, names: list[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """The baselines' numbers per draw from an earlier ``--json`` run of the same draws."""
    try:
        saved = {d["name"]: d["policies"] for d in json.loads(path.read_text())["draws"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"--baselines {path}: not the --json output of this script ({e!r})")
    missing = [n for n in names if n not in saved or not set(BASELINES) <= set(saved[n])]
    if missing:
        parser.error(f"--baselines {path} lacks the draws {', '.join(missing[:5])}")
    return {n: saved[n] for n in names}


def _failure_rates(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> FailureRates | None:
    """The crash and hang rates asked for; None where none is."""
    try:
        rates = FailureRates(
            crashes_per_1000_gpu_h=args.crash_rate,
            hangs_per_1000_gpu_h=args.hang_rate,
            seed=args.failure_seed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.compare_with and not rates.on:
        parser.error("--compare-with goes with --crash-rate or --hang-rate above 0")
    return rates if rates.on else None


def _without_failures(
    parser: argparse.ArgumentParser,
    path: Path | None,
    failures: FailureRates | None,
    names: list[str],
) -> list[dict[str, Any]] | None:
    """The draws of an earlier ``--json`` run without failures, for `--compare-with`."""
    if path is None:
        return None
    try:
        saved = json.loads(path.read_text())
        runs = {d["name"]: d for d in saved["draws"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"--compare-with {path}: not the --json output of this script ({e!r})")
    if "failures" in saved:
        parser.error(f"--compare-with {path}: a run with failures; give one without")
    missing = [n for n in names if n not in runs]
    if missing:
        parser.error(f"--compare-with {path} lacks the draws {', '.join(missing[:5])}")
    return [runs[n] for n in names]


def seeds_arg(parser: argparse.ArgumentParser, option: str, text: str) -> list[int]:
    """Seeds given as ``1,4,9``; exits with a usage error otherwise."""
    try:
        return parse_seeds(text)
    except ValueError as exc:
        parser.error(f"{option} {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=40, help="how many draws (%(default)s)")
    parser.add_argument(
        "--seed-base", type=int, default=0, help="the first draw's seed (%(default)s)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="replays run in parallel (default: one per CPU, %(default)s)",
    )
    parser.add_argument("--only", metavar="SEED[,SEED]", help="replay these draws only")
    parser.add_argument(
        "--held-out",
        nargs="?",
        const="0",
        metavar="SEED[,SEED]",
        help="replay the held-out workload (seed 0, or these seeds of its jobs)",
    )
    parser.add_argument("--json", type=Path, help="also write every draw's numbers here")
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="give every draw N jobs instead of its own count: a quick look, not the family",
    )
    parser.add_argument(
        "--switch",
        action="append",
        default=[],
        metavar="RULE=BOOL",
        help="replay ours with one of its rules changed (repeatable), e.g. loan_backfill=false",
    )
    parser.add_argument(
        "--baselines",
        type=Path,
        metavar="JSON",
        help="take the baselines' numbers from an earlier --json run of the same draws and "
        "replay ours only (with --switch: a rule's effect in a fifth of the time)",
    )
    parser.add_argument(
        "--crash-rate",
        type=float,
        default=0.0,
        metavar="R",
        help="jobs crash R times per 1,000 GPU-hours of running, every policy (%(default)s)",
    )
    parser.add_argument(
        "--hang-rate",
        type=float,
        default=0.0,
        metavar="R",
        help="jobs hang R times per 1,000 GPU-hours of running, every policy (%(default)s)",
    )
    parser.add_argument(
        "--failure-seed", type=int, default=0, help="seed of the crash and hang draws (%(default)s)"
    )
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="JSON",
        help="with failure rates: an earlier --json run of the same draws without failures, "
        "whose goodput is printed beside",
    )
    parser.add_argument(
        "--ceiling",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="replay nothing: from --json runs of the same draws (ours, or ours with a switch), "
        "count the draws on which the best of those and the baselines, chosen per draw, meets "
        "each goal",
    )
    args = parser.parse_args()
    if args.ceiling:
        try:
            print_ceiling(ceiling(_ceiling_runs(parser, args.ceiling)))
        except (ValueError, KeyError, TypeError) as e:
            parser.error(f"--ceiling: not the --json output of this script ({e!r})")
        return
    switches = _switches(parser, args.switch)
    failures = _failure_rates(parser, args)
    if args.draws < 1 or args.workers < 1 or args.seed_base < 0:
        parser.error("--draws and --workers must be 1 or more, --seed-base 0 or more")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be 1 or more, not {args.jobs}")
    if args.held_out is not None:
        draws = {
            f"held-out-{s}": held_out_knobs(s)
            for s in seeds_arg(parser, "--held-out", args.held_out)
        }
    elif args.only:
        draws = {str(s): draw_knobs(s) for s in seeds_arg(parser, "--only", args.only)}
    else:
        seeds = list(range(args.seed_base, args.seed_base + args.draws))
        draws = {str(s): draw_knobs(s) for s in seeds}
    if args.jobs is not None:
        draws = {name: dataclasses.replace(k, jobs=args.jobs) for name, k in draws.items()}
    baselines = _baselines(parser, args.baselines, list(draws)) if args.baselines else None
    if baselines and failures:
        parser.error("--baselines replays ours alone: give failure rates to a run of all five")
    without = _without_failures(parser, args.compare_with, failures, list(draws))
    variant = "".join(f" --switch {k}={str(v).lower()}" for k, v in switches.items())
    if failures:
        variant += (
            f" --crash-rate {failures.crashes_per_1000_gpu_h:g}"
            f" --hang-rate {failures.hangs_per_1000_gpu_h:g} --failure-seed {failures.seed}"
        )
    print(
        f"{len(draws)} draws x {1 if baselines else len(POLICIES)} policies on {args.workers} "
        f"workers{variant}",
        flush=True,
    )
    reports, wall = run(draws, args.workers, switches, baselines, failures)
    if args.held_out is not None:
        for report in reports:
            print_held_out(report)
    if len(reports) > 1:
        flags = ("" if args.jobs is None else f" --jobs {args.jobs}") + variant
        print_report(reports, wall, args.workers, flags)
    else:
        print(f"{wall:.0f}s wall")
    if failures:
        print_failures(reports, failures, without)
    if args.json:
        report = {
            **({"failures": dataclasses.asdict(failures)} if failures else {}),
            "draws": reports,
            "counts": counts(reports),
            "proposed_counts": counts(reports, "proposed_by_policy"),
            "clause_counts": clause_counts(reports),
            "wall_s": wall,
        }
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
