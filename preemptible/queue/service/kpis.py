"""The four signals (docs/maintainers/design.md), from the manager's job records over a window.

Per queue and overall: p95 queue wait (jobs still pending count with their wait so far),
utilisation (GPU-seconds admitted over GPU-seconds available), goodput (the same less the
GPU-seconds lost to preemption and to resizes), preemptions per hour with the lost GPU-seconds
per preemption, the resizes of elastic jobs (shrinks and grows, counted apart from preemptions),
and the longest wait of the least-served queue. The window is the last `window_s`, or the time
since the first submission when that is shorter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from preemptible._percentile import nearest_rank
from preemptible.queue.service.records import JobRecord
from preemptible.queue.service.views import JobState, SignalsView, StatsView


def compute(
    records: Sequence[JobRecord], *, queues: Iterable[str], gpus: int, now: float, window_s: float
) -> StatsView:
    first = min((r.submitted_at for r in records), default=now)
    span = max(min(window_s, now - first), 1e-9)
    by_queue = {name: [r for r in records if r.queue == name] for name in queues}
    per_queue = {name: _signals(rs, gpus=gpus, now=now, span=span) for name, rs in by_queue.items()}
    overall = _signals(records, gpus=gpus, now=now, span=span)
    least_served = max((s.max_wait_s for s in per_queue.values()), default=0.0)
    return StatsView(
        window_s=span, overall=overall, queues=per_queue, max_wait_least_served_s=least_served
    )


def _signals(records: Sequence[JobRecord], *, gpus: int, now: float, span: float) -> SignalsView:
    # `span` is passed, not recomputed as now - since: with no jobs it is 1e-9 s, which
    # epoch seconds cannot resolve (now - (now - 1e-9) == 0.0).
    since = now - span
    waits = [w for r in records for at, w in r.waits if at >= since]
    waits += [now - r.pending_since for r in records if r.state == JobState.PENDING]
    admitted = sum(
        (run[2] if len(run) > 2 else r.gpus)
        * max(0.0, min(now if run[1] < 0 else run[1], now) - max(run[0], since))
        for r in records
        for run in r.runs
    )
    losses = [lost for r in records for at, lost in r.losses if at >= since]
    lost = sum(losses)
    resizes = [lost for r in records for at, lost in r.resize_losses if at >= since]
    available = max(gpus * span, 1e-9)
    return SignalsView(
        p95_wait_s=_p95(waits),
        max_wait_s=max(waits, default=0.0),
        utilization=admitted / available,
        goodput=max(0.0, admitted - lost - sum(resizes)) / available,
        preemptions=len(losses),
        preemptions_per_hour=len(losses) / (span / 3600.0),
        lost_gpu_s=lost,
        lost_gpu_s_per_preemption=lost / len(losses) if losses else 0.0,
        jobs=len(records),
        resizes=len(resizes),
        resize_lost_gpu_s=sum(resizes),
    )


def _p95(values: list[float]) -> float:
    return nearest_rank(values, 0.95)
