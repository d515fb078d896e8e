"""Could any policy meet the policy family's four goals? A schedule or a proof, per small draw.

A small draw is a family draw (`policy_family.py`) with every knob as drawn except its size: N
jobs on a G-GPU cluster that is one pool, gangs of G/4 GPUs. Each is replayed under the five
policies, which set the goals' bounds; then two CP-SAT models over its jobs decide, where they
can, whether some schedule meets all four goals (`preemptible.sim.evaluation.oracle` says how):
a **witness**, a hindsight schedule that meets them, or a **refutation**, a relaxation of every
schedule the simulator could play that has no solution.

A draw is **reachable** (witness found), **out of reach** (refutation infeasible) or **open**
(neither within the time limit, or the relaxation too loose to decide). Needs `ortools` (the
`oracle` extra, in `dev` too).

    .venv/bin/python benchmarks/policy_oracle.py [--draws 40] [--seed-base 0] [--jobs 60]
        [--gpus 64] [--time-limit 60] [--workers N] [--only SEED[,SEED]] [--json out.json]

CP-SAT runs one search worker per model, so a verdict reached within the limit is the same on
every run; what the limit cuts off (open) can depend on the machine's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from preemptible.sim.evaluation.family_goals import GOALS
from preemptible.sim.evaluation.oracle import VERDICTS, one_draw, tally
from preemptible.sim.family import parse_seeds


def run(
    seeds: list[int], jobs: int, gpus: int, time_limit_s: float, workers: int
) -> list[dict[str, Any]]:
    """Every draw, in parallel; in seed order."""
    with ProcessPoolExecutor(workers) as pool:
        futures = {pool.submit(one_draw, s, jobs, gpus, time_limit_s): s for s in seeds}
        done = []
        for future in as_completed(futures):
            d = future.result()
            print(f"draw {d['seed']}: {d['oracle']['verdict']}", file=sys.stderr, flush=True)
            done.append(d)
    return sorted(done, key=lambda d: d["seed"])


def _goals(d: dict[str, Any]) -> str:
    return "".join("+" if d["goals"][g]["met"] else "-" for g in GOALS)


def _models(o: dict[str, Any]) -> str:
    text = f"witness {o['witness']['outcome']} {o['witness']['wall_s']:.1f}s"
    if "refutation" in o:
        r = o["refutation"]
        text += f", refutation {r['outcome']} {r['wall_s']:.1f}s ({r['dropped']} dropped)"
    return text


def print_report(draws: list[dict[str, Any]], flags: str, wall: float) -> None:
    print("draw  ours' goals 1-4  kueue lost GPU-h  verdict        models")
    for d in draws:
        o = d["oracle"]
        print(
            f"{d['seed']:>4}  {_goals(d):<15}  {d['kueue_lost_gpu_h']:>16.2f}  "
            f"{o['verdict']:<13}  {_models(o)}"
        )
    t = tally(draws)
    n = len(draws)
    print(f"\n{n} small draws ({flags}), {wall:.0f}s wall:")
    for v in VERDICTS:
        print(f"  {v:<13} {t['verdicts'][v]:>3} of {n}")
    counts = ", ".join(f"{p} {k}" for p, k in t["all_four"].items())
    print(f"  all four goals met by: {counts} (each judged against the other four)")
    print(f"  ours' four goals met by one of the five policies: {t['some_policy']} of {n}")
    print(f"  ours meets all four on {t['ours_where_reachable']} of the reachable draws")


def seeds_arg(parser: argparse.ArgumentParser, option: str, text: str) -> list[int]:
    """Seeds given as ``1,4,9``; exits with a usage error otherwise."""
    try:
        return parse_seeds(text)
    except ValueError as exc:
        parser.error(f"{option} {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=40, help="how many draws (%(default)s)")
    parser.add_argument("--seed-base", type=int, default=0, help="first seed (%(default)s)")
    parser.add_argument("--only", metavar="SEED[,SEED]", help="these draws only")
    parser.add_argument("--jobs", type=int, default=60, help="jobs per draw (%(default)s)")
    parser.add_argument(
        "--gpus", type=int, default=64, help="GPUs, in one pool; at least 36 (%(default)s)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        help="seconds per model and draw before it is left open (%(default)s)",
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="draws in parallel (%(default)s)"
    )
    parser.add_argument("--json", type=Path, help="also write every draw's numbers here")
    args = parser.parse_args()
    if args.jobs < 20:
        parser.error(
            f"--jobs must be 20 or more (the p95 needs a 5% to leave out), not {args.jobs}"
        )
    if args.gpus < 36:
        parser.error(
            f"--gpus must be 36 or more (gangs of a quarter outgrow a node), not {args.gpus}"
        )
    if args.draws < 1 or args.workers < 1 or args.seed_base < 0 or args.time_limit <= 0:
        parser.error("--draws, --workers and --time-limit must be positive, --seed-base 0 or more")
    seeds = (
        seeds_arg(parser, "--only", args.only)
        if args.only
        else list(range(args.seed_base, args.seed_base + args.draws))
    )
    started = time.perf_counter()
    draws = run(seeds, args.jobs, args.gpus, args.time_limit, args.workers)
    wall = time.perf_counter() - started
    flags = f"--jobs {args.jobs} --gpus {args.gpus} --time-limit {args.time_limit:g}"
    print_report(draws, flags, wall)
    if args.json:
        args.json.write_text(json.dumps({"draws": draws, "tally": tally(draws)}, indent=1))


if __name__ == "__main__":
    main()
