"""The four signals (`docs/maintainers/design.md`) and job completion times, per queue and overall.

- p95 / max queue wait: total time a job spent pending, requeues included;
- utilisation: GPU-seconds held / GPU-seconds available over the horizon (first submit to last
  completion); goodput: the same minus GPU-seconds lost to preemption;
- preemptions per hour and lost GPU-seconds per preemption (a move, which sends a job to
  another node so that a blocked one gets a node block, counts as a preemption; `moves` says
  how many of them were moves); `preemptions_by_kind` and `lost_gpu_s_by_kind` count them and
  their loss apart by the rule that sent the notice (`PreemptKind`: tier, reclaim, beyond_limit,
  loan, move), so that what each rule costs shows;
- max wait of the least-served queue: the largest max wait of any queue (that queue is named).

With elastic jobs in the trace, `shrinks` and `grows` count resizes apart from preemptions, and
`resize_lost_gpu_s` says what they cost; that loss is part of `lost_gpu_s` and of goodput (a
resize saves and restores too), but not of `lost_gpu_s_per_preemption`. Without elastic jobs
these keys are absent, so reports of rigid traces do not change.

With crashes and hangs modelled (`SimOptions.failures`), `crashes`, `hangs`, `restarts`,
`jobs_failed` (not restarted: out of restarts or a crash loop; `crash_loops` of them),
`failure_lost_gpu_s` (`crash_lost_gpu_s` + `hang_lost_gpu_s`: work since the last checkpoint,
the time a hang held its GPUs, restores) and `unfinished_gpu_s` (the work failed jobs never
did) say what they cost. Goodput subtracts their loss as it does preemptions'; `lost_gpu_s`
and everything per preemption stay preemptions' alone, and a failed job has no completion
time (it is left out of the JCTs). Without failures these keys are absent.

With NVLink islands modelled (`SimOptions.node_topology`), `jobs_split` counts the jobs that
ran at least once on GPUs spanning islands on some node (`jobs_split_share`: of the jobs of more
than one GPU), `jobs_split_needlessly` those that spanned more islands on some node than their
GPUs there need, `split_gpu_s` the GPU-seconds held while split, and `slowdown_lost_gpu_s` what
split runs spent on their slowdown for the work they kept (`--split-slowdown`; goodput subtracts
it, as it does preemptions' loss, since that time did no work); overall,
`island_fragmentation` is the share of idle GPU-seconds that sat in partly used islands
(`preemptible.sim.gpu_ids`). Without islands these keys are absent.

Per-queue utilisation and goodput are shares of the whole cluster, so they add up to overall.
`demand_ratio` (GPU-seconds of work submitted / GPU-seconds available while jobs were arriving)
says whether demand exceeded supply, which is where the goodput goal applies; for that goal
`goodput_while_arriving` measures goodput over the same window (first to last submission), so
that the drain at the end of a finite trace, when demand has stopped, does not count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, get_args

from preemptible._percentile import nearest_rank
from preemptible._units import fmt_duration
from preemptible.queue.core import PreemptKind
from preemptible.sim.engine import JobHistory, SimResult
from preemptible.sim.failures import FailureKind, GaveUp


def _metrics(
    records: Sequence[JobHistory],
    available_gpu_s: float,
    hours: float,
    *,
    failures: bool,
    islands: bool = False,
) -> dict[str, Any]:
    waits = [r.wait_s for r in records]
    jcts = [(r.end_s or 0.0) - r.trace.submit_s for r in records if not _failed(r)]
    admitted = sum(r.admitted_gpu_s for r in records)
    lost = sum(r.lost_gpu_s for r in records)
    failure_lost = sum(r.failures.lost_gpu_s for r in records if r.failures is not None)
    slowdown_lost = sum(r.gpu_ids.slowdown_lost_gpu_s for r in records if r.gpu_ids is not None)
    preemptions = sum(r.preemptions for r in records)
    by_kind = {kind: 0 for kind in get_args(PreemptKind)}
    lost_by_kind = {kind: 0.0 for kind in by_kind}
    for r in records:
        for _, amount, kind in r.lost_log:
            by_kind[kind] += 1
            lost_by_kind[kind] += amount
    out: dict[str, Any] = {
        "jobs": len(records),
        "p50_wait_s": nearest_rank(waits, 0.50),
        "p95_wait_s": nearest_rank(waits, 0.95),
        "max_wait_s": max(waits, default=0.0),
        "mean_wait_s": sum(waits) / len(waits) if waits else 0.0,
        "mean_jct_s": sum(jcts) / len(jcts) if jcts else 0.0,
        "p95_jct_s": nearest_rank(jcts, 0.95),
        "utilization": admitted / available_gpu_s if available_gpu_s else 0.0,
        "goodput": (
            (admitted - lost - failure_lost - slowdown_lost) / available_gpu_s
            if available_gpu_s
            else 0.0
        ),
        "gpu_s_admitted": admitted,
        "preemptions": preemptions,
        "moves": sum(r.moves for r in records),
        "preemptions_per_hour": preemptions / hours if hours else 0.0,
        "lost_gpu_s": lost,
        "lost_gpu_s_per_preemption": lost / preemptions if preemptions else 0.0,
        "preemptions_by_kind": by_kind,
        "lost_gpu_s_by_kind": lost_by_kind,
    }
    if any(r.trace.min_gpus is not None for r in records):
        resize_lost = sum(r.resize_lost_gpu_s for r in records)
        out["shrinks"] = sum(r.shrinks for r in records)
        out["grows"] = sum(r.grows for r in records)
        out["resize_lost_gpu_s"] = resize_lost
        out["preemption_lost_gpu_s"] = lost - resize_lost
        out["lost_gpu_s_per_preemption"] = (
            (lost - resize_lost) / preemptions if preemptions else 0.0
        )
    if failures:
        out.update(_failure_metrics(records))
    if islands:
        out.update(_split_metrics(records))
    return out


def _split_metrics(records: Sequence[JobHistory]) -> dict[str, Any]:
    """How jobs were placed over NVLink islands (`JobGpus`)."""
    placed = [r.gpu_ids for r in records if r.gpu_ids is not None]
    multi = sum(r.trace.gpus > 1 for r in records)
    split = sum(p.split_placements > 0 for p in placed)
    return {
        "jobs_split": split,
        "jobs_split_share": split / multi if multi else 0.0,
        "jobs_split_needlessly": sum(p.needless_placements > 0 for p in placed),
        "split_gpu_s": sum(p.split_gpu_s for p in placed),
        "slowdown_lost_gpu_s": sum(p.slowdown_lost_gpu_s for p in placed),
    }


def _failed(rec: JobHistory) -> bool:
    """Whether the job failed for good (it never completed)."""
    return rec.failures is not None and rec.failures.gave_up is not None


def _failure_metrics(records: Sequence[JobHistory]) -> dict[str, Any]:
    """What crashes and hangs cost (`JobFailures`)."""
    kept = [r.failures for r in records if r.failures is not None]
    lost_by_kind = dict.fromkeys(FailureKind, 0.0)
    for f in kept:
        for _, amount, kind in f.log:
            lost_by_kind[kind] += amount
    return {
        "crashes": sum(f.crashes for f in kept),
        "hangs": sum(f.hangs for f in kept),
        "restarts": sum(f.restarts for f in kept),
        "jobs_failed": sum(f.gave_up is not None for f in kept),
        "crash_loops": sum(f.gave_up is GaveUp.CRASH_LOOP for f in kept),
        "failure_lost_gpu_s": sum(f.lost_gpu_s for f in kept),
        "crash_lost_gpu_s": lost_by_kind[FailureKind.CRASH],
        "hang_lost_gpu_s": lost_by_kind[FailureKind.HANG],
        "unfinished_gpu_s": sum(
            r.trace.gpus * (r.trace.duration_s - r.saved_s) for r in records if _failed(r)
        ),
    }


def summarize(result: SimResult) -> dict[str, Any]:
    """`{"overall": M, "queues": {name: M}}` in the `--json` schema of
    `docs/maintainers/design.md`.
    """
    horizon = max(result.end_s - result.start_s, 1e-9)
    available = result.gpus * horizon
    hours = horizon / 3600.0
    by_queue: dict[str, list[JobHistory]] = {name: [] for name in result.weights}
    for rec in result.records:
        by_queue.setdefault(rec.trace.queue, []).append(rec)
    failures = result.models_failures
    islands = result.island_fragmentation is not None
    queues = {
        name: _metrics(recs, available, hours, failures=failures, islands=islands)
        for name, recs in by_queue.items()
        if recs
    }
    total_weight = sum(result.weights[n] for n in queues) or 1.0
    total_admitted = sum(m["gpu_s_admitted"] for m in queues.values()) or 1.0
    for name, m in queues.items():
        m["weight_share"] = result.weights[name] / total_weight
        m["gpu_share"] = m["gpu_s_admitted"] / total_admitted
    overall = _metrics(result.records, available, hours, failures=failures, islands=islands)
    if result.island_fragmentation is not None:
        overall["island_fragmentation"] = result.island_fragmentation
    least = max(queues, key=lambda n: (queues[n]["max_wait_s"], n), default="")
    last_submit = max((r.trace.submit_s for r in result.records), default=result.start_s)
    window = max(last_submit - result.start_s, 1.0)
    demand = sum(r.trace.duration_s * r.trace.gpus for r in result.records)
    window_gpu_s = result.gpus * window
    in_window = sum(
        g * max(0.0, min(end, last_submit) - max(start, result.start_s))
        for r in result.records
        for (start, end), g in zip(r.runs, r.run_gpus, strict=True)
    )
    lost_in_window = sum(
        amount
        for r in result.records
        for at, amount, _ in (*r.lost_log, *(r.failures.log if r.failures else ()))
        if at <= last_submit
    ) + sum(
        amount
        for r in result.records
        for at, amount in (r.gpu_ids.slowdown_log if r.gpu_ids else ())
        if at <= last_submit
    )
    overall.update(
        {
            "utilization_while_arriving": in_window / window_gpu_s,
            "goodput_while_arriving": (in_window - lost_in_window) / window_gpu_s,
            "max_wait_least_served_s": queues[least]["max_wait_s"] if least else 0.0,
            "least_served_queue": least,
            "sim_seconds": result.sim_seconds,
            "horizon_s": horizon,
            "gpus": result.gpus,
            "cycles": result.cycles,
            "fragmentation_mean": result.fragmentation_mean,
            "demand_ratio": demand / (result.gpus * window),
            "lost_share_of_delivered": (
                overall["lost_gpu_s"] / overall["gpu_s_admitted"]
                if overall["gpu_s_admitted"]
                else 0.0
            ),
        }
    )
    return {"overall": overall, "queues": queues}


class Column(NamedTuple):
    """One column of the policy comparison, shared by the terminal table and the HTML report."""

    key: str
    """Key in the `overall` metrics."""
    label: str
    kind: str
    """How to print it: "pct", "dur", "gpuh", "gpuh_small", "count" or "num" (`format_metric`)."""
    higher_is_better: bool

    @property
    def heading(self) -> str:
        """The label with its unit where every value has the same one (durations print their
        own: `fmt_duration`)."""
        unit = {"gpuh": " (GPU-h)", "gpuh_small": " (GPU-h)"}.get(self.kind, "")
        return self.label + unit


COMPARISON_COLUMNS = (
    Column("utilization", "util", "pct", True),
    Column("goodput", "goodput", "pct", True),
    Column("p95_wait_s", "p95 wait", "dur", False),
    Column("max_wait_least_served_s", "max wait (least served)", "dur", False),
    Column("mean_jct_s", "mean JCT", "dur", False),
    Column("p95_jct_s", "p95 JCT", "dur", False),
    Column("preemptions_per_hour", "preempt/h", "num", False),
    Column("lost_gpu_s", "lost", "gpuh", False),
    Column("lost_gpu_s_per_preemption", "lost per preempt", "gpuh_small", False),
)

FAILURE_COLUMNS = (
    Column("crashes", "crashes", "count", False),
    Column("hangs", "hangs", "count", False),
    Column("restarts", "restarts", "count", False),
    Column("jobs_failed", "jobs failed", "count", False),
    Column("crash_lost_gpu_s", "lost to crashes", "gpuh", False),
    Column("hang_lost_gpu_s", "lost to hangs", "gpuh", False),
    Column("unfinished_gpu_s", "work never done", "gpuh", False),
)
"""What crashes and hangs cost each policy, where the run models them (`--crash-rate`,
`--hang-rate`): a table of its own in the terminal and the HTML report."""

ISLAND_COLUMNS = (
    Column("jobs_split", "jobs split", "count", False),
    Column("jobs_split_share", "of multi-GPU jobs", "pct", False),
    Column("jobs_split_needlessly", "split needlessly", "count", False),
    Column("split_gpu_s", "held split", "gpuh", False),
    Column("slowdown_lost_gpu_s", "lost to slowdown", "gpuh", False),
    Column("island_fragmentation", "idle in partly used islands", "pct", False),
)
"""How each policy's jobs were placed over NVLink islands, where the run models them
(`--node-topology`): a table of its own in the terminal and the HTML report."""


def duration_unit(seconds: list[float]) -> tuple[str, float]:
    """One unit for a column of durations, from its largest: ("h", 3600), ("min", 60) or
    ("s", 1), so that a column never mixes 108.8m and 4.7h."""
    largest = max(seconds, default=0.0)
    if largest >= 7200:
        return "h", 3600.0
    if largest >= 120:
        return "min", 60.0
    return "s", 1.0


def in_unit(value: float) -> str:
    """One decimal, two below one unit (56 s is 0.02 h, not 0.0 h)."""
    return f"{value:.1f}" if value >= 1 or value == 0 else f"{value:.2f}"


def column_format(column: Column, values: list[float]) -> tuple[str, Callable[[float], str]]:
    """A column's heading with its unit, and how each of its values prints in that unit."""
    if column.kind == "dur":
        unit, per = duration_unit(values)
        return f"{column.label} ({unit})", lambda v: in_unit(v / per)
    if column.kind == "gpuh":
        return f"{column.label} (GPU-h)", lambda v: f"{v / 3600:,.1f}"
    if column.kind == "gpuh_small":
        return f"{column.label} (GPU-h)", lambda v: f"{v / 3600:,.2f}"
    if column.kind == "pct":
        return f"{column.label} (%)", lambda v: f"{100 * v:.1f}"
    return column.label, lambda v: format_metric(v, column.kind)


def format_metric(value: float, kind: str) -> str:
    """A metric as the tables print it (`Column.kind`)."""
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "dur":
        return fmt_duration(value)
    if kind == "gpuh":
        return f"{value / 3600:.1f}"
    if kind == "gpuh_small":
        return f"{value / 3600:.2f}"
    if kind == "count":
        return f"{value:,.0f}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"
