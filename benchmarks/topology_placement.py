"""GPU ids by topology against the lowest free ids, under our policy and the four baselines.

Each workload is a draw of the workload family (`preemptible.sim.family`, or its held-out
workload), always on 8-GPU nodes (a family draw without nodes gets them), replayed under fifo,
priority, kueue, slurm and preemptible twice: with each node's GPUs in NVLink islands
(`--node-topology`) and jobs given GPU ids as the queue manager gives them
(`--placement topology`), and given the lowest free ids (`--placement lowest`, what the manager
did before). A job whose GPUs on some node span islands runs `1 + --split-slowdown` times
slower. Per policy it prints, under each placement: the share of multi-GPU jobs that ran split,
those split needlessly (over more islands on a node than their GPUs there need), the share of
idle GPU-hours in partly used islands, goodput (`goodput_while_arriving`, as the family's goal
reads it), and the change from lowest to topology in goodput (points), mean JCT and p95 wait
(ratios). Medians over the workloads. Same seeds, same numbers.

    .venv/bin/python benchmarks/topology_placement.py [--draws 4] [--seed-base 0] [--jobs N]
        [--held-out] [--node-topology 2x4] [--split-slowdown 0.3] [--workers N] [--json FILE]
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

from preemptible.errors import PreemptibleError
from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim import SimOptions, Simulator, summarize
from preemptible.sim.family import GPUS_PER_NODE, Knobs, draw_knobs, held_out_knobs, workload
from preemptible.sim.gpu_ids import NodeTopology, PlacementMode

PLACEMENTS = (PlacementMode.LOWEST, PlacementMode.TOPOLOGY)


def replay(knobs: Knobs, policy: str, layout: NodeTopology) -> dict[str, Any]:
    """One workload under one policy and one placement: the numbers the table reads."""
    jobs, cfg = workload(knobs)
    started = time.perf_counter()
    options = SimOptions(node_topology=layout)
    o = summarize(Simulator(jobs, parse_config_text(cfg), POLICIES[policy], options).run())
    overall = o["overall"]
    return {
        "policy": policy,
        "placement": layout.placement.value,
        "jobs_split_share": overall["jobs_split_share"],
        "jobs_split_needlessly": overall["jobs_split_needlessly"],
        "multi_gpu_jobs": sum(j.gpus > 1 for j in jobs),
        "split_gpu_h": overall["split_gpu_s"] / 3600.0,
        "island_fragmentation": overall["island_fragmentation"],
        "goodput": overall["goodput_while_arriving"],
        "mean_jct_s": overall["mean_jct_s"],
        "p95_wait_s": overall["p95_wait_s"],
        "wall_s": time.perf_counter() - started,
    }


def run(
    draws: dict[str, Knobs], layout: NodeTopology, workers: int
) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Every workload x policy x placement, in parallel: draw -> policy -> placement -> numbers."""
    got: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
        name: {p: {} for p in POLICIES} for name in draws
    }
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(replay, knobs, policy, dataclasses.replace(layout, placement=mode)): name
            for name, knobs in draws.items()
            for policy in reversed(list(POLICIES))  # ours, the slowest, first
            for mode in PLACEMENTS
        }
        for future in as_completed(futures):
            r = future.result()
            got[futures[future]][r["policy"]][r["placement"]] = r
            print(
                f"[{time.perf_counter() - started:5.0f}s] {futures[future]} {r['policy']} "
                f"{r['placement']} ({r['wall_s']:.1f}s)",
                file=sys.stderr,
                flush=True,
            )
    return got


