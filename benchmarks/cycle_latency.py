"""One scheduling cycle with 10,000 pending and 1,000 running jobs: goal median < 20 ms.

Measures `schedule()` on a prepared snapshot (what the service and the simulator do: the state is
kept incrementally, see `queue/core/state.py`), and for comparison the cold path that also builds
the snapshot from plain lists. Three cluster states: plenty free, nearly full (backfill and
reservation), and full with preemption candidates (victim search).

    .venv/bin/python benchmarks/cycle_latency.py [--repeat 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from preemptible.queue.core import (
    POLICIES,
    Job,
    Resources,
    RunningJob,
    Tier,
    build_snapshot,
    parse_config,
    schedule,
)

TIERS = [Tier.LOW, Tier.NORMAL, Tier.NORMAL, Tier.HIGH]


def make(free_gpus: int, seed: int = 0):
    rng = random.Random(seed)
    queues = [f"team-{i}" for i in range(8)]
    now = 1_000_000.0
    running, used = [], 0
    while len(running) < 1000:
        g = rng.choice([1, 1, 2, 2, 4, 8])
        running.append(
            RunningJob(
                job=Job(
                    id=f"r{len(running)}",
                    queue=rng.choice(queues),
                    request=Resources(gpus=g),
                    tier=rng.choice(TIERS),
                    submitted_at=now - 50_000,
                    estimate_s=rng.choice([None, 3600.0, 36000.0]),
                    save_s=rng.choice([5.0, 30.0, 120.0]),
                    restore_s=30.0,
                    checkpoint_interval_s=1800.0,
                    checkpoint_on_notice=True,
                ),
                started_at=now - rng.uniform(0, 40_000),
            )
        )
        used += g
    running.sort(key=lambda r: -r.job.request.gpus)  # pack the nodes tightly (best fit)
    gpus = used + 8 + free_gpus
    gpus += -gpus % 8
    cfg = parse_config(
        {
            "cluster": {"gpus": gpus, "nodes": gpus // 8, "gpus_per_node": 8},
            "queues": [
                {"name": q, "weight": 1 + i % 3, "nominal": {"gpus": gpus // 10}}
                for i, q in enumerate(queues)
            ],
        }
    )
    pending = [
        Job(
            id=f"p{i}",
            queue=rng.choice(queues),
            request=Resources(gpus=rng.choice([1, 1, 1, 2, 4, 8, 16])),
            tier=rng.choice(TIERS),
            submitted_at=now - rng.uniform(0, 30_000),
            estimate_s=rng.choice([None, 1800.0, 7200.0]),
            save_s=30.0,
        )
        for i in range(10_000)
    ]
    usage = {q: rng.uniform(0, 0.2) for q in queues}
    return cfg, pending, running, usage, now


def measure(free_gpus: int, repeat: int) -> dict[str, float]:
    cfg, pending, running, usage, now = make(free_gpus)
    snap = build_snapshot(cfg.cluster, cfg.queues, pending=pending, running=running, usage=usage)
    policy = POLICIES["preemptible"]
    times, admitted, preempted = [], 0, 0
    for _ in range(repeat):
        t = time.perf_counter()
        result = schedule(snap, now, policy, cfg)
        times.append(time.perf_counter() - t)
        admitted, preempted = len(result.admit), len(result.preempt)
    cold = []
    for _ in range(max(3, repeat // 5)):
        t = time.perf_counter()
        s = build_snapshot(cfg.cluster, cfg.queues, pending=pending, running=running, usage=usage)
        schedule(s, now, policy, cfg)
        cold.append(time.perf_counter() - t)
    return {
        "gpus": cfg.cluster.gpus,
        "median_ms": 1000 * statistics.median(times),
        "p95_ms": 1000 * sorted(times)[int(0.95 * (len(times) - 1))],
        "cold_median_ms": 1000 * statistics.median(cold),
        "admitted": admitted,
        "preempted": preempted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    goal_ms = 20.0
    print("one cycle, policy preemptible, 10,000 pending + 1,000 running (8 queues, 8-GPU nodes)")
    print(
        f"{'cluster state':<34}{'GPUs':>6}{'median':>10}{'p95':>9}{'vs goal':>9}"
        f"{'cold (build+cycle)':>20}{'admit':>7}{'preempt':>8}"
    )
    for label, free in (
        ("plenty free (1,000 GPUs idle)", 1000),
        ("nearly full (40 GPUs idle)", 40),
        ("full (victim search)", 0),
    ):
        m = measure(free, args.repeat)
        print(
            f"{label:<34}{m['gpus']:>6}{m['median_ms']:>8.1f}ms{m['p95_ms']:>7.1f}ms"
            f"{m['median_ms'] / goal_ms:>8.2f}x{m['cold_median_ms']:>18.1f}ms"
            f"{m['admitted']:>7}{m['preempted']:>8}"
        )
    print(f"goal: median < {goal_ms:.0f} ms (ratio < 1.00x)")


if __name__ == "__main__":
    main()
