"""Our policy against every baseline, on every shared trace and on the synthetic workload.

For each trace: import it, size the cluster to its offered load (`suggest_config`, 8-GPU nodes,
so demand exceeds supply whenever it bursts), replay it under fifo, priority, kueue, slurm and
preemptible with checkpoint-aware jobs, and check the goals on the named traces
(`preemptible.sim.evaluation.trace_goals`):

- goodput >= 90% where demand exceeds supply (`goodput_while_arriving`, demand ratio > 1);
- lost GPU-hours < 1% of delivered GPU-hours;
- no queue's p95 wait worse than the best baseline's for that queue by more than 10%
  (waits under 60 s count as 60 s, so that a few seconds against zero is not a failure);
- the least-served queue's max wait lower than every baseline's.

It then judges every policy, baselines included, by the same two wait goals against the other
four, and counts the traces on which no other policy beats it on both overall p95 wait and
longest wait: how much the goals ask of any policy.

    .venv/bin/python benchmarks/policy_quality.py [--traces all|synthetic,philly,...]
        [--json out.json] [--markdown out.md] [--plots DIR] [--weights-only]
        [--cycle-interval SECONDS] [--submit-jitter SECONDS [--jitter-seed N]]

`--weights-only` sets every queue's nominal quota to 0 (fair-share weights only, all work
borrowed), for every policy: it shows what quotas smaller than a queue's largest gang cost.
`--cycle-interval` (default 10 s of virtual time) changes when cycles run and so, a replay being
chaotic, which of two close decisions wins: a difference between two versions of a policy that
survives 7, 10 and 13 s is the rule, not the luck of one run. Where cycles follow arrivals
that are already further apart than that (the Chronus traces), the interval changes nothing:
`--submit-jitter` moves every submission later by a random fraction of the given seconds (the
same for every policy; `--jitter-seed` picks another draw), which takes arrivals off the whole
minutes they share with each other and with job ends, and so probes the same question there
(it also raises lost work on Chronus: see "Why jitter raises lost work" in
docs/evaluation/policy-evaluation.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim import Simulator, summarize
from preemptible.sim.engine import SimOptions
from preemptible.sim.evaluation.named_traces import TRACES, jittered, load_named, weights_only
from preemptible.sim.evaluation.trace_goals import checks, peer_counts

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
"""The shared traces folder next to the checkout (the Traces section of README.md)."""
DEFAULT_INTERVAL_S = SimOptions().cycle_interval_s


def evaluate(
    name: str,
    shared: Path,
    plots: Path | None,
    *,
    no_quotas: bool = False,
    cycle_interval_s: float = DEFAULT_INTERVAL_S,
    submit_jitter_s: float = 0.0,
    jitter_seed: int = 1,
) -> dict[str, Any]:
    jobs, cfg_text = load_named(name, shared)
    if submit_jitter_s:
        jobs = jittered(jobs, submit_jitter_s, jitter_seed)
    cfg = parse_config_text(cfg_text)
    if no_quotas:
        cfg = weights_only(cfg)
    out: dict[str, Any] = {"jobs": len(jobs), "gpus": cfg.cluster.gpus, "policies": {}}
    options = SimOptions(cycle_interval_s=cycle_interval_s)
    for policy in POLICIES:
        t = time.perf_counter()
        result = Simulator(jobs, cfg, POLICIES[policy], options).run()
        out["policies"][policy] = summarize(result)
        out["policies"][policy]["overall"]["wall_s"] = time.perf_counter() - t
        if plots is not None and name == "synthetic" and policy in ("preemptible", "kueue"):
            from preemptible.sim.plots import write_plots

            write_plots(result, plots)
    out["checks"] = checks(out["policies"])
    return out


def hours(s: float) -> str:
    return f"{s / 3600:.1f}h"


def markdown(results: dict[str, Any], peers: dict[str, dict[str, int]]) -> str:
    yes = {True: "yes", False: "**no**"}
    lines = [
        "| trace | jobs | GPUs | demand | goodput (arriving) | lost / delivered | worst queue p95 "
        "vs best baseline | least-served max wait vs best baseline | util vs best baseline |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        c = r["checks"]
        lines.append(
            f"| {name} | {r['jobs']:,} | {r['gpus']} | {c['demand_ratio']:.2f}x | "
            f"{c['goodput_while_arriving']:.1%} ({yes[c['goodput_ok']]}) | "
            f"{c['lost_share']:.2%} ({yes[c['lost_ok']]}) | "
            f"{c['worst_p95_ratio']:.2f}x {c['worst_queue']} ({yes[c['p95_ok']]}) | "
            f"{c['least_served_ratio']:.2f}x ({yes[c['least_served_ok']]}) | "
            f"{c['util_vs_best_baseline']:.2f}x |"
        )
    lines += [
        "",
        "The wait goals read more mildly: each queue's p95 against the policy with the best "
        "overall p95, and the longest wait against the policies with the same quotas:",
        "",
        "| trace | worst queue p95 vs single best (policy) | least-served max wait vs same "
        "quotas | both |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, r in results.items():
        c = r["checks"]
        same = c["least_served_ratio_same_quotas"]
        lines.append(
            f"| {name} | {c['worst_p95_ratio_single_best']:.2f}x ({c['single_best_p95_policy']}) | "
            + (f"{same:.2f}x" if same is not None else "-")
            + f" | {yes[c['milder_ok']]} |"
        )
    lines += [
        "",
        f"Each policy judged by the same wait goals against the other four, on {len(results)} "
        "traces:",
        "",
        "| policy | p95 goal met | max-wait goal met | both met | no other better on both waits |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for policy, n in peers.items():
        lines.append(
            f"| {policy} | {n['p95_ok']} | {n['least_served_ok']} | {n['both']} "
            f"| {n['undominated']} |"
        )
    lines += [
        "",
        "| trace | policy | util | goodput | p95 wait | max wait (least served) | mean JCT "
        "| preempt/h | lost / delivered | sim wall |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        for policy, m in r["policies"].items():
            o = m["overall"]
            lines.append(
                f"| {name} | {policy} | {o['utilization']:.1%} | {o['goodput']:.1%} | "
                f"{hours(o['p95_wait_s'])} | {hours(o['max_wait_least_served_s'])} | "
                f"{hours(o['mean_jct_s'])} | {o['preemptions_per_hour']:.2f} | "
                f"{o['lost_share_of_delivered']:.2%} | {o['wall_s']:.1f}s |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="all")
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--plots", type=Path)
    parser.add_argument(
        "--weights-only", action="store_true", help="every nominal quota 0, for every policy"
    )
    parser.add_argument(
        "--cycle-interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help="virtual seconds between scheduling cycles (default %(default)g); rerun at other "
        "values to see which differences are more than one run's luck",
    )
    parser.add_argument(
        "--submit-jitter",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="submit every job up to this many seconds later (random, the same for every "
        "policy): another probe of luck, where the cycle interval changes nothing",
    )
    parser.add_argument(
        "--jitter-seed", type=int, default=1, metavar="N", help="which random draw (default 1)"
    )
    args = parser.parse_args()
    if not args.cycle_interval >= 0:  # also rejects nan
        parser.error(f"--cycle-interval must be 0 or more seconds, not {args.cycle_interval}")
    if not args.submit_jitter >= 0:
        parser.error(f"--submit-jitter must be 0 or more seconds, not {args.submit_jitter}")
    names = list(TRACES) if args.traces == "all" else args.traces.split(",")
    unknown = [n for n in names if n not in TRACES]
    if unknown:
        parser.error(f"unknown trace(s) {', '.join(unknown)}; choose from {', '.join(TRACES)}")
    results: dict[str, Any] = {}
    print(
        f"{'trace':<14}{'jobs':>8}{'GPUs':>6}{'demand':>8}{'goodput':>9}{'lost':>7}"
        f"{'p95 vs best':>13}{'least-served':>14}{'util ratio':>11}"
    )
    for name in names:
        if TRACES[name] is not None and not (args.shared / TRACES[name]).exists():
            print(f"{name:<14} (missing: {args.shared / TRACES[name]})")
            continue
        r = results[name] = evaluate(
            name,
            args.shared,
            args.plots,
            no_quotas=args.weights_only,
            cycle_interval_s=args.cycle_interval,
            submit_jitter_s=args.submit_jitter,
            jitter_seed=args.jitter_seed,
        )
        c = r["checks"]
        print(
            f"{name:<14}{r['jobs']:>8,}{r['gpus']:>6}{c['demand_ratio']:>7.2f}x"
            f"{c['goodput_while_arriving']:>9.1%}{c['lost_share']:>7.2%}"
            f"{c['worst_p95_ratio']:>12.2f}x{c['least_served_ratio']:>13.2f}x"
            f"{c['util_vs_best_baseline']:>10.2f}x",
            flush=True,
        )
    peers = peer_counts(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    if args.markdown:
        args.markdown.write_text(markdown(results, peers))
    met = {
        k: sum(r["checks"][k] for r in results.values())
        for k in (
            "goodput_ok",
            "lost_ok",
            "p95_ok",
            "least_served_ok",
            "p95_single_best_ok",
            "least_served_same_quotas_ok",
            "milder_ok",
        )
    }
    print(f"goals met on {len(results)} traces: " + ", ".join(f"{k} {v}" for k, v in met.items()))
    print("each policy against the other four: goals met (p95, max wait, both), undominated")
    for policy, n in peers.items():
        print(
            f"  {policy:<12} {n['p95_ok']:>3} {n['least_served_ok']:>3} {n['both']:>3}"
            f" {n['undominated']:>5}"
        )


if __name__ == "__main__":
    main()