def summary_rows(got: dict[str, dict[str, dict[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per policy, medians over the workloads of each placement's numbers and of the changes."""
    rows = []
    for policy in POLICIES:
        runs = [got[name][policy] for name in got]
        row: dict[str, Any] = {"policy": policy}
        for mode in PLACEMENTS:
            for key in ("jobs_split_share", "island_fragmentation", "goodput"):
                row[f"{key}_{mode}"] = statistics.median(r[mode][key] for r in runs)
            row[f"needless_share_{mode}"] = statistics.median(
                r[mode]["jobs_split_needlessly"] / max(r[mode]["multi_gpu_jobs"], 1) for r in runs
            )
        low, top = PlacementMode.LOWEST, PlacementMode.TOPOLOGY
        row["goodput_change_points"] = statistics.median(
            100 * (r[top]["goodput"] - r[low]["goodput"]) for r in runs
        )
        for key in ("mean_jct_s", "p95_wait_s"):
            row[f"{key}_ratio"] = statistics.median(
                r[top][key] / r[low][key] if r[low][key] else 1.0 for r in runs
            )
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of docs/evaluation/policy-evaluation.md."""
    out = [
        "| policy | split (lowest / topology) | needlessly split | idle in partly used islands "
        "| goodput lowest | goodput topology | change (points) | mean JCT | p95 wait |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['policy']} "
            f"| {_pct(r['jobs_split_share_lowest'])} / {_pct(r['jobs_split_share_topology'])} "
            f"| {_pct(r['needless_share_lowest'])} / {_pct(r['needless_share_topology'])} "
            f"| {_pct(r['island_fragmentation_lowest'])} / "
            f"{_pct(r['island_fragmentation_topology'])} "
            f"| {_pct(r['goodput_lowest'], 2)} | {_pct(r['goodput_topology'], 2)} "
            f"| {r['goodput_change_points']:+.2f} | {r['mean_jct_s_ratio']:.3f}x "
            f"| {r['p95_wait_s_ratio']:.3f}x |"
        )
    return "\n".join(out)


def _pct(value: float, digits: int = 1) -> str:
    return f"{100 * value:.{digits}f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4, help="family draws (%(default)s)")
    parser.add_argument("--seed-base", type=int, default=0, help="first draw's seed (%(default)s)")
    parser.add_argument("--jobs", type=int, metavar="N", help="give every workload N jobs")
    parser.add_argument(
        "--held-out", action="store_true", help="the held-out workload (seed 0) instead"
    )
    parser.add_argument("--node-topology", default="2x4", help="ISLANDSxGPUS (%(default)s)")
    parser.add_argument(
        "--split-slowdown", type=float, default=0.3, help="a split job's 1+F (%(default)s)"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="also write every replay's numbers here")
    args = parser.parse_args()
    try:
        layout = NodeTopology.parse(args.node_topology, None, args.split_slowdown)
    except PreemptibleError as exc:
        parser.error(str(exc))
    if layout.islands * layout.gpus_per_island != GPUS_PER_NODE:
        parser.error(f"--node-topology must make the family's {GPUS_PER_NODE} GPUs per node")
    if args.draws < 1 or args.workers < 1 or (args.jobs is not None and args.jobs < 1):
        parser.error("--draws, --workers and --jobs must be 1 or more")
    if args.held_out:
        draws = {"held-out-0": held_out_knobs(0)}
    else:
        seeds = range(args.seed_base, args.seed_base + args.draws)
        draws = {str(s): draw_knobs(s) for s in seeds}
    draws = {
        name: dataclasses.replace(
            k, gpus_per_node=GPUS_PER_NODE, jobs=args.jobs if args.jobs is not None else k.jobs
        )
        for name, k in draws.items()
    }
    started = time.perf_counter()
    got = run(draws, layout, args.workers)
    wall = time.perf_counter() - started
    rows = summary_rows(got)
    print(
        f"{len(draws)} workload(s), nodes of {layout.islands} NVLink islands of "
        f"{layout.gpus_per_island} GPUs, a split job {1 + layout.split_slowdown:g}x slower; "
        f"{wall:.0f} s of wall time on {args.workers} worker(s); medians over the workloads"
    )
    for name, k in draws.items():
        print(f"  {name}: {k.summary()}")
    print(markdown(rows))
    if args.json is not None:
        args.json.write_text(json.dumps({"replays": got, "summary": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
