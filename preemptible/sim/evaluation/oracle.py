"""Could any policy meet the four goals of the policy family? A schedule or a proof, per draw.

Needs `ortools` (the `oracle` extra): it is imported here, and no other module of the package
imports this one.

The family's draws are too big to search. A small draw is a family draw with every knob as
drawn except its size (`small_knobs`): N jobs on a G-GPU cluster that is one pool (placement
only a count), gangs of G/4 GPUs. Each is replayed under the five policies, which set the
goals' bounds as in `family_goals.judge`; then two CP-SAT models over its jobs decide, where
they can, whether some schedule meets all four goals:

- **witness** (a hindsight schedule): every job runs once, never preempted, and starts at most
  1.1x the best tier-respecting baseline's max wait after its submission; all but the 5% that
  the nearest-rank p95 leaves out start within 1.1x the best baseline's p95 wait; the GPU-seconds
  held while jobs arrive reach the goodput bound. It loses nothing, so goal 4 holds too. A
  solution is checked apart from the model (GPUs never over the cluster, the metrics judged by
  `family_goals.judge`). It knows every job's future and ignores quotas and tiers: it shows
  that the goals are not contradictory on the draw, not that an online policy could meet them.
- **refutation** (a relaxation of every schedule the simulator could play, preemption included):
  with loss budget L = half of kueue's lost GPU-seconds (goal 4 allows no more), a preemption
  that keeps progress costs at least the job's restore, GPUs x checkpoint cost
  (`engine.Simulator.noticed`), so a job for which that exceeds L keeps no progress through any
  preemption: its work runs in its last run, uninterrupted, and earlier runs only shorten its
  pending time by what they lose, at most L / GPUs, with the losses of all jobs summing to at most
  L. Jobs cheap enough to be preempted within L are dropped (taken to meet both wait bounds, to
  hold no GPUs and to deliver all the work they could in the window). Goodput may count L of
  lost work that was charged after the window. Time is continuous and quotas, tiers and the
  cycle interval are not imposed. Infeasible: no policy meets all four goals on the draw. When
  kueue loses nothing, no policy may preempt, and the refutation is the witness's model with
  its bounds loosened by a tenth of a second (for rounding).

A draw is **reachable** (witness found), **out of reach** (refutation infeasible) or **open**
(neither within the time limit, or the relaxation too loose to decide). CP-SAT runs one search
worker per model, so a verdict reached within the limit is the same on every run; what the
limit cuts off (open) can depend on the machine's speed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, NamedTuple

from preemptible._extras import require
from preemptible._percentile import nearest_rank
from preemptible.sim.evaluation.family_goals import (
    BASELINES,
    GOALS,
    OURS,
    QUOTA_BASELINE,
    judge,
    replay,
)
from preemptible.sim.evaluation.trace_goals import WAIT_FLOOR_S
from preemptible.sim.family import Knobs, draw_knobs, workload
from preemptible.sim.trace import TraceJob

require("oracle", "preemptible.sim.evaluation.oracle (CP-SAT schedules)")
from ortools.sat.python import cp_model  # noqa: E402 (after the check that names the extra)

TIER_BASELINES = ("priority", "kueue", "slurm")
VERDICTS = ("reachable", "out of reach", "open")
ROUNDING = 1e-9
"""A witness at a goal's bound meets it: `judge`'s `excess` may be this far above 0 from the
rounding of floats (a goodput equal to kueue's, summed in another order)."""


def tenths(seconds: float) -> int:
    """Seconds as whole tenths (the traces' resolution)."""
    return round(seconds * 10)


def small_knobs(seed: int, jobs: int, gpus: int) -> Knobs:
    """Draw `seed` with `jobs` jobs on `gpus` GPUs in one pool, gangs of a quarter of them."""
    return dataclasses.replace(
        draw_knobs(seed), jobs=jobs, gpus=gpus, gpus_per_node=None, gang_gpus=(gpus // 4,)
    )


class Bounds(NamedTuple):
    """What the four goals ask of any schedule of one draw, in tenths of a second."""

    p95_wait: int
    """Wait allowed to all but `late` jobs: 1.1x the best baseline's p95."""
    max_wait: int
    """Wait allowed to every job: 1.1x the best tier-respecting baseline's max wait."""
    late: int
    """Jobs that may wait past `p95_wait` with the p95 still within it (nearest rank)."""
    window: int
    """The arrival window: first (0) to last submission."""
    held: int
    """GPU-tenths held in the window that the goodput bound asks for."""
    loss: int
    """GPU-tenths a schedule may lose: half of kueue's lost work."""


def goal_bounds(
    jobs: list[TraceJob], gpus: int, metrics: dict[str, dict[str, Any]], *, edge: int = 0
) -> Bounds:
    """The bounds of `family_goals.judge` for ours, from the baselines' numbers; `edge` 1
    loosens each by a tenth of a second (of every GPU's time, for goodput) for the refutation,
    so that rounding to tenths never rules out a schedule that meets the goals."""
    p95 = min(max(metrics[p]["p95_wait_s"], WAIT_FLOOR_S) for p in BASELINES)
    most = min(max(metrics[p]["least_served_max_wait_s"], WAIT_FLOOR_S) for p in TIER_BASELINES)
    best = max(metrics[p]["goodput"] for p in BASELINES)
    goodput = max(metrics[QUOTA_BASELINE]["goodput"], best - 0.02)
    window = tenths(max(j.submit_s for j in jobs))
    return Bounds(
        # waits are compared in seconds: 1.1 x reference, rounded down to a whole tenth
        p95_wait=math.floor(11 * p95 + 1e-6) + edge,
        max_wait=math.floor(11 * most + 1e-6) + edge,
        late=len(jobs) - math.ceil(0.95 * len(jobs)),
        window=window,
        held=math.ceil(goodput * gpus * window - 1e-3) - edge * gpus,  # float noise: not a tenth
        loss=math.ceil(0.5 * metrics[QUOTA_BASELINE]["lost_gpu_h"] * 36000),
    )


def schedule_model(
    jobs: list[TraceJob], gpus: int, b: Bounds, *, loss: int
) -> tuple[cp_model.CpModel, list[cp_model.IntVar | None]]:
    """The witness model (`loss` 0) or the refutation (`loss` = `b.loss`), and each job's
    start (None for a job the refutation drops); see the module docstring."""
    m = cp_model.CpModel()
    starts: list[cp_model.IntVar | None] = []
    intervals: list[cp_model.IntervalVar] = []
    demands: list[int] = []
    late: list[cp_model.IntVar] = []
    held: list[cp_model.LinearExprT] = []
    slack: list[cp_model.LinearExprT] = []
    dropped_held = 0
    for j in jobs:
        r, p = tenths(j.submit_s), tenths(j.duration_s)
        if loss and j.gpus * tenths(j.checkpoint_s or 0.0) <= loss:
            dropped_held += j.gpus * min(p, max(0, b.window - r))
            starts.append(None)
            continue
        extra = loss // j.gpus
        start = m.new_int_var(r, r + b.max_wait + extra, j.job_id)
        lost = m.new_int_var(0, extra, f"{j.job_id}-lost")
        is_late = m.new_bool_var(f"{j.job_id}-late")
        m.add(start - r <= b.max_wait + lost)
        m.add(start - r <= b.p95_wait + lost).only_enforce_if(~is_late)
        left = m.new_int_var(0, b.window, f"{j.job_id}-left")
        m.add_max_equality(left, [0, b.window - start])
        in_window = m.new_int_var(0, p, f"{j.job_id}-in")
        m.add_min_equality(in_window, [p, left])
        intervals.append(m.new_fixed_size_interval_var(start, p, f"{j.job_id}-run"))
        demands.append(j.gpus)
        late.append(is_late)
        held.append(j.gpus * in_window)
        slack.append(j.gpus * lost)
        starts.append(start)
    m.add_cumulative(intervals, demands, gpus)
    m.add(sum(late) <= b.late)
    m.add(sum(slack) <= loss)
    m.add(sum(held) + dropped_held >= b.held - loss)
    return m, starts


def solve(model: cp_model.CpModel, time_limit_s: float) -> tuple[cp_model.CpSolver, str, float]:
    """One single-worker CP-SAT search: the solver, "feasible", "infeasible" or "unknown", and
    its wall time."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    started = time.perf_counter()
    status = solver.solve(model)
    outcome = {cp_model.OPTIMAL: "feasible", cp_model.FEASIBLE: "feasible"}.get(
        status, "infeasible" if status == cp_model.INFEASIBLE else "unknown"
    )
    return solver, outcome, time.perf_counter() - started


def schedule_metrics(jobs: list[TraceJob], gpus: int, starts_s: list[float]) -> dict[str, Any]:
    """The numbers `family_goals.judge` reads, for jobs that each run once from their start;
    raises if the GPUs in use ever exceed the cluster's."""
    events = sorted(
        (t, g)
        for j, s in zip(jobs, starts_s, strict=True)
        for t, g in ((tenths(s), j.gpus), (tenths(s) + tenths(j.duration_s), -j.gpus))
    )
    in_use = 0
    for at, change in events:  # at one instant, ends (negative) sort before starts
        in_use += change
        if in_use > gpus:
            raise AssertionError(f"{in_use} GPUs in use at {at / 10:.1f} s, more than {gpus}")
    waits = [s - j.submit_s for j, s in zip(jobs, starts_s, strict=True)]
    first, last = min(j.submit_s for j in jobs), max(j.submit_s for j in jobs)
    in_window = sum(
        j.gpus * max(0.0, min(s + j.duration_s, last) - max(s, first))
        for j, s in zip(jobs, starts_s, strict=True)
    )
    return {  # the window as `preemptible.sim.kpis.summarize` takes it
        "goodput": in_window / (gpus * max(last - first, 1.0)),
        "p95_wait_s": nearest_rank(waits, 0.95),
        "least_served_max_wait_s": max(waits),
        "lost_gpu_h": 0.0,
        "delivered_gpu_h": sum(j.gpus * j.duration_s for j in jobs) / 3600.0,
    }


def decide(
    jobs: list[TraceJob], gpus: int, metrics: dict[str, dict[str, Any]], time_limit_s: float
) -> dict[str, Any]:
    """The verdict on one draw, the models' outcomes and times, and a witness's metrics."""
    b = goal_bounds(jobs, gpus, metrics)
    out: dict[str, Any] = {"bounds": b._asdict()}
    model, starts = schedule_model(jobs, gpus, b, loss=0)
    solver, outcome, wall = solve(model, time_limit_s)
    out["witness"] = {"outcome": outcome, "wall_s": wall}
    if outcome == "feasible":
        starts_s = [solver.value(s) / 10 for s in starts if s is not None]
        witness = schedule_metrics(jobs, gpus, starts_s)
        goals = judge({**metrics, OURS: witness})
        missed = [g for g in GOALS if goals[g]["excess"] > ROUNDING]
        if missed:
            raise AssertionError(f"the witness misses {missed}: {witness}")
        out |= {"verdict": "reachable", "witness_metrics": witness, "starts_s": starts_s}
        return out
    b = goal_bounds(jobs, gpus, metrics, edge=1)
    model, starts = schedule_model(jobs, gpus, b, loss=b.loss)
    _, outcome, wall = solve(model, time_limit_s)
    out["refutation"] = {
        "outcome": outcome,
        "wall_s": wall,
        "dropped": sum(s is None for s in starts),
    }
    out["verdict"] = "out of reach" if outcome == "infeasible" else "open"
    return out


def one_draw(seed: int, jobs: int, gpus: int, time_limit_s: float) -> dict[str, Any]:
    """One small draw: the five policies, their goals, and the oracle's verdict."""
    knobs = small_knobs(seed, jobs, gpus)
    metrics = {p: replay(knobs, p) for p in (*BASELINES, OURS)}
    trace, _ = workload(knobs)
    verdict = decide(trace, gpus, metrics, time_limit_s)
    goals = judge(metrics)
    met = {p: judge(metrics, p)["all"]["met"] for p in metrics if p != OURS}
    met[OURS] = goals["all"]["met"]
    base = {p: metrics[p] for p in BASELINES}
    as_ours = [p for p in metrics if judge({**base, OURS: metrics[p]})["all"]["met"]]
    if as_ours and verdict["verdict"] == "out of reach":  # a schedule the simulator played
        raise AssertionError(f"draw {seed}: {as_ours} meet the goals the refutation rules out")
    return {
        "seed": seed,
        "summary": knobs.summary(),
        "goals": goals,
        "all_four": met,
        "meet_ours_goals": as_ours,
        "kueue_lost_gpu_h": metrics[QUOTA_BASELINE]["lost_gpu_h"],
        "oracle": verdict,
    }


def tally(draws: list[dict[str, Any]]) -> dict[str, Any]:
    """Verdicts counted, and how often each policy meets all four goals."""
    policies = draws[0]["all_four"] if draws else {}
    return {
        "verdicts": {v: sum(d["oracle"]["verdict"] == v for d in draws) for v in VERDICTS},
        "all_four": {p: sum(d["all_four"][p] for d in draws) for p in policies},
        "some_policy": sum(bool(d["meet_ours_goals"]) for d in draws),
        "ours_where_reachable": sum(
            d["all_four"][OURS] for d in draws if d["oracle"]["verdict"] == "reachable"
        ),
    }
