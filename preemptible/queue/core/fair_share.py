"""Decayed, weighted dominant-resource fair share.

A queue's usage is the integral of its dominant share (DRF: the largest of its GPU, CPU and memory
fractions of the cluster) over time, decayed with a half-life, as SLURM's multifactor plugin does
for GPUs alone. Dividing by the window length turns it into an average share in 0..1. The value
used for ordering blends that history (mostly) with the queue's share right now (so that several
admissions in one cycle already count), and divides by the queue's weight fraction: 1.0 means
"exactly its fair share", 2.0 twice as much. Kueue's fair sharing uses the current share only,
which forgets a team that hogged the cluster yesterday; SLURM's uses history only, which gives
every GPU freed in one cycle to the same queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from preemptible.queue.core.model import Cluster, Queue

LN2 = math.log(2.0)


def dominant_share(gpus: float, cpus: float, memory_gb: float, cluster: Cluster) -> float:
    """The largest fraction of any scheduled resource (resources with capacity 0 are ignored)."""
    share = gpus / cluster.gpus if cluster.gpus else 0.0
    if cluster.cpus:
        share = max(share, cpus / cluster.cpus)
    if cluster.memory_gb:
        share = max(share, memory_gb / cluster.memory_gb)
    return share


def weight_fractions(queues: Iterable[Queue]) -> dict[str, float]:
    """Each queue's weight divided by the sum of all weights."""
    qs = list(queues)
    total = sum(q.weight for q in qs) or 1.0
    return {q.name: q.weight / total for q in qs}


NOW_WEIGHT = 0.1
"""Weight of the current share against decayed history in `fair_share_value`."""


def fair_share_value(
    usage_avg: float, share_now: float, weight_fraction: float, *, now_weight: float = NOW_WEIGHT
) -> float:
    """How much of its fair share a queue has had: 1.0 is exactly fair, lower is under-served.

    History dominates (it is what makes long-run shares converge to the weights, like the
    integral term of a controller); the current share spreads the admissions of one cycle over
    the queues instead of giving every free GPU to the queue with the oldest deficit.

    Args:
        usage_avg: decayed time-average dominant share (0..1), from `UsageTracker`.
        share_now: dominant share of what the queue holds right now (0..1).
        weight_fraction: the queue's weight over the sum of weights.
        now_weight: weight of `share_now` in the blend (history gets the rest).
    """
    blended = (1.0 - now_weight) * usage_avg + now_weight * share_now
    return blended / max(weight_fraction, 1e-12)


class UsageTracker:
    """Incremental decayed usage per queue, advanced by the shell with explicit times.

    The integral is exact for piecewise-constant allocations: between two calls to `advance`
    the allocation is constant, so U(t+d) = U(t) * 2^(-d/H) + a * H/ln2 * (1 - 2^(-d/H)).
    """

    __slots__ = ("_alloc", "_at", "_half_life_s", "_usage")

    def __init__(self, queues: Iterable[str], half_life_s: float, *, now: float = 0.0):
        self._half_life_s = half_life_s
        self._usage = {name: 0.0 for name in queues}
        self._alloc = dict.fromkeys(self._usage, 0.0)
        self._at = now

    def advance(self, now: float) -> None:
        """Integrate the current allocation up to `now` (no-op for times in the past)."""
        dt = now - self._at
        if dt <= 0:
            return
        decay = 2.0 ** (-dt / self._half_life_s)
        gain = self._half_life_s / LN2 * (1.0 - decay)
        usage = self._usage
        for name, share in self._alloc.items():
            usage[name] = usage[name] * decay + share * gain
        self._at = now

    def add(self, queue: str, share: float) -> None:
        """Change the queue's current dominant share by `share` (negative to release)."""
        self._alloc[queue] = max(0.0, self._alloc.get(queue, 0.0) + share)
        self._usage.setdefault(queue, 0.0)

    def averages(self) -> dict[str, float]:
        """Decayed time-average dominant share per queue (0..1)."""
        scale = LN2 / self._half_life_s
        return {name: u * scale for name, u in self._usage.items()}
