"""A synthetic workload with the shapes that make GPU queues hard.

Three kinds of job, arriving in bursty waves (a daily rhythm plus random surges):

- LoRA fine-tunes: 1 GPU, tens of minutes to hours, tier normal, small checkpoints;
- gang training: 8 GPUs all-or-nothing, hours, tier normal or high, large checkpoints;
- inference sweeps: a fan-out of 8 to 32 short 1-GPU jobs submitted at once, tier low.

Each team has its own mix and volume, so the queues compete unevenly. About 70% of jobs carry a
runtime estimate, over-estimated by 1.2x to 3x as users do. The arrival span is chosen so that the
offered load is `load` times the cluster. The generator is a pure function of its seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from preemptible.sim.trace import TraceJob


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamMix:
    """One team's share of submissions and its mix of job kinds (weights)."""

    name: str
    share: float
    lora: float
    train: float
    sweep: float


DEFAULT_TEAMS = (
    TeamMix(name="team-a", share=0.30, lora=0.2, train=0.7, sweep=0.1),
    TeamMix(name="team-b", share=0.45, lora=0.6, train=0.1, sweep=0.3),
    TeamMix(name="team-c", share=0.25, lora=0.2, train=0.1, sweep=0.7),
)


def generate(
    *,
    jobs: int,
    gpus: int,
    load: float = 1.1,
    seed: int = 0,
    teams: tuple[TeamMix, ...] = DEFAULT_TEAMS,
) -> list[TraceJob]:
    """About `jobs` jobs whose GPU-hours are `load` times what `gpus` GPUs deliver over the span."""
    rng = random.Random(seed)
    shapes: list[tuple[str, list[tuple[float, int, str, float, float | None]]]] = []
    count = 0
    while count < jobs:
        team = rng.choices(teams, weights=[t.share for t in teams])[0]
        kind = rng.choices(("lora", "train", "sweep"), weights=[team.lora, team.train, team.sweep])[
            0
        ]
        batch = _batch(kind, rng)
        batch = batch[: jobs - count]
        shapes.append((team.name, batch))
        count += len(batch)
    gpu_s = sum(d * g for _, batch in shapes for d, g, *_ in batch)
    span = gpu_s / (load * gpus)
    times = wave_times(len(shapes), span, rng)
    out: list[TraceJob] = []
    for (queue, batch), at in zip(shapes, times, strict=True):
        for i, (duration, g, tier, ckpt, estimate) in enumerate(batch):
            out.append(
                TraceJob(
                    job_id=f"{queue}-{len(out):06d}",
                    submit_s=round(at + i * 0.5, 1),
                    duration_s=round(duration, 1),
                    gpus=g,
                    queue=queue,
                    tier=tier,
                    estimate_s=None if estimate is None else round(estimate, 1),
                    checkpoint_s=ckpt,
                )
            )
    out.sort(key=lambda j: (j.submit_s, j.job_id))
    return out


def _estimate(duration: float, rng: random.Random) -> float | None:
    return duration * rng.uniform(1.2, 3.0) if rng.random() < 0.7 else None


def _batch(kind: str, rng: random.Random) -> list[tuple[float, int, str, float, float | None]]:
    if kind == "lora":
        d = min(rng.lognormvariate(math.log(45 * 60), 0.8), 12 * 3600)
        return [(d, 1, "normal", 20.0, _estimate(d, rng))]
    if kind == "train":
        d = min(rng.lognormvariate(math.log(4 * 3600), 0.7), 48 * 3600)
        tier = "high" if rng.random() < 0.2 else "normal"
        return [(d, 8, tier, 120.0, _estimate(d, rng))]
    n = rng.randint(8, 32)
    out = []
    for _ in range(n):
        d = rng.uniform(5 * 60, 20 * 60)
        out.append((d, 1, "low", 5.0, _estimate(d, rng)))
    return out


def wave_times(n: int, span: float, rng: random.Random) -> list[float]:
    """n arrival times on [0, span]: a daily wave (busy days, quiet nights) plus random surges."""
    days = max(span / 86400.0, 1e-9)
    surges = [(rng.uniform(0, span), rng.uniform(0.01, 0.05) * span) for _ in range(3)]

    def rate(t: float) -> float:
        base = 1.0 + 0.8 * math.sin(2 * math.pi * t / 86400.0) if days >= 1 else 1.0
        bump = sum(3.0 for c, w in surges if abs(t - c) < w)
        return base + bump

    peak = 1.8 + 9.0
    out: list[float] = []
    while len(out) < n:
        t = rng.uniform(0, span)
        if rng.uniform(0, peak) <= rate(t):
            out.append(t)
    out.sort()
    return out


def synth_config(
    gpus: int, *, gpus_per_node: int = 8, teams: tuple[TeamMix, ...] = DEFAULT_TEAMS
) -> str:
    """A configuration for the synthetic teams: nominal quotas and weights by share."""
    lines = [
        "[cluster]",
        f"gpus = {gpus}",
        f"nodes = {gpus // gpus_per_node}",
        f"gpus_per_node = {gpus_per_node}",
        "",
        "[policy]",
        'fair_share_half_life = "1d"',
        'aging = "1h"',
        "backfill = true",
        "",
    ]
    for t in teams:
        lines += [
            "[[queues]]",
            f'name = "{t.name}"',
            f"weight = {t.share}",
            f"nominal = {{ gpus = {math.floor(t.share * gpus)} }}",
            "",
        ]
    return "\n".join(lines)
