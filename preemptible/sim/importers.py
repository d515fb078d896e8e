"""Convert public GPU cluster traces to the canonical trace, and size a cluster.

The layout is recognised from the header row. What each source lacks is filled in openly,
never invented silently:

- Philly (Pollux `philly.csv`): queue = the Philly VC (`cluster` column); tier normal.
- Chronus (`trace_job_Philly_*.csv`): times are minutes (x60); queue = the VC (`user`);
  tier from `job_type`: strict -> high, soft -> normal, best -> low. Rows with 0 GPUs are dropped.
- Microsoft ITP (raw and elasticflow) and Tiresias: no group column; jobs are spread over
  `teams` synthetic queues by a hash of the job id (stable across runs); tier normal.

No source has runtime estimates or checkpoint costs; those columns stay empty and the simulator
uses its defaults (see `SimOptions`). A value that cannot be read raises `TraceFormatError`
naming the file, the line (the header is line 1) and the column.
"""

from __future__ import annotations

import datetime as dt
import math
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from preemptible.errors import ConfigError, TraceFormatError
from preemptible.queue.core import QueueConfig
from preemptible.sim.trace import REQUIRED, TraceJob, numbered_rows, read_trace

TEAM_NAMES = tuple(f"team-{c}" for c in "abcdefghij")


@dataclass(frozen=True, kw_only=True, slots=True)
class Imported:
    """The converted jobs and what the conversion had to drop."""

    layout: str
    jobs: list[TraceJob]
    dropped: int
    """Rows skipped (zero GPUs, missing times); the reason is in `note`."""
    note: str = ""


def detect_layout(header: Sequence[str]) -> str | None:
    """Name of the layout of a CSV header, or None."""
    cols = {h.strip() for h in header}
    if set(REQUIRED) <= cols:
        return "canonical"
    if {"timestamp", "duration", "num_gpus", "cluster"} <= cols:
        return "philly-pollux"
    if {"submit_time", "duration", "num_gpu", "job_type", "user"} <= cols:
        return "chronus"
    if {"submission_time", "duration", "num_gpu"} <= cols:
        return "itp"
    if {"job_id", "num_gpu", "submit_time", "duration"} <= cols:
        return "tiresias"
    return None


def _team(job_id: str, teams: int) -> str:
    return TEAM_NAMES[zlib.crc32(job_id.encode()) % teams]


def import_trace(path: str | Path, *, teams: int = 4) -> Imported:
    """Read a public trace (or a canonical one) into canonical jobs, submit times from 0.

    Raises:
        ConfigError: `teams` is out of range.
        TraceFormatError: the layout is not recognised or a value is invalid (the message names
            the file, the line and the column).
    """
    path = Path(path)
    if not 1 <= teams <= len(TEAM_NAMES):
        raise ConfigError(f"teams must be between 1 and {len(TEAM_NAMES)}, not {teams}")
    jobs: list[TraceJob] = []
    dropped = 0
    with path.open(newline="") as fh:
        header, rows = numbered_rows(path, fh)
        layout = detect_layout(header)
        if layout is None:
            raise TraceFormatError(
                f"{path}:1: unknown trace layout (columns: {', '.join(header)}); expected the "
                "canonical columns or a Philly, Chronus, ITP or Tiresias trace"
            )
        if layout == "canonical":
            return Imported(layout=layout, jobs=read_trace(path), dropped=0)
        for index, (line, row) in enumerate(rows, start=1):
            try:
                job = _convert(layout, row, index, teams)
            except _BadCell as bad:
                raise TraceFormatError(
                    f"{path}:{line}: column {bad.column!r}: {bad.problem}"
                ) from None
            if job is None:
                dropped += 1
            else:
                jobs.append(job)
    if not jobs:
        raise TraceFormatError(f"{path}: no usable rows")
    t0 = min(j.submit_s for j in jobs)
    jobs = [_shift(j, t0) for j in jobs]
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    note = f"{dropped} rows without GPUs or times dropped" if dropped else ""
    return Imported(layout=layout, jobs=jobs, dropped=dropped, note=note)


def _shift(job: TraceJob, t0: float) -> TraceJob:
    return TraceJob(
        job_id=job.job_id,
        submit_s=job.submit_s - t0,
        duration_s=job.duration_s,
        gpus=job.gpus,
        queue=job.queue,
        tier=job.tier,
    )


class _BadCell(Exception):
    """A cell that cannot be read; `import_trace` adds the file and the line."""

    def __init__(self, column: str, problem: str):
        super().__init__(problem)
        self.column = column
        self.problem = problem


def _cell(row: dict[str, str], column: str) -> str:
    value = row.get(column)
    if value is None:
        raise _BadCell(column, "no value (the column is absent or the row is short)")
    return value.strip()


def _float(row: dict[str, str], column: str) -> float:
    """The cell as a number; nan and inf pass (the row is then dropped, as without times)."""
    raw = _cell(row, column)
    try:
        return float(raw)
    except ValueError:
        raise _BadCell(column, f"{raw!r} is not a number") from None


def _count(row: dict[str, str], column: str) -> int:
    value = _float(row, column)
    if not math.isfinite(value):
        raise _BadCell(column, f"{row[column].strip()!r} is not a GPU count")
    return int(value)


