"""The canonical trace format: one CSV row per job (the contract of docs/maintainers/design.md).

Required columns: job_id, submit_s, duration_s, gpus, queue, tier.
Optional columns: cpus, memory_gb, estimate_s, checkpoint_s, and for elastic jobs min_gpus and
gpus_multiple (empty cells mean "not given"; `write_trace` writes the elastic two only when a
job is elastic, so rigid traces keep their columns).
Any other column is ignored, so importers may keep provenance columns. Every problem raises
`TraceFormatError` naming the file, the line and the column, because a simulator that silently
skips bad rows reports numbers for a different workload.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from preemptible.errors import TraceFormatError
from preemptible.queue.core.model import Tier, elastic_range_problem

REQUIRED = ("job_id", "submit_s", "duration_s", "gpus", "queue", "tier")
OPTIONAL = ("cpus", "memory_gb", "estimate_s", "checkpoint_s")
ELASTIC = ("min_gpus", "gpus_multiple")
"""Optional columns of elastic jobs (`Job.min_gpus`, `Job.gpus_multiple`)."""
TIERS = tuple(t.value for t in sorted(Tier, key=lambda t: -t.rank))
"""The core's tiers, highest first (as the error message lists them)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceJob:
    """One job of a trace."""

    job_id: str
    submit_s: float
    duration_s: float
    """Work to do, in seconds of uninterrupted running."""
    gpus: int
    queue: str
    tier: str = "normal"
    cpus: float = 0.0
    memory_gb: float = 0.0
    estimate_s: float | None = None
    """User's runtime estimate, for backfill."""
    checkpoint_s: float | None = None
    """Save (and restore) cost of one checkpoint."""
    min_gpus: int | None = None
    """Smallest size an elastic job may run at; None: rigid."""
    gpus_multiple: int = 1
    """An elastic job's sizes are multiples of this."""


def read_trace(path: str | Path) -> list[TraceJob]:
    """Read a canonical trace CSV, sorted by submit time then file order.

    Raises:
        TraceFormatError: a required column is missing or a value is invalid; the message names
            the file, the line (1-based, the header is line 1) and the column.
        OSError: the file cannot be read.
    """
    path = Path(path)
    with path.open(newline="") as fh:
        header, rows = numbered_rows(path, fh)
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise TraceFormatError(
                f"{path}: missing column {missing[0]!r} in the header (line 1); a trace needs "
                f"{', '.join(REQUIRED)} (convert public traces with `preemptible sim import`)"
            )
        jobs: list[TraceJob] = []
        first_seen: dict[str, int] = {}
        for line, row in rows:
            job = _row(path, line, row)
            if job.job_id in first_seen:
                raise TraceFormatError(
                    f"{path}:{line}: column 'job_id': {job.job_id!r} appears twice (first on "
                    f"line {first_seen[job.job_id]}); give each job its own id"
                )
            first_seen[job.job_id] = line
            jobs.append(job)
    jobs.sort(key=lambda j: j.submit_s)
    return jobs


def numbered_rows(
    path: Path, lines: Iterable[str]
) -> tuple[list[str], Iterator[tuple[int, dict[str, str]]]]:
    """The stripped header of a CSV and its rows as (line, {column: cell}).

    The line is where the row starts in the file, counted from 1 with the header as line 1, so
    that blank lines and quoted cells that span lines do not shift it (counting rows would).
    A short row lacks its last columns, as with `csv.DictReader`.

    Raises:
        TraceFormatError: the CSV itself is malformed (the message names the line).
    """
    reader = csv.reader(lines)
    try:
        header = [h.strip() for h in next(reader, [])]
    except csv.Error as exc:
        raise TraceFormatError(f"{path}:{reader.line_num}: not a valid CSV header: {exc}") from None

    def rows() -> Iterator[tuple[int, dict[str, str]]]:
        while True:
            start = reader.line_num + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise TraceFormatError(f"{path}:{start}: not a valid CSV row: {exc}") from None
            if not cells:  # a blank line
                continue
            yield start, dict(zip(header, cells, strict=False))

    return header, rows()


