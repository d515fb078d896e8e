"""Ratios against a peer or a goal, collected across benchmark scripts for one table.

Each script prints its own report as before and, through `record`, also appends each ratio it
prints to the JSON-lines file named by ``PREEMPTIBLE_BENCH_RATIOS`` (when that is set, as
`benchmarks/summary.py`, behind ``make bench``, sets it). A ratio is always ours / the peer's (or
/ the goal), so below 1.00x is better where lower is better.
"""

from __future__ import annotations

import json
import os

ENV = "PREEMPTIBLE_BENCH_RATIOS"


def record(
    benchmark: str,
    measure: str,
    ours: float,
    peer: float,
    against: str,
    *,
    unit: str = "s",
    goal: float | None = None,
) -> None:
    """One ratio `ours / peer`: `against` names the peer (or "goal"); `goal` is the largest
    ratio that meets the goal, if the measure has one."""
    path = os.environ.get(ENV)
    if not path:
        return
    row = {
        "benchmark": benchmark,
        "measure": measure,
        "ours": ours,
        "peer": peer,
        "against": against,
        "unit": unit,
        "ratio": ours / peer if peer else float("inf"),
        "goal": goal,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
