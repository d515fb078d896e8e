"""A family of synthetic workloads: knobs drawn at random per seed, for judging a policy on many.

A policy tuned on a list of named traces can fit that list. Here every seed draws its own
workload (teams, tiers, gangs, arrivals, durations, estimates, checkpoint costs, quotas, nodes)
from the ranges documented on `draw_knobs`, so that a policy is judged on how often it meets its
goals over the draws, not on one trace (the goals: `preemptible.sim.evaluation.family_goals`; the
run: `benchmarks/policy_family.py`). The alternative, a grid over a few values per knob, grows
with the product of the knobs and still leaves the gaps between its values unseen; random draws
cover every knob at once with a fixed budget.

**Load** (demand over supply) is defined exactly: the GPU-seconds of work submitted divided by
the GPU-seconds the cluster offers over the arrival span (first to last submission), as
`preemptible.sim.kpis.summarize` reports `demand_ratio`. The generator draws the jobs' shapes,
scales their durations so that their GPU-seconds are `load x gpus x span`, and stretches the
arrival times so that the first submission is at 0 and the last at the span, so the definition
holds up to the rounding of times to 0.1 s.

Everything is a pure function of the seed (`random.Random` with string seeds, which do not
depend on `PYTHONHASHSEED`), so a draw named by its seed can be replayed anywhere.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from preemptible.sim.synth import wave_times
from preemptible.sim.trace import TraceJob

DAY_S = 86400.0
TIERS = ("low", "normal", "high", "critical")
"""The core's tiers, lowest first (the order of `Knobs.tier_mix`)."""
SMALL_GPUS = (1, 2, 4, 8)
SMALL_WEIGHTS = (0.45, 0.2, 0.15, 0.2)
"""Sizes of the jobs that are not gangs, and how often each comes."""
CLUSTER_GPUS = (64, 128, 256)
GPUS_PER_NODE = 8
DURATION_CAP = 100.0
"""No job runs longer than this many times the median job (the heavy tail's end)."""


class TierLayout(enum.StrEnum):
    """How tiers are spread over the teams."""

    SPREAD = "spread"
    """Every team submits every tier of the mix (each job draws its tier)."""
    BY_TEAM = "by_team"
    """Each team submits one tier, drawn from the mix once per team."""