def _row(path: Path, line: int, row: dict[str, str]) -> TraceJob:
    def text(col: str) -> str:
        value = row.get(col)
        return "" if value is None else value.strip()

    def number(col: str, *, required: bool, minimum: float = 0.0) -> float | None:
        raw = text(col)
        if raw == "":
            if required:
                raise TraceFormatError(f"{path}:{line}: column {col!r} is empty")
            return None
        try:
            value = float(raw)
        except ValueError:
            raise TraceFormatError(
                f"{path}:{line}: column {col!r}: {raw!r} is not a number"
            ) from None
        if not math.isfinite(value) or value < minimum:
            raise TraceFormatError(
                f"{path}:{line}: column {col!r}: {raw!r} must be a number >= {minimum:g}"
            )
        return value

    job_id = text("job_id")
    if not job_id:
        raise TraceFormatError(f"{path}:{line}: column 'job_id' is empty")
    queue = text("queue")
    if not queue:
        raise TraceFormatError(f"{path}:{line}: column 'queue' is empty")
    tier = text("tier").lower() or "normal"
    if tier not in TIERS:
        raise TraceFormatError(
            f"{path}:{line}: column 'tier': {tier!r} is not one of {', '.join(TIERS)}"
        )
    gpus = number("gpus", required=True)
    assert gpus is not None
    if gpus != int(gpus):
        raise TraceFormatError(f"{path}:{line}: column 'gpus': {gpus:g} is not a whole number")
    min_gpus, multiple = _elastic(path, line, int(gpus), number)
    return TraceJob(
        job_id=job_id,
        submit_s=number("submit_s", required=True) or 0.0,
        duration_s=number("duration_s", required=True) or 0.0,
        gpus=int(gpus),
        queue=queue,
        tier=tier,
        cpus=number("cpus", required=False) or 0.0,
        memory_gb=number("memory_gb", required=False) or 0.0,
        estimate_s=number("estimate_s", required=False),
        checkpoint_s=number("checkpoint_s", required=False),
        min_gpus=min_gpus,
        gpus_multiple=multiple,
    )


def _elastic(
    path: Path, line: int, gpus: int, number: Callable[..., float | None]
) -> tuple[int | None, int]:
    """(min_gpus, gpus_multiple) of a row, checked as the service checks a submission."""
    whole: dict[str, int | None] = {}
    for col in ELASTIC:
        value = number(col, required=False)
        if value is not None and value != int(value):
            raise TraceFormatError(
                f"{path}:{line}: column {col!r}: {value:g} is not a whole number"
            )
        whole[col] = None if value is None else int(value)
    low, multiple = whole["min_gpus"], whole["gpus_multiple"] or 1
    problem = elastic_range_problem(gpus, low, multiple, max(gpus, low or 0))
    if problem is not None:
        raise TraceFormatError(f"{path}:{line}: {problem}")
    return low, multiple


def write_trace(path: str | Path, jobs: Iterable[TraceJob]) -> int:
    """Write jobs as a canonical trace CSV; returns the number of rows."""
    count = 0
    jobs = list(jobs)
    elastic = any(j.min_gpus is not None for j in jobs)
    with Path(path).open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow((*REQUIRED, *OPTIONAL, *(ELASTIC if elastic else ())))
        for j in jobs:
            extra = ("" if j.min_gpus is None else j.min_gpus, j.gpus_multiple) if elastic else ()
            writer.writerow(
                (
                    j.job_id,
                    _fmt(j.submit_s),
                    _fmt(j.duration_s),
                    j.gpus,
                    j.queue,
                    j.tier,
                    _fmt(j.cpus) if j.cpus else "",
                    _fmt(j.memory_gb) if j.memory_gb else "",
                    "" if j.estimate_s is None else _fmt(j.estimate_s),
                    "" if j.checkpoint_s is None else _fmt(j.checkpoint_s),
                    *extra,
                )
            )
            count += 1
    return count


def _fmt(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:.3f}"