def _convert(layout: str, row: dict[str, str], index: int, teams: int) -> TraceJob | None:
    """The canonical job of the `index`-th row (from 1), or None to drop the row."""
    if layout == "philly-pollux":
        raw_when = _cell(row, "timestamp")
        try:
            when = dt.datetime.fromisoformat(raw_when).replace(tzinfo=dt.UTC)
        except ValueError:
            raise _BadCell("timestamp", f"{raw_when!r} is not an ISO date and time") from None
        gpus = _count(row, "num_gpus")
        job_id, submit = f"philly-{index}", when.timestamp()
        duration, queue, tier = _float(row, "duration"), f"vc-{_cell(row, 'cluster')}", "normal"
    elif layout == "chronus":
        gpus = _count(row, "num_gpu")
        job_id = f"chronus-{_cell(row, 'job_id')}"
        submit, duration = _float(row, "submit_time") * 60.0, _float(row, "duration") * 60.0
        queue = _cell(row, "user") or "vc-unknown"
        tier = {"strict": "high", "soft": "normal", "best": "low"}.get(
            _cell(row, "job_type"), "normal"
        )
    else:  # itp, tiresias
        gpus = _count(row, "num_gpu")
        raw_id = _cell(row, "job_id")
        job_id = raw_id if layout == "itp" else f"tiresias-{raw_id}"
        submit_col = "submission_time" if layout == "itp" else "submit_time"
        submit, duration = _float(row, submit_col), _float(row, "duration")
        queue, tier = _team(job_id, teams), "normal"
    if gpus <= 0 or not math.isfinite(submit) or not math.isfinite(duration):
        return None
    return TraceJob(
        job_id=job_id,
        submit_s=submit,
        duration_s=max(1.0, duration),
        gpus=gpus,
        queue=queue,
        tier=tier,
    )


def offered_gpus(jobs: Sequence[TraceJob]) -> float:
    """Mean busy GPUs if every job ran at submission: GPU-hours / hours to the last end."""
    if not jobs:
        return 0.0
    start = min(j.submit_s for j in jobs)
    end = max(j.submit_s + j.duration_s for j in jobs)
    return sum(j.gpus * j.duration_s for j in jobs) / max(end - start, 1.0)


def suggest_config(
    jobs: Sequence[TraceJob],
    *,
    gpus: int | None = None,
    gpus_per_node: int | None = 8,
    load: float = 1.0,
    half_life: str = "7d",
) -> str:
    """A TOML configuration for a trace: one queue per trace queue, quotas by demand.

    The cluster defaults to the offered load divided by `load` (so load 1.0 means the cluster is
    exactly as large as the mean demand and is oversubscribed whenever demand bursts), rounded
    up to whole nodes and at least as large as the largest job. Weights and nominal quotas are
    proportional to each queue's GPU-hours; borrowing is unlimited.
    """
    per = gpus_per_node or 1
    biggest = max((j.gpus for j in jobs), default=1)
    if gpus is None:
        gpus = max(biggest, math.ceil(offered_gpus(jobs) / load / per) * per, per)
    if gpus_per_node and gpus % gpus_per_node:
        gpus = math.ceil(gpus / gpus_per_node) * gpus_per_node
    demand: dict[str, float] = defaultdict(float)
    for j in jobs:
        demand[j.queue] += j.gpus * j.duration_s
    total = sum(demand.values()) or 1.0
    lines = ["[cluster]", f"gpus = {gpus}"]
    if gpus_per_node:
        lines += [f"nodes = {gpus // gpus_per_node}", f"gpus_per_node = {gpus_per_node}"]
    lines += [
        "",
        "[policy]",
        f'fair_share_half_life = "{half_life}"',
        'aging = "1h"',
        "backfill = true",
        "",
        "[preemption]",
        'min_runtime = "5m"',
        "",
    ]
    for name in sorted(demand):
        share = demand[name] / total
        lines += [
            "[[queues]]",
            f'name = "{name}"',
            f"weight = {max(round(share, 4), 0.0001)}",
            f"nominal = {{ gpus = {math.floor(share * gpus)} }}",
            "",
        ]
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True, slots=True)
class QuotaShortfall:
    """A queue whose trace holds jobs larger than its nominal quota."""

    queue: str
    nominal_gpus: float
    jobs: int
    """How many of its jobs ask for more GPUs than `nominal_gpus`."""
    largest_gpus: int

    def describe(self) -> str:
        """One line for a person: what it means and what to do."""
        jobs = "1 job" if self.jobs == 1 else f"{self.jobs} jobs"
        return (
            f"{self.queue} has {jobs} of up to {self.largest_gpus} GPUs, above its nominal quota "
            f"of {self.nominal_gpus:g}: they can run only on borrowed (reclaimable) capacity and "
            f"may wait for weeks on a busy cluster; a nominal quota of {self.largest_gpus} or "
            "more lets them run within it"
        )


def quota_shortfalls(jobs: Sequence[TraceJob], config: QueueConfig) -> list[QuotaShortfall]:
    """Queues with jobs that cannot run within their nominal quota, largest job first.

    Such a job is a borrower whatever its queue's usage: under the nominal guarantee any other
    queue's work within nominal quota goes before it and may reclaim it, so on a saturated cluster
    it waits until most other queues leave their quota idle (the longest waits of
    `docs/evaluation/policy-evaluation.md`, "Quotas against big gangs"). A configuration in which no
    queue has a nominal quota (weights only) guarantees nothing to anyone and reports none.
    """
    nominal = {q.name: q.nominal.gpus for q in config.queues}
    if not any(n > 0 for n in nominal.values()):
        return []
    count: dict[str, int] = defaultdict(int)
    largest: dict[str, int] = defaultdict(int)
    for j in jobs:
        if j.queue in nominal and j.gpus > nominal[j.queue]:
            count[j.queue] += 1
            largest[j.queue] = max(largest[j.queue], j.gpus)
    found = [
        QuotaShortfall(queue=q, nominal_gpus=nominal[q], jobs=n, largest_gpus=largest[q])
        for q, n in count.items()
    ]
    return sorted(found, key=lambda f: (-f.largest_gpus, f.queue))