class Arrivals(enum.StrEnum):
    """When jobs are submitted over the arrival span."""

    STEADY = "steady"
    """Uniformly at random (a Poisson process conditioned on the count)."""
    DAILY = "daily"
    """Busy days and quiet nights plus three random surges (`synth.wave_times`)."""
    ONE_TEAM = "one_team"
    """Each team bursts in a window of its own (one day, or span / teams if shorter) with
    `burst_share` of its jobs; the rest of its jobs arrive steadily."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Knobs:
    """Everything one workload of the family is drawn from (ranges: `draw_knobs`)."""

    seed: int
    """Seeds the jobs (the knobs are drawn from the same seed by `draw_knobs`)."""
    jobs: int
    """How many jobs are submitted."""
    gpus: int
    """GPUs in the cluster."""
    gpus_per_node: int | None
    """GPUs per node; None: the cluster is one pool and placement only a count."""
    span_days: float
    """Arrival span: first to last submission."""
    load: float
    """GPU-seconds submitted / (gpus x span): demand over supply while jobs arrive."""
    weights: tuple[float, ...]
    """Fair-share weight of each team's queue (one entry per team, summing to 1)."""
    demand: tuple[float, ...]
    """Each team's share of the submitted GPU-seconds (summing to 1)."""
    tier_mix: tuple[float, float, float, float]
    """Probability of low, normal, high, critical (summing to 1)."""
    tier_layout: TierLayout
    """Whether every team submits every tier or each team one."""
    gang_share: float
    """Share of jobs that are gangs (more GPUs than a node)."""
    gang_gpus: tuple[int, ...]
    """Sizes a gang draws from, uniformly."""
    arrivals: Arrivals
    """The arrival pattern."""
    burst_share: float
    """With `Arrivals.ONE_TEAM`: share of each team's jobs submitted in its burst window."""
    duration_sigma: float
    """Sigma of the lognormal durations (the tail's weight); the median follows from the load."""
    estimate_share: float
    """Share of jobs that carry a runtime estimate."""
    estimate_low: float
    """An estimate is the duration times a factor, log-uniform in [estimate_low, estimate_high]."""
    estimate_high: float
    """The upper end of the estimate factor."""
    checkpoint_median_s: float
    """Median save (and restore) cost; each job's is lognormal (sigma 0.5) around it."""
    nominal_fraction: float
    """Sum of the nominal quotas over the cluster's GPUs; each team's nominal is by weight."""
    borrowing_factor: float | None
    """Each queue's borrowing limit as a multiple of its nominal quota; None: no limit."""
    elastic_fraction: float = 0.0
    """Share of the jobs of 2 GPUs or more that are elastic (`TraceJob.min_gpus`); 0 draws
    nothing, so the family's workloads stay exactly as they were."""
    elastic_min_share: float = 0.5
    """An elastic job's minimum as a share of its GPUs, rounded down to its multiple (8 above
    8 GPUs, 2 from 4, else 1) and at least that multiple."""

    @property
    def teams(self) -> int:
        """How many teams (queues)."""
        return len(self.weights)

    def summary(self) -> str:
        """The knobs on one line, for a report."""
        tiers = "/".join(f"{p:.2f}" for p in self.tier_mix)
        borrow = "none" if self.borrowing_factor is None else f"{self.borrowing_factor:.2f}x"
        place = (
            f"{self.gpus // self.gpus_per_node}x{self.gpus_per_node}"
            if self.gpus_per_node
            else "count"
        )
        gangs = ",".join(str(g) for g in self.gang_gpus)
        weights = ",".join(f"{w:.2f}" for w in self.weights)
        return (
            f"{self.jobs} jobs, {self.gpus} GPUs ({place}), {self.span_days:.1f} d, "
            f"load {self.load:.2f}x; {self.teams} teams w={weights}; tiers {tiers} "
            f"{self.tier_layout}; gangs {self.gang_share:.0%} of {gangs}; {self.arrivals}"
            + (f" {self.burst_share:.0%}" if self.arrivals is Arrivals.ONE_TEAM else "")
            + f"; sigma {self.duration_sigma:.1f}; estimates {self.estimate_share:.0%} "
            f"x{self.estimate_low:.2f}-{self.estimate_high:.2f}; save "
            f"{self.checkpoint_median_s:.0f}s; nominal {self.nominal_fraction:.0%}, "
            f"borrowing limit {borrow}"
            + (
                f"; elastic {self.elastic_fraction:.0%} down to {self.elastic_min_share:.0%}"
                if self.elastic_fraction
                else ""
            )
        )


def parse_seeds(text: str) -> list[int]:
    """Seeds of the family written as ``1,4,9`` (the benchmarks' ``--only`` and ``--held-out``).

    Raises:
        ValueError: the text is not whole numbers separated by commas, or one is below 0; the
            message says which.
    """
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"takes seeds separated by commas, not {text!r}") from None
    if any(s < 0 for s in seeds):
        raise ValueError("takes seeds of 0 or more")
    return seeds


