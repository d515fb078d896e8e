"""The goals on the named traces: ours against every other policy, and how much they ask.

Per trace, given every policy's `summarize()` result, `checks` says whether the judged policy

- keeps goodput at or above `GOODPUT_GOAL` while jobs arrive, where demand exceeds supply;
- loses under 1% of the GPU-hours it delivers;
- keeps every queue's p95 wait within 1.1x the best other policy's for that queue;
- keeps the least-served queue's max wait lower than every other policy's.

Waits under a minute count as a minute (`floored`), so that a few seconds against zero is no
failure. Judging each policy in turn by the same wait goals (`peer_counts`) measures how much
the goals ask of any policy, not only of ours.
"""

from __future__ import annotations

from typing import Any

from preemptible.queue.core import POLICIES

WAIT_FLOOR_S = 60.0
"""Waits shorter than this count as this long when two waits are compared."""
GOODPUT_GOAL = 0.90
"""Goodput while arriving asked for where demand exceeds supply."""


def floored(wait_s: float) -> float:
    """Waits under 60 s count as 60 s, so that a few seconds against zero is not a failure."""
    return max(wait_s, WAIT_FLOOR_S)


def checks(policies: dict[str, Any], judged: str = "preemptible") -> dict[str, Any]:
    """The goals for `judged`, against every other policy in `policies` (`summarize()` results
    by policy name).

    Also two milder readings of the wait goals: each queue's p95 against the same queue under
    the one policy with the best overall p95, and the longest wait against the policies that
    enforce the same quotas (those with `Policy.quotas`, kueue), since a policy without quotas
    may serve a job beyond its queue's quota in turn, which the quota guarantee rules out.
    """
    others = [p for p in policies if p != judged]
    o = policies[judged]["overall"]
    single_best = min(others, key=lambda p: policies[p]["overall"]["p95_wait_s"])
    worst_q, worst_ratio, single_ratio = "", 0.0, 0.0
    for q, m in policies[judged]["queues"].items():
        best = min(policies[b]["queues"][q]["p95_wait_s"] for b in others)
        ratio = floored(m["p95_wait_s"]) / floored(best)
        if ratio > worst_ratio:
            worst_q, worst_ratio = q, ratio
        theirs = policies[single_best]["queues"][q]["p95_wait_s"]
        single_ratio = max(single_ratio, floored(m["p95_wait_s"]) / floored(theirs))
    least = o["max_wait_least_served_s"]
    least_best = min(policies[b]["overall"]["max_wait_least_served_s"] for b in others)
    quota_peers = [p for p in others if p in POLICIES and POLICIES[p].quotas]
    least_quota = min(
        (policies[b]["overall"]["max_wait_least_served_s"] for b in quota_peers), default=None
    )
    best_util = max(policies[b]["overall"]["utilization"] for b in others)
    single_ok = single_ratio <= 1.10
    same_quotas_ok = least_quota is not None and least < least_quota
    return {
        "demand_ratio": o["demand_ratio"],
        "goodput_while_arriving": o["goodput_while_arriving"],
        "goodput_ok": o["demand_ratio"] <= 1.0 or o["goodput_while_arriving"] >= GOODPUT_GOAL,
        "lost_share": o["lost_share_of_delivered"],
        "lost_ok": o["lost_share_of_delivered"] < 0.01,
        "worst_queue": worst_q,
        "worst_p95_ratio": worst_ratio,
        "p95_ok": worst_ratio <= 1.10,
        "least_served_ratio": least / max(least_best, 1e-9),
        "least_served_ok": least < least_best,
        "util_vs_best_baseline": o["utilization"] / max(best_util, 1e-9),
        "single_best_p95_policy": single_best,
        "worst_p95_ratio_single_best": single_ratio,
        "p95_single_best_ok": single_ok,
        "least_served_ratio_same_quotas": (
            least / max(least_quota, 1e-9) if least_quota is not None else None
        ),
        "least_served_same_quotas_ok": same_quotas_ok,
        "milder_ok": single_ok and same_quotas_ok,
    }


def dominated_by(policies: dict[str, Any], judged: str) -> list[str]:
    """The policies at least as good as `judged` on both overall p95 wait and the least-served
    queue's max wait, and better on one (waits under 60 s count as 60 s)."""

    def point(policy: str) -> tuple[float, float]:
        o = policies[policy]["overall"]
        return floored(o["p95_wait_s"]), floored(o["max_wait_least_served_s"])

    mine = point(judged)
    return [
        p
        for p in policies
        if p != judged
        and point(p) != mine
        and all(theirs <= ours for theirs, ours in zip(point(p), mine, strict=True))
    ]


def peer_counts(results: dict[str, Any]) -> dict[str, dict[str, int]]:
    """For every policy, on how many traces it would meet the two wait goals if it were the one
    judged against the others, and on how many no other policy beats it on both waits: a
    yardstick for how much the goals ask of any policy. `results`: per trace, a dict with the
    `policies` that `checks` reads."""
    counts: dict[str, dict[str, int]] = {}
    for r in results.values():
        for policy in r["policies"]:
            c = checks(r["policies"], judged=policy)
            n = counts.setdefault(
                policy, {"p95_ok": 0, "least_served_ok": 0, "both": 0, "undominated": 0}
            )
            n["p95_ok"] += c["p95_ok"]
            n["least_served_ok"] += c["least_served_ok"]
            n["both"] += c["p95_ok"] and c["least_served_ok"]
            n["undominated"] += not dominated_by(r["policies"], policy)
    return counts
