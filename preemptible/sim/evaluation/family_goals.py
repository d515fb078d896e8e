"""The four goals of the policy family, judged on one draw, and the numbers they read.

A draw (`preemptible.sim.family`) is replayed under fifo, priority, kueue, slurm and ours with
checkpoint-aware jobs (`replay`); `judge` then says, for ours or any other policy judged
against the rest, whether it meets each goal:

1. goodput at least kueue's and at least the best baseline's minus 2 points;
2. overall p95 wait at most 1.1x the lowest of the four baselines';
3. least-served max wait at most 1.1x the lowest of priority's, kueue's and slurm's (the
   baselines that respect tiers);
4. lost GPU-hours under 1% of delivered, and at most half of kueue's.

Waits under 60 s count as 60 s, as on the named traces (`trace_goals.floored`). `PROPOSED`
reads the goals as docs/evaluation/policy-evaluation.md proposes: the p95 wait against the
baselines that respect tiers, the least-served max wait against those that also let work pass
a blocked job, and lost work under 0.1% of delivered as within kueue's bound.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, NamedTuple

from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim.engine import SimOptions, Simulator
from preemptible.sim.evaluation.trace_goals import floored
from preemptible.sim.failures import FailureRates
from preemptible.sim.family import Knobs, workload
from preemptible.sim.kpis import summarize
from preemptible.sim.trace import TraceJob

OURS = "preemptible"
BASELINES = ("fifo", "priority", "kueue", "slurm")
TIER_RESPECTING = ("priority", "kueue", "slurm", OURS)
"""Policies that never let a lower tier pass a higher one (fifo ignores tiers)."""
QUOTA_BASELINE = "kueue"
"""The baseline that enforces the same quotas as ours."""
PASSING = ("kueue", "slurm", OURS)
"""Tier-respecting policies that let work pass a blocked job (priority holds every GPU for its
head)."""
GOALS = ("goodput", "p95_wait", "least_served", "lost")
GOAL_TITLES = {
    "goodput": "1. goodput >= kueue's and >= best baseline's - 2 points",
    "p95_wait": "2. overall p95 wait <= 1.1x best baseline's",
    "least_served": "3. least-served max wait <= 1.1x best of priority, kueue, slurm",
    "lost": "4. lost < 1% of delivered and <= half of kueue's",
}
READING_TITLES = {
    "goodput": GOAL_TITLES["goodput"],
    "p95_wait": "2. overall p95 wait <= 1.1x best of priority, kueue, slurm",
    "least_served": "3. least-served max wait <= 1.1x best of kueue, slurm",
    "lost": "4. lost < 1% of delivered and (<= half of kueue's or < 0.1%)",
}
HELD_OUT_REFERENCE = {
    "fifo": (0.913, 30.9, 39.1, 18.0, 0.0),
    "priority": (0.867, 4.3 * 24, 5.7 * 24, 18.4, 0.0),
    "kueue": (0.879, 47.0, 9.0 * 24, 11.4, 800.0),
    "slurm": (0.868, 29.4, 7.1 * 24, 9.1, 0.0),
    OURS: (0.874, 42.6, 8.9 * 24, 10.9, 190.0),
}
"""The reference numbers published with the held-out workload's description (which
`family.held_out_workload` follows), per policy: goodput, p95 wait h, least-served max wait h,
mean JCT h, lost GPU-h."""


class Reading(NamedTuple):
    """How the goals are read: against which peers each wait is judged, and below which share
    of delivered the lost work meets the half-of-kueue bound whatever kueue loses."""

    p95_peers: tuple[str, ...]
    least_served_peers: tuple[str, ...]
    lost_floor: float


AS_WRITTEN = Reading((*BASELINES, OURS), TIER_RESPECTING, 0.0)
"""The four goals as written."""
PROPOSED = Reading(TIER_RESPECTING, PASSING, 0.001)
"""The readings proposed in docs/evaluation/policy-evaluation.md: fifo ignores tiers, priority
lets no work pass its blocked head, and where kueue loses nothing half of it allows no
preemption."""


@functools.cache
def _workload(knobs: Knobs) -> tuple[list[TraceJob], str]:
    """Generated once per worker process and draw (each policy's task needs the same)."""
    return workload(knobs)


def replay(
    knobs: Knobs,
    policy: str,
    switches: dict[str, bool] | None = None,
    failures: FailureRates | None = None,
) -> dict[str, Any]:
    """One draw under one policy (ours with `switches` changed): the numbers the goals read.

    goodput is `goodput_while_arriving` (held minus lost GPU-seconds over those offered from
    the first to the last submission); delivered GPU-hours count lost work too, as
    `lost_share_of_delivered` divides by. With `failures`, jobs crash and hang as drawn
    (the same jobs after the same GPU-hours of running under every policy): goodput is less
    their loss too, lost GPU-hours (goal 4) stay preemptions' alone, and the failures'
    counts and cost come with the numbers.
    """
    jobs, cfg = _workload(knobs)
    started = time.perf_counter()
    rules = POLICIES[policy]
    if policy == OURS and switches:
        changes: dict[str, Any] = dict(switches)
        rules = dataclasses.replace(rules, **changes)
    options = SimOptions(failures=failures or FailureRates())
    o = summarize(Simulator(jobs, parse_config_text(cfg), rules, options).run())["overall"]
    submits = [j.submit_s for j in jobs]
    return _failure_numbers(o) | {
        "policy": policy,
        "goodput": o["goodput_while_arriving"],
        "p95_wait_s": o["p95_wait_s"],
        "least_served_max_wait_s": o["max_wait_least_served_s"],
        "least_served_queue": o["least_served_queue"],
        "mean_jct_s": o["mean_jct_s"],
        "lost_gpu_h": o["lost_gpu_s"] / 3600.0,
        "delivered_gpu_h": o["gpu_s_admitted"] / 3600.0,
        "offered_gpu_h": o["gpus"] * (max(submits) - min(submits)) / 3600.0,
        "lost_gpu_h_by_kind": {k: v / 3600.0 for k, v in o["lost_gpu_s_by_kind"].items()},
        "demand_ratio": o["demand_ratio"],
        "preemptions": o["preemptions"],
        "jobs": o["jobs"],
        "wall_s": time.perf_counter() - started,
    }


def _failure_numbers(overall: dict[str, Any]) -> dict[str, Any]:
    """What crashes and hangs cost a replay (nothing where it models none)."""
    if "crashes" not in overall:
        return {}
    return {
        "crashes": overall["crashes"],
        "hangs": overall["hangs"],
        "jobs_failed": overall["jobs_failed"],
        "failure_lost_gpu_h": overall["failure_lost_gpu_s"] / 3600.0,
        "unfinished_gpu_h": overall["unfinished_gpu_s"] / 3600.0,
    }


def _best(metrics: dict[str, dict[str, Any]], among: list[str], key: str, *, low: bool) -> str:
    """The policy of `among` with the lowest (or highest) `key`; ties go to the first listed."""
    pick = min if low else max
    return pick(among, key=lambda p: metrics[p][key])


def judge(
    metrics: dict[str, dict[str, Any]], judged: str = OURS, reading: Reading = AS_WRITTEN
) -> dict[str, dict[str, Any]]:
    """The four goals for `judged` on one draw, given every policy's numbers (`replay`'s).

    Against the other policies: the "best baseline" is the best of the others, each wait's
    peers are the others that `reading` names for it, and the quota peer is kueue (ours where
    kueue is judged). For ours read `AS_WRITTEN` these are exactly the baselines the goals
    name. Each goal gives `met`, the numbers compared, and `excess`: how far past its bound the
    judged policy is (above 0: missed; the worst draws are those with the largest): in points
    of goodput for goal 1, as the ratio to the bound minus 1 for the waits, and for lost work
    as the GPU-hours lost beyond the smaller bound, as a share of delivered. Goals 1 and 4
    also say which of their two bounds held (`vs_quota_peer`, `vs_best`, `under_1pct`).
    """
    others = [p for p in metrics if p != judged]
    quota_peer = QUOTA_BASELINE if judged != QUOTA_BASELINE else OURS
    m = metrics[judged]
    out: dict[str, dict[str, Any]] = {}

    # 1. goodput: the binding bound is the higher of the quota peer's and best - 2 points.
    best = _best(metrics, others, "goodput", low=False)
    bound = max(metrics[quota_peer]["goodput"], metrics[best]["goodput"] - 0.02)
    out["goodput"] = {
        "ours": m["goodput"],
        "best": metrics[best]["goodput"],
        "best_policy": best,
        "quota_peer": metrics[quota_peer]["goodput"],
        "excess": bound - m["goodput"],
        "vs_quota_peer": m["goodput"] >= metrics[quota_peer]["goodput"],
        "vs_best": m["goodput"] >= metrics[best]["goodput"] - 0.02,
        "met": m["goodput"] >= bound,
    }
    # 2. and 3. waits: at most 1.1x the lowest of the peers'.
    for goal, key, named in (
        ("p95_wait", "p95_wait_s", reading.p95_peers),
        ("least_served", "least_served_max_wait_s", reading.least_served_peers),
    ):
        peers = [p for p in others if p in named]
        best = _best(metrics, peers, key, low=True)
        ratio = floored(m[key]) / floored(metrics[best][key])
        out[goal] = {
            "ours": m[key],
            "best": metrics[best][key],
            "best_policy": best,
            "ratio": ratio,
            "excess": ratio / 1.1 - 1.0,
            "met": ratio <= 1.1,
        }
    # 4. lost work: under 1% of delivered and at most half the quota peer's (or, read so,
    # under the floor).
    share = m["lost_gpu_h"] / m["delivered_gpu_h"] if m["delivered_gpu_h"] else 0.0
    half = 0.5 * metrics[quota_peer]["lost_gpu_h"]
    floor = reading.lost_floor * m["delivered_gpu_h"]
    allowed = min(0.01 * m["delivered_gpu_h"], max(half, floor))
    out["lost"] = {
        "ours": m["lost_gpu_h"],
        "share": share,
        "quota_peer": metrics[quota_peer]["lost_gpu_h"],
        "excess": (m["lost_gpu_h"] - allowed) / max(m["delivered_gpu_h"], 1e-9),
        "under_1pct": share < 0.01,
        "vs_quota_peer": m["lost_gpu_h"] <= half,
        "met": share < 0.01 and (m["lost_gpu_h"] <= half or share < reading.lost_floor),
    }
    out["all"] = {"met": all(out[g]["met"] for g in GOALS)}
    return out
