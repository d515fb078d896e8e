"""What the family's draws add up to: per-draw reports, goal counts, the worst draws, the
ceiling of choosing the best known policy per draw with hindsight, and what crashes and hangs
cost each policy.

Every function reads the reports of `draw_report`, one per draw, as `benchmarks/policy_family.py`
writes them to its `--json` file, so a saved run can be summed up again without a replay.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from preemptible.sim.evaluation.family_goals import (
    BASELINES,
    GOALS,
    OURS,
    PROPOSED,
    QUOTA_BASELINE,
    judge,
)
from preemptible.sim.family import Knobs

WORST = 3
"""Worst draws named per goal."""
CLAUSES = {
    "goodput": {"vs_quota_peer": ">= kueue's", "vs_best": ">= best - 2 points"},
    "lost": {"under_1pct": "< 1% of delivered", "vs_quota_peer": "<= half of kueue's"},
}
"""The two bounds of goals 1 and 4, counted apart for ours."""
FAILURE_KEYS = ("crashes", "hangs", "jobs_failed", "failure_lost_gpu_h", "unfinished_gpu_h")
"""What `family_goals.replay` says of a run's crashes and hangs, summed over the draws."""


def draw_report(name: str, knobs: Knobs, metrics: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One draw: its knobs, every policy's numbers, ours judged, and every policy judged (as
    written and under the proposed readings)."""
    return {
        "name": name,
        "seed": knobs.seed,
        "knobs": dataclasses.asdict(knobs),
        "summary": knobs.summary(),
        "policies": metrics,
        "goals": judge(metrics),
        "goals_by_policy": {p: judge(metrics, p) for p in metrics},
        "proposed_by_policy": {p: judge(metrics, p, PROPOSED) for p in metrics},
    }


def counts(draws: list[dict[str, Any]], key: str = "goals_by_policy") -> dict[str, dict[str, int]]:
    """Per policy, on how many draws it meets each goal and all four together (as written, or
    under the proposed readings with `key="proposed_by_policy"`)."""
    out: dict[str, dict[str, int]] = {}
    for d in draws:
        for policy, goals in d[key].items():
            n = out.setdefault(policy, dict.fromkeys((*GOALS, "all"), 0))
            for goal in (*GOALS, "all"):
                n[goal] += goals[goal]["met"]
    return out


def clause_counts(draws: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """For goals 1 and 4, on how many draws ours meets each of the two bounds."""
    return {
        goal: {c: sum(d["goals"][goal][c] for d in draws) for c in names}
        for goal, names in CLAUSES.items()
    }


def lost_by_kind(draws: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Ours' lost GPU-hours per rule that sent the notice (`PreemptKind`): summed over all
    draws, and over the draws where ours misses goal 4."""
    out: dict[str, tuple[float, float]] = {}
    for d in draws:
        missed = not d["goals"]["lost"]["met"]
        for kind, lost in d["policies"][OURS]["lost_gpu_h_by_kind"].items():
            total, on_misses = out.get(kind, (0.0, 0.0))
            out[kind] = (total + lost, on_misses + lost * missed)
    return out


def gain_per_lost(draws: list[dict[str, Any]]) -> dict[str, float]:
    """Where ours misses goal 4 only for losing more than half of what kueue loses: per draw,
    the useful GPU-hours ours delivers beyond kueue's while jobs arrive (the goodput goal's
    window), per GPU-hour ours loses; above 0 where ours' goodput is above kueue's."""
    out = {}
    for d in draws:
        lost = d["goals"]["lost"]
        if lost["met"] or not lost["under_1pct"]:
            continue
        ours, kueue = d["policies"][OURS], d["policies"][QUOTA_BASELINE]
        gained = (ours["goodput"] - kueue["goodput"]) * ours["offered_gpu_h"]
        out[d["name"]] = gained / ours["lost_gpu_h"]
    return out


def worst(draws: list[dict[str, Any]], goal: str, n: int = WORST) -> list[dict[str, Any]]:
    """The `n` draws where ours is furthest past the goal's bound (missed or not), worst first."""
    return sorted(draws, key=lambda d: (-d["goals"][goal]["excess"], d["seed"]))[:n]


def ceiling(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """What choosing, per draw and with hindsight, the best of several known policies would
    meet: each run's ours (one variant per run, named by its key) and the four baselines of the
    first run, each judged as ours is, against the same four baselines.

    A draw counts for a goal when some candidate meets it there, and for all four when one
    candidate meets all four. Not a bound on what any policy could do: a yardstick for the
    target, from schedules that exist.
    """
    first = next(iter(runs.values()))
    by_name = [{d["name"]: d for d in draws} for draws in runs.values()]
    met = dict.fromkeys((*GOALS, "all"), 0)
    per_draw: dict[str, list[str]] = {}
    for d in first:
        base = {p: d["policies"][p] for p in BASELINES}
        candidates = dict(base)
        for label, draws in zip(runs, by_name, strict=True):
            if d["name"] not in draws:
                raise ValueError(f"{label} lacks draw {d['name']}")
            candidates[label] = draws[d["name"]]["policies"][OURS]
        judged = {c: judge({**base, OURS: m}) for c, m in candidates.items()}
        for goal in (*GOALS, "all"):
            met[goal] += any(g[goal]["met"] for g in judged.values())
        per_draw[d["name"]] = [c for c, g in judged.items() if g["all"]["met"]]
    return {
        "candidates": [*BASELINES, *runs],
        "draws": len(first),
        "met": met,
        "per_draw": per_draw,
    }


def failure_summary(
    draws: list[dict[str, Any]], without: list[dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Per policy, over the draws of a run with crashes and hangs: median goodput, the draws
    meeting the goodput goal, on how many draws ours' goodput is higher (for a baseline), the
    failures and what they cost. With `without`, the same draws run without failures (by
    name): the median goodput there, ours higher there, and the median change per draw.

    Raises:
        ValueError: a draw of `draws` is missing from `without`.
    """
    earlier = {d["name"]: d for d in without or []}
    missing = [d["name"] for d in draws if without is not None and d["name"] not in earlier]
    if missing:
        raise ValueError(f"the run without failures lacks the draws {', '.join(missing[:5])}")
    out: dict[str, dict[str, Any]] = {}
    for policy in (*BASELINES, OURS):
        runs = [d["policies"][policy] for d in draws]
        goodput = [r["goodput"] for r in runs]
        row: dict[str, Any] = {
            "median_goodput": statistics.median(goodput),
            "goodput_goal_met": sum(d["goals_by_policy"][policy]["goodput"]["met"] for d in draws),
            **{key: sum(r[key] for r in runs) for key in FAILURE_KEYS},
            "failure_lost_share": sum(r["failure_lost_gpu_h"] for r in runs)
            / max(sum(r["delivered_gpu_h"] for r in runs), 1e-9),
        }
        if policy != OURS:
            row["ours_higher"] = _ours_higher(draws, policy)
        if without is not None:
            before = [earlier[d["name"]]["policies"][policy]["goodput"] for d in draws]
            row["median_goodput_without"] = statistics.median(before)
            row["median_change"] = statistics.median(
                g - b for g, b in zip(goodput, before, strict=True)
            )
            if policy != OURS:
                row["ours_higher_without"] = _ours_higher(
                    [earlier[d["name"]] for d in draws], policy
                )
        out[policy] = row
    return out


def _ours_higher(draws: list[dict[str, Any]], policy: str) -> int:
    """On how many draws ours' goodput is above `policy`'s."""
    return sum(d["policies"][OURS]["goodput"] > d["policies"][policy]["goodput"] for d in draws)
