"""How much of a trace's goodput is the luck of one arrival order: draws side by side.

A replay is chaotic: moving every submission by up to a couple of seconds changes which of two
close decisions wins, and with it a few tenths of a point of goodput. One run cannot tell
whether a policy meets the 90% goodput goal of the named traces on a trace whose goodput sits
near it (Chronus MIX1). This replays the trace unmoved (draw 0) and under N jitter draws
(`named_traces.jittered`, the same moved jobs for every policy), ours beside its peers, and
prints per draw each policy's goodput while arriving, lost work and preemptions, then per
policy the range over the draws, how many draws meet the goal, and ours against each peer
draw by draw (`preemptible.sim.evaluation.goodput_draws`).

    .venv/bin/python benchmarks/goodput_draws.py [--trace chronus-mix1] [--draws 6]
        [--jitter SECONDS] [--policies preemptible,slurm,kueue] [--workers N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from preemptible.queue.core import POLICIES
from preemptible.sim.evaluation.goodput_draws import by_policy, replay
from preemptible.sim.evaluation.named_traces import TRACES
from preemptible.sim.evaluation.trace_goals import GOODPUT_GOAL

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
"""The shared traces folder next to the checkout (the Traces section of README.md)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="chronus-mix1", help="default %(default)s")
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument(
        "--draws", type=int, default=6, help="jitter draws besides the unmoved trace (%(default)s)"
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="each submission moves up to this much later (default %(default)g)",
    )
    parser.add_argument("--policies", default="preemptible,slurm,kueue", help="%(default)s")
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="replays run in parallel (default: one per CPU, %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="also write every run and the summary here")
    args = parser.parse_args()
    if args.trace not in TRACES:
        parser.error(f"unknown trace {args.trace!r}; choose from {', '.join(TRACES)}")
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    if args.draws < 0 or args.workers < 1:
        parser.error("--draws must be 0 or more and --workers 1 or more")
    if not args.jitter > 0:
        parser.error(f"--jitter must be more than 0 seconds, not {args.jitter}")
    path = TRACES[args.trace]
    if path is not None and not (args.shared / path).exists():
        parser.error(f"trace file missing: {args.shared / path}; pass --shared DIR")

    tasks = [(d, p) for d in range(args.draws + 1) for p in policies]
    print(f"{args.trace}: {len(tasks)} replays on {args.workers} workers", flush=True)
    print(f"{'draw':>4}  {'policy':<12}{'goodput':>9}{'lost':>8}{'preempt':>9}{'wall':>7}")
    runs = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [
            pool.submit(replay, args.trace, args.shared, d, args.jitter, p) for d, p in tasks
        ]
        for future in futures:  # in submission order, so the table reads draw by draw
            r = future.result()
            runs.append(r)
            print(
                f"{r['draw']:>4}  {r['policy']:<12}{r['goodput_while_arriving']:>9.2%}"
                f"{r['lost_share_of_delivered']:>8.2%}{r['preemptions']:>9,}{r['wall_s']:>6.0f}s",
                flush=True,
            )
    summary = by_policy(runs)
    print(f"\ngoodput while arriving over {args.draws + 1} runs (goal {GOODPUT_GOAL:.0%}):")
    for policy, s in summary.items():
        line = (
            f"  {policy:<12} {s['min']:.2%} .. {s['median']:.2%} .. {s['max']:.2%}"
            f"  meets goal {s['meets_goal']}/{s['draws']}"
        )
        if "ours_higher" in s:
            line += (
                f"  ours higher on {s['ours_higher']}/{s['draws']},"
                f" ours/theirs median {s['ours_ratio_median']:.4f}x"
            )
        print(line)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