def draw_knobs(seed: int) -> Knobs:
    """The knobs of draw `seed`, each uniform over its range unless said otherwise.

    - jobs: 4,000 to 10,000 (sized so that 40 draws replay under all five policies in under 15
      minutes on 2 cores);
    - cluster: 64, 128 or 256 GPUs; as 8-GPU nodes or count-only, one half each;
    - span: 2 to 10 days; load: 0.8 to 1.3 (see the module docstring for the definition);
    - teams: 2 to 8; weights uneven (lognormal, sigma 0.7, normalised to sum to 1); each team's
      share of demand is its weight times a lognormal factor (sigma 0.5), normalised, so demand
      and weights disagree as they do on real clusters;
    - tiers: each of low, normal, high, critical is in the mix with probability 0.6 (normal
      when none is), with uniform weights normalised; spread over every team or one tier per
      team, one half each;
    - gangs: 0% to 25% of jobs; sizes 16 up to 16, 32 or 64 GPUs in powers of two, at most a
      quarter of the cluster; other jobs take 1, 2, 4 or 8 GPUs (45/20/15/20%);
    - arrivals: steady, daily waves or one team at a time, a third each; a burst holds 30% to
      80% of its team's jobs;
    - durations: lognormal with sigma 0.8 to 2.0 (heavy tails), capped at 100 times the median;
      the median follows from the load, the span and the cluster;
    - estimates: on 0% to 100% of jobs; the factor's lower end 0.5 to 1.0 (under-estimates), its
      upper end 1.0 to 4.0;
    - checkpoint cost: median log-uniform from 5 s to 300 s;
    - quotas: nominal quotas summing to the whole cluster in half the draws, otherwise to 50%
      to 100% of it; a borrowing limit of 0.5 to 2 times the nominal quota in half the draws,
      no limit in the other half.
    """
    rng = random.Random(f"knobs/{seed}")
    gpus = rng.choice(CLUSTER_GPUS)
    teams = rng.randint(2, 8)
    weights = _normalised([rng.lognormvariate(0.0, 0.7) for _ in range(teams)])
    demand = _normalised([w * rng.lognormvariate(0.0, 0.5) for w in weights])
    present = [rng.random() < 0.6 for _ in TIERS]
    if not any(present):
        present[TIERS.index("normal")] = True
    mix = _normalised([rng.uniform(0.1, 1.0) if p else 0.0 for p in present])
    biggest = min(rng.choice((16, 32, 64)), gpus // 4)
    return Knobs(
        seed=seed,
        jobs=rng.randint(4000, 10000),
        gpus=gpus,
        gpus_per_node=GPUS_PER_NODE if rng.random() < 0.5 else None,
        span_days=rng.uniform(2.0, 10.0),
        load=rng.uniform(0.8, 1.3),
        weights=tuple(weights),
        demand=tuple(demand),
        tier_mix=(mix[0], mix[1], mix[2], mix[3]),
        tier_layout=rng.choice(tuple(TierLayout)),
        gang_share=rng.uniform(0.0, 0.25),
        gang_gpus=tuple(g for g in (16, 32, 64) if g <= biggest),
        arrivals=rng.choice(tuple(Arrivals)),
        burst_share=rng.uniform(0.3, 0.8),
        duration_sigma=rng.uniform(0.8, 2.0),
        estimate_share=rng.uniform(0.0, 1.0),
        estimate_low=rng.uniform(0.5, 1.0),
        estimate_high=rng.uniform(1.0, 4.0),
        checkpoint_median_s=math.exp(rng.uniform(math.log(5.0), math.log(300.0))),
        nominal_fraction=1.0 if rng.random() < 0.5 else rng.uniform(0.5, 1.0),
        borrowing_factor=rng.uniform(0.5, 2.0) if rng.random() < 0.5 else None,
    )


def held_out_knobs(seed: int = 0) -> Knobs:
    """The held-out workload, one the policy was never tuned on, as knobs.

    Three teams with nominal quotas of 128, 64 and 64 GPUs (weights in the same ratio) on a
    256-GPU cluster of 8-GPU nodes, borrowing limits equal to the nominal quotas, four tiers
    spread over every team, each team bursting on its own day, 10% of jobs 16-GPU gangs among
    1- to 8-GPU jobs, estimates for all jobs, demand 1.11 times supply over ten days. What that
    description leaves open was set inside the family's ranges before any replay: 4,000 jobs, demand
    shares equal to the weights, tiers 30/40/20/10% from low to critical, half of each team's
    jobs in its burst day, duration sigma 1.4, estimates 0.75x to 2.5x, 60 s median save.
    """
    return Knobs(
        seed=seed,
        jobs=4000,
        gpus=256,
        gpus_per_node=GPUS_PER_NODE,
        span_days=10.0,
        load=1.11,
        weights=(0.5, 0.25, 0.25),
        demand=(0.5, 0.25, 0.25),
        tier_mix=(0.3, 0.4, 0.2, 0.1),
        tier_layout=TierLayout.SPREAD,
        gang_share=0.1,
        gang_gpus=(16,),
        arrivals=Arrivals.ONE_TEAM,
        burst_share=0.5,
        duration_sigma=1.4,
        estimate_share=1.0,
        estimate_low=0.75,
        estimate_high=2.5,
        checkpoint_median_s=60.0,
        nominal_fraction=1.0,
        borrowing_factor=1.0,
    )


def held_out_workload(seed: int = 0) -> tuple[list[TraceJob], str]:
    """The jobs and configuration of `held_out_knobs(seed)`."""
    return workload(held_out_knobs(seed))


def workload(knobs: Knobs) -> tuple[list[TraceJob], str]:
    """The jobs (sorted by submission) and the queue configuration (TOML) of one draw."""
    rng = random.Random(f"jobs/{knobs.seed}")
    names = team_names(knobs.teams)
    team_of = _teams_by_demand(knobs, rng)
    team_tier = [_tier(knobs, rng) for _ in names]
    shapes: list[_Shape] = []
    for team in team_of:
        gang = rng.random() < knobs.gang_share
        gpus = rng.choice(knobs.gang_gpus) if gang else _small(rng)
        tier = _tier(knobs, rng) if knobs.tier_layout is TierLayout.SPREAD else team_tier[team]
        shapes.append(_Shape(team=team, gpus=gpus, tier=tier, work=_relative_duration(knobs, rng)))
    span_s = knobs.span_days * DAY_S
    scale = knobs.load * knobs.gpus * span_s / sum(s.gpus * s.work for s in shapes)
    times = _arrivals(knobs, team_of, span_s, rng)
    jobs = [
        _job(knobs, s, names[s.team], i, at, s.work * scale, rng)
        for i, (s, at) in enumerate(zip(shapes, times, strict=True))
    ]
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    largest = [max((j.gpus for j in jobs if j.queue == n), default=1) for n in names]
    if knobs.elastic_fraction:
        jobs = elastic_ranges(jobs, knobs)
    return jobs, config_text(knobs, largest)


def elastic_ranges(jobs: Sequence[TraceJob], knobs: Knobs) -> list[TraceJob]:
    """`jobs` with `elastic_fraction` of those of 2 GPUs or more made elastic. Drawn from a
    generator of its own, so that the rest of the draw is the same with or without them."""
    rng = random.Random(f"elastic/{knobs.seed}")
    out = []
    for job in jobs:
        if job.gpus >= 2 and rng.random() < knobs.elastic_fraction:
            multiple = 8 if job.gpus > 8 else 2 if job.gpus >= 4 else 1
            low = max(multiple, int(knobs.elastic_min_share * job.gpus) // multiple * multiple)
            if low < job.gpus:
                job = dataclasses.replace(job, min_gpus=low, gpus_multiple=multiple)
        out.append(job)
    return out


def team_names(teams: int) -> list[str]:
    """Queue names: team-a, team-b, ..."""
    return [f"team-{chr(ord('a') + i)}" for i in range(teams)]


def nominal_quotas(knobs: Knobs) -> list[int]:
    """Each team's nominal GPUs: by weight, largest remainders first, so that they sum to
    exactly `round(nominal_fraction x gpus)`."""
    total = round(knobs.nominal_fraction * knobs.gpus)
    exact = [w * total for w in knobs.weights]
    quotas = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (quotas[i] - exact[i], i))
    for i in by_remainder[: total - sum(quotas)]:
        quotas[i] += 1
    return quotas


def config_text(knobs: Knobs, largest_job: Sequence[int]) -> str:
    """The queue configuration of a draw (the format of `parse_config_text`).

    Policy and preemption settings are the defaults, as on a cluster nobody tuned. A borrowing
    limit is raised where needed so that the team's largest job fits in nominal plus limit
    (otherwise that job could never run).
    """
    cluster = {"gpus": knobs.gpus}
    if knobs.gpus_per_node:
        cluster |= {
            "nodes": knobs.gpus // knobs.gpus_per_node,
            "gpus_per_node": knobs.gpus_per_node,
        }
    out = ["[cluster]", *(f"{k} = {v}" for k, v in cluster.items())]
    quotas = nominal_quotas(knobs)
    for name, weight, nominal, big in zip(
        team_names(knobs.teams), knobs.weights, quotas, largest_job, strict=True
    ):
        out += ["", "[[queues]]", f'name = "{name}"', f"weight = {weight:.6f}"]
        out.append(f"nominal = {{ gpus = {nominal} }}")
        if knobs.borrowing_factor is not None:
            limit = max(round(knobs.borrowing_factor * nominal), big - nominal)
            out.append(f"borrowing_limit = {{ gpus = {limit} }}")
    return "\n".join(out) + "\n"


@dataclass(frozen=True, slots=True)
class _Shape:
    team: int
    gpus: int
    tier: str
    work: float
    """Duration relative to the median job (scaled to seconds once all are drawn)."""


def _normalised(values: Sequence[float]) -> list[float]:
    total = sum(values)
    return [v / total for v in values]


def _teams_by_demand(knobs: Knobs, rng: random.Random) -> list[int]:
    """Which team submits each job, by demand share: every team draws its jobs' sizes and
    durations alike, so its expected share of GPU-seconds is its share of jobs."""
    return rng.choices(range(knobs.teams), weights=knobs.demand, k=knobs.jobs)


def _tier(knobs: Knobs, rng: random.Random) -> str:
    return rng.choices(TIERS, weights=knobs.tier_mix)[0]


def _small(rng: random.Random) -> int:
    return rng.choices(SMALL_GPUS, weights=SMALL_WEIGHTS)[0]


def _relative_duration(knobs: Knobs, rng: random.Random) -> float:
    return min(rng.lognormvariate(0.0, knobs.duration_sigma), DURATION_CAP)


def _arrivals(
    knobs: Knobs, team_of: Sequence[int], span_s: float, rng: random.Random
) -> list[float]:
    """A submission time per job, stretched so that the first is 0 and the last `span_s`."""
    n = len(team_of)
    if knobs.arrivals is Arrivals.DAILY:
        times = wave_times(n, span_s, rng)  # sorted, but the jobs were drawn independently
    elif knobs.arrivals is Arrivals.ONE_TEAM:
        windows = _burst_windows(knobs.teams, span_s, rng)
        times = []
        for team in team_of:
            start, length = windows[team]
            if rng.random() < knobs.burst_share:
                times.append(start + rng.uniform(0.0, length))
            else:
                times.append(rng.uniform(0.0, span_s))
    else:
        times = [rng.uniform(0.0, span_s) for _ in range(n)]
    lo, hi = min(times), max(times)
    return [(t - lo) / (hi - lo) * span_s for t in times] if hi > lo else [0.0] * n


def _burst_windows(teams: int, span_s: float, rng: random.Random) -> list[tuple[float, float]]:
    """(start, length) of each team's burst: a day of its own where the span has enough days,
    otherwise an equal slot of the span; which team gets which is random."""
    days = int(span_s // DAY_S)
    if days >= teams:
        slots = rng.sample(range(days), teams)
        return [(d * DAY_S, DAY_S) for d in slots]
    length = span_s / teams
    order = rng.sample(range(teams), teams)
    return [(k * length, length) for k in order]


def _job(
    knobs: Knobs,
    shape: _Shape,
    team: str,
    index: int,
    at: float,
    duration: float,
    rng: random.Random,
) -> TraceJob:
    estimate = None
    if rng.random() < knobs.estimate_share:
        factor = math.exp(rng.uniform(math.log(knobs.estimate_low), math.log(knobs.estimate_high)))
        estimate = round(max(duration * factor, 60.0), 1)
    save = knobs.checkpoint_median_s * rng.lognormvariate(0.0, 0.5)
    return TraceJob(
        job_id=f"{team}-{index:05d}",
        submit_s=round(at, 1),
        duration_s=round(max(duration, 1.0), 1),
        gpus=shape.gpus,
        queue=team,
        tier=shape.tier,
        estimate_s=estimate,
        checkpoint_s=round(min(max(save, 1.0), 900.0), 1),
    )
