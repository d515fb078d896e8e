"""The workloads the trace benchmarks replay, and the variants that probe a result.

Sixteen public traces, named by where they lie under the shared traces folder (the Traces
section of README.md), and the synthetic workload beside them; each comes with a cluster sized
to its offered load. `jittered` and `weights_only` change one thing, the same for every policy,
to tell a policy's rule from one run's luck (a replay is chaotic) or from its quotas.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from preemptible.queue.core import QueueConfig
from preemptible.queue.core.model import Limits
from preemptible.sim.importers import import_trace, suggest_config
from preemptible.sim.synth import generate, synth_config
from preemptible.sim.trace import TraceJob

TRACES: dict[str, str | None] = {
    "synthetic": None,
    "philly": "philly-pollux/philly.csv",
    "chronus-mix1": "philly-chronus/trace_job_Philly_MIX1.csv",
    "chronus-mix2": "philly-chronus/trace_job_Philly_MIX2.csv",
    "chronus-slo": "philly-chronus/trace_job_Philly_SLO.csv",
    **{
        f"itp-{i:02d}": f"microsoft-itp-elasticflow/raw-traces/cluster{i:02d}.csv"
        for i in range(1, 11)
    },
    "tiresias-60": "tiresias/60_job.csv",
}
"""Each named workload's file under the shared traces folder; None for the synthetic one."""
SYNTHETIC_GPUS = 256


def load_named(name: str, shared: Path) -> tuple[list[TraceJob], str]:
    """A named workload's jobs and its queue configuration (TOML text), the cluster sized to
    its offered load in 8-GPU nodes so that demand exceeds supply whenever it bursts."""
    path = TRACES[name]
    if path is None:
        jobs = generate(jobs=20_000, gpus=SYNTHETIC_GPUS, load=1.1, seed=1)
        return jobs, synth_config(SYNTHETIC_GPUS)
    jobs = import_trace(shared / path).jobs
    return jobs, suggest_config(jobs)


def jittered(jobs: list[TraceJob], seconds: float, seed: int) -> list[TraceJob]:
    """The same jobs, each submitted up to `seconds` later (uniform, seeded), in submit order:
    arrivals off the whole minutes they share with each other and with job ends."""
    rng = random.Random(seed)
    moved = [dataclasses.replace(j, submit_s=j.submit_s + rng.uniform(0, seconds)) for j in jobs]
    return sorted(moved, key=lambda j: j.submit_s)


def weights_only(cfg: QueueConfig) -> QueueConfig:
    """The same configuration with every nominal quota 0: fair-share weights only, all work
    borrowed, to show what quotas smaller than a queue's largest gang cost."""
    queues = tuple(dataclasses.replace(q, nominal=Limits(gpus=0)) for q in cfg.queues)
    return dataclasses.replace(cfg, queues=queues)
