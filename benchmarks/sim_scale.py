"""Simulate 100,000 jobs on a 1,000-GPU cluster (goal: under 60 s), or any size against its goal.

The synthetic workload (LoRA, 8-GPU gangs, inference sweeps in bursty waves) at 1.1x load on
125 nodes x 8 GPUs, replayed through the same core as the service, one cycle per 10 s of
virtual time at most. Prints wall time per policy and the ratio to the goal for the size run:
60 s for 100,000 jobs, 120 s for 1,000,000 (on 10,000 GPUs), and between and beyond them on the
line through both in log-log (x2 per x10 jobs), since a cycle grows with the running set too.

    .venv/bin/python benchmarks/sim_scale.py [--jobs 100000] [--gpus 1000] [--policy NAME|all]
"""

from __future__ import annotations

import argparse
import math
import time

from ratios import record

from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.queue.quiet_gc import quieter_collections
from preemptible.sim import Simulator, summarize
from preemptible.sim.synth import generate, synth_config

GOAL_S = 60.0  # 100,000 jobs
GOAL_GROWTH = 2.0  # per 10x the jobs: 120 s for 1,000,000


def goal_s(jobs: int) -> float:
    """The goal for ``jobs`` jobs: 60 s for 100,000, x2 per 10x (120 s for 1,000,000)."""
    return GOAL_S * GOAL_GROWTH ** math.log10(jobs / 100_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--policy", default="preemptible")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    gpus = args.gpus - args.gpus % 8
    t = time.perf_counter()
    jobs = generate(jobs=args.jobs, gpus=gpus, seed=args.seed)
    gen_s = time.perf_counter() - t
    cfg = parse_config_text(synth_config(gpus))
    names = list(POLICIES) if args.policy == "all" else [args.policy]
    span_d = (jobs[-1].submit_s - jobs[0].submit_s) / 86400
    print(
        f"{len(jobs):,} jobs over {span_d:.1f} days on {gpus} GPUs "
        f"({gpus // 8} nodes x 8); trace generated in {gen_s:.1f} s"
    )
    print(
        f"{'policy':<12}{'wall':>9}{'vs goal':>9}{'cycles':>9}{'jobs/s':>9}"
        f"{'util':>8}{'goodput':>9}{'preempt':>9}"
    )
    goal = goal_s(len(jobs))
    for name in names:
        t = time.perf_counter()
        with quieter_collections():  # as `preemptible sim` runs it
            result = Simulator(jobs, cfg, POLICIES[name]).run()
        wall = time.perf_counter() - t
        record("sim", f"{len(jobs):,} jobs on {gpus:,} GPUs, {name}", wall, goal, "goal", goal=1.0)
        o = summarize(result)["overall"]
        print(
            f"{name:<12}{wall:>8.1f}s{wall / goal:>8.2f}x{result.cycles:>9,}"
            f"{len(jobs) / wall:>9,.0f}{o['utilization']:>8.1%}{o['goodput']:>9.1%}"
            f"{o['preemptions']:>9,}"
        )
    print(f"goal for {len(jobs):,} jobs: under {goal:.0f} s (ratio < 1.00x)")


if __name__ == "__main__":
    main()
