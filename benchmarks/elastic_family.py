"""Shrinking elastic jobs, priced vs off vs by priority alone, on draws of the workload family.

Each draw is a family draw (`preemptible.sim.family.draw_knobs`, all knobs as drawn) with
elastic ranges added: the share of elastic jobs uniform in [0.2, 0.8] and how far they may
shrink (`elastic_min_share`) uniform in [0.25, 0.75], both from the draw's own seed. Each draw
replays under `preemptible` with `[policy] elastic` off, priced (ours) and priority (the
Kueue/KAI rule). Nothing here was tuned on these draws.

    python benchmarks/elastic_family.py --draws 12 --jobs 1500 --workers 2

Prints one row per draw and policy, then the totals with ratios to `off`: lost GPU-hours (all
that preemptions and resizes cost), of which lost to preemption (evictions and the shrinks
that replace them; grows are left out), goodput, p95 wait, max wait of the least-served queue,
and on how many draws the loss to preemption is at least 30% below `off` and p95 no worse.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim import Simulator, summarize
from preemptible.sim.family import Knobs, draw_knobs, workload

MODES = ("off", "priced", "priority")


def elastic_knobs(seed: int, jobs: int | None) -> Knobs:
    """Draw `seed` of the family with elastic ranges (module docstring)."""
    rng = random.Random(f"elastic-knobs/{seed}")
    knobs = dataclasses.replace(
        draw_knobs(seed),
        elastic_fraction=rng.uniform(0.2, 0.8),
        elastic_min_share=rng.uniform(0.25, 0.75),
    )
    return dataclasses.replace(knobs, jobs=jobs) if jobs else knobs


def replay(seed: int, jobs: int | None, mode: str) -> dict[str, Any]:
    knobs = elastic_knobs(seed, jobs)
    trace, cfg = workload(knobs)
    sim = Simulator(trace, parse_config_text(cfg), POLICIES[f"preemptible+elastic={mode}"])
    result = sim.run()
    o = summarize(result)["overall"]
    keys = ("lost_gpu_s", "goodput", "p95_wait_s", "max_wait_least_served_s", "preemptions")
    row = {k: o[k] for k in keys}
    row |= {k: o.get(k, 0) for k in ("shrinks", "grows", "resize_lost_gpu_s")}
    grow_lost = sum(
        amount for rec in result.records for _, amount, kind in rec.resize_log if kind == "grow"
    )
    row["preempt_lost_gpu_s"] = o["lost_gpu_s"] - grow_lost  # evictions and shrinks
    return {"seed": seed, "mode": mode, "summary": knobs.summary(), **row}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=12, help="seeds 0 .. draws-1")
    ap.add_argument("--first", type=int, default=0, help="first seed")
    ap.add_argument("--jobs", type=int, default=1500, help="jobs per draw (0: as drawn)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    seeds = range(args.first, args.first + args.draws)
    wall = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(replay, s, args.jobs or None, m) for s in seeds for m in MODES]
        rows = [f.result() for f in futures]
    by = {(r["seed"], r["mode"]): r for r in rows}
    print(
        f"{'seed':>4} {'mode':8} {'lost GPU-h':>10} {'to preempt':>10} {'goodput':>8} "
        f"{'p95 wait':>9} {'least-served max':>16} {'preempt':>7} {'shrink':>6} {'grow':>5}"
    )
    for s in seeds:
        print(f"     {by[(s, 'off')]['summary']}")
        for m in MODES:
            r = by[(s, m)]
            print(
                f"{s:>4} {m:8} {r['lost_gpu_s'] / 3600:>10.1f} "
                f"{r['preempt_lost_gpu_s'] / 3600:>10.1f} {r['goodput']:>8.3f} "
                f"{r['p95_wait_s'] / 3600:>8.2f}h {r['max_wait_least_served_s'] / 3600:>15.1f}h "
                f"{r['preemptions']:>7} {r['shrinks']:>6} {r['grows']:>5}"
            )
    n = len(seeds)
    print(f"\ntotals over {n} draws ({time.perf_counter() - wall:.0f}s wall); ratios to off:")
    print(
        f"{'mode':8} {'lost GPU-h':>10} {'ratio':>6} {'to preempt':>10} {'ratio':>6} "
        f"{'goodput':>8} {'p95 wait':>9} {'ratio':>6} {'least-served':>12} {'ratio':>6} "
        f"{'<=70% lost':>10} {'p95 <=':>7}"
    )
    keys = ("lost_gpu_s", "preempt_lost_gpu_s", "goodput", "p95_wait_s", "max_wait_least_served_s")
    base = {k: sum(by[(s, "off")][k] for s in seeds) for k in keys}
    for m in MODES:
        tot = {k: sum(by[(s, m)][k] for s in seeds) for k in keys}
        cut = sum(
            by[(s, m)]["preempt_lost_gpu_s"] <= 0.7 * by[(s, "off")]["preempt_lost_gpu_s"]
            for s in seeds
        )
        p95_ok = sum(by[(s, m)]["p95_wait_s"] <= by[(s, "off")]["p95_wait_s"] for s in seeds)
        print(
            f"{m:8} {tot['lost_gpu_s'] / 3600:>10.1f} {tot['lost_gpu_s'] / base['lost_gpu_s']:>6.2f} "
            f"{tot['preempt_lost_gpu_s'] / 3600:>10.1f} "
            f"{tot['preempt_lost_gpu_s'] / base['preempt_lost_gpu_s']:>6.2f} "
            f"{tot['goodput'] / n:>8.3f} {tot['p95_wait_s'] / n / 3600:>8.2f}h "
            f"{tot['p95_wait_s'] / base['p95_wait_s']:>6.2f} "
            f"{tot['max_wait_least_served_s'] / n / 3600:>11.1f}h "
            f"{tot['max_wait_least_served_s'] / base['max_wait_least_served_s']:>6.2f} "
            f"{cut:>7}/{n} {p95_ok:>4}/{n}"
        )


if __name__ == "__main__":
    main()
