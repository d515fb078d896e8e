"""Goodput over draws of the arrival order: how much of a trace's goodput is one run's luck.

A replay is chaotic: moving every submission by up to a couple of seconds changes which of two
close decisions wins, and with it a few tenths of a point of goodput. One run cannot tell
whether a policy meets `GOODPUT_GOAL` on a trace whose goodput sits near it. `replay` runs one
policy on one draw (draw 0: the trace as recorded, otherwise `named_traces.jittered`, the same
moved jobs for every policy) and `by_policy` sums the draws up, ours against each peer.
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path
from typing import Any

from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim.engine import Simulator
from preemptible.sim.evaluation.named_traces import jittered, load_named
from preemptible.sim.evaluation.trace_goals import GOODPUT_GOAL
from preemptible.sim.kpis import summarize
from preemptible.sim.trace import TraceJob


@functools.cache
def _load(trace: str, shared: Path) -> tuple[list[TraceJob], str]:
    """The trace, imported once per worker process (every replay of a worker reads the same)."""
    return load_named(trace, shared)


def replay(trace: str, shared: Path, draw: int, jitter_s: float, policy: str) -> dict[str, Any]:
    """One policy on one draw of a named trace (draw 0: as recorded): goodput while arriving,
    lost share of delivered, preemptions and the replay's wall time."""
    jobs, cfg_text = _load(trace, shared)
    if draw:
        jobs = jittered(jobs, jitter_s, draw)
    started = time.perf_counter()
    o = summarize(Simulator(jobs, parse_config_text(cfg_text), POLICIES[policy]).run())["overall"]
    return {
        "draw": draw,
        "policy": policy,
        "goodput_while_arriving": o["goodput_while_arriving"],
        "lost_share_of_delivered": o["lost_share_of_delivered"],
        "preemptions": o["preemptions"],
        "wall_s": time.perf_counter() - started,
    }


def by_policy(runs: list[dict[str, Any]], ours: str = "preemptible") -> dict[str, dict[str, Any]]:
    """Per policy: goodput range over the draws, draws meeting the goal, and (for a peer) on how
    many draws ours has the higher goodput and the median of ours / theirs."""
    goodput: dict[str, dict[int, float]] = {}
    for r in runs:
        goodput.setdefault(r["policy"], {})[r["draw"]] = r["goodput_while_arriving"]
    out: dict[str, dict[str, Any]] = {}
    for policy, per_draw in goodput.items():
        values = list(per_draw.values())
        row: dict[str, Any] = {
            "draws": len(values),
            "min": min(values),
            "median": statistics.median(values),
            "max": max(values),
            "meets_goal": sum(v >= GOODPUT_GOAL for v in values),
        }
        if policy != ours and ours in goodput:
            common = sorted(per_draw.keys() & goodput[ours].keys())
            row["ours_higher"] = sum(goodput[ours][d] > per_draw[d] for d in common)
            row["ours_ratio_median"] = statistics.median(
                goodput[ours][d] / per_draw[d] for d in common
            )
        out[policy] = row
    return out
