"""The simulator's report as one self-contained HTML file (`preemptible sim --html FILE`).

One file that opens from disk, from a mail attachment or from a CI artifact, with nothing fetched:
inline CSS, no script, no font or image from elsewhere. Charts are PNG data URIs rather than
inline SVG: a PNG's size does not grow with the trace (the SVG of a 100,000-job wait CDF holds
100,000 points), and an `<img>` keeps each chart's element ids out of the page's.

The page is drawn from the `--json` report object and the charts of `preemptible.sim.plots`,
so the numbers are the JSON's, printed as the terminal table prints them. Every string that
comes from the input (trace and config paths, queue names, notes) is escaped.

Per-run charts are drawn as each run ends (`HtmlReport.add_run`), so that a comparison of
five policies on a large trace holds one run's job records at a time, not five.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any, NamedTuple

from preemptible._files import replace_atomically
from preemptible._units import fmt_duration
from preemptible._version import __version__
from preemptible.sim.engine import SimResult
from preemptible.sim.kpis import (
    COMPARISON_COLUMNS,
    FAILURE_COLUMNS,
    ISLAND_COLUMNS,
    Column,
    format_metric,
)
from preemptible.sim.plots import COMPARISON_CHARTS, RUN_CHARTS, Timeline, png_bytes, timeline

QUEUE_COLUMNS = (
    Column("jobs", "jobs", "count", False),
    Column("weight_share", "weight", "pct", False),
    Column("gpu_share", "GPU share", "pct", False),
    Column("p50_wait_s", "p50 wait", "dur", False),
    Column("p95_wait_s", "p95 wait", "dur", False),
    Column("max_wait_s", "max wait", "dur", False),
    Column("mean_jct_s", "mean JCT", "dur", False),
    Column("gpu_s_admitted", "GPU-h", "gpuh", False),
    Column("utilization", "util", "pct", False),
    Column("goodput", "goodput", "pct", False),
    Column("preemptions", "preemptions", "count", False),
    Column("moves", "moves", "count", False),
    Column("lost_gpu_s", "lost GPU-h", "gpuh", False),
)
"""Columns of each policy's per-queue table (keys of `summarize()`'s per-queue metrics)."""
QUEUE_FAILURE_COLUMNS = (
    Column("crashes", "crashes", "count", False),
    Column("hangs", "hangs", "count", False),
    Column("jobs_failed", "jobs failed", "count", False),
    Column("failure_lost_gpu_s", "lost to failures GPU-h", "gpuh", False),
)
"""Columns added to the per-queue tables where the run models crashes and hangs."""
QUEUE_ISLAND_COLUMNS = (
    Column("jobs_split", "jobs split", "count", False),
    Column("split_gpu_s", "held split GPU-h", "gpuh", False),
)
"""Columns added to the per-queue tables where the run models NVLink islands."""

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .1em 1em; }
dl.meta dt { font-weight: 600; }
dl.meta dd { margin: 0; }
table { border-collapse: collapse; margin: 1em 0; font-variant-numeric: tabular-nums; }
th, td { padding: .25em .6em; border-bottom: 1px solid #e3e3e3; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; }
td.best { font-weight: 700; background: #e6f4ea; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: .9em; }
.notes li { margin-bottom: .3em; }
nav a { margin-right: 1em; }
"""


class Chart(NamedTuple):
    """One chart of the page."""

    caption: str
    png: bytes


@dataclass(slots=True)
class HtmlReport:
    """A report on its way to `path`: the charts of the runs so far, drawn as each run ends.

    The path is checked when the report is made, so that a path that cannot be written fails
    before a long simulation rather than after it.
    """

    path: Path
    runs: dict[str, list[Chart]] = field(default_factory=dict)
    """Each policy's own charts, by policy name."""
    timelines: list[Timeline] = field(default_factory=list)
    """What the cross-policy charts need, one per run, in run order."""

    def __post_init__(self) -> None:
        check_writable(self.path)

    def add_run(self, result: SimResult) -> None:
        """Draw one run's charts and keep its timeline; its job records can then go."""
        self.runs[result.policy] = [
            Chart(f"{result.policy}: {chart.caption}", png_bytes(chart.draw(result)))
            for chart in RUN_CHARTS.values()
        ]
        self.timelines.append(timeline(result))

    def comparison(self) -> list[Chart]:
        """The cross-policy charts (none for a single run, whose own charts say it all)."""
        if len(self.timelines) < 2:
            return []
        return [
            Chart(chart.caption, png_bytes(chart.draw(self.timelines)))
            for chart in COMPARISON_CHARTS.values()
        ]

    def write(self, report: Mapping[str, Any], *, generated_at: datetime | None = None) -> int:
        """Render the page for `report` (the `--json` object) and write it; returns its size."""
        when = generated_at or datetime.now(UTC)
        return write_report(self.path, render(report, self, generated_at=when))


def render(report: Mapping[str, Any], charts: HtmlReport, *, generated_at: datetime) -> str:
    """The whole page for `report` (the `--json` object) and the charts of its runs."""
    policies: Mapping[str, Any] = report["policies"]
    title = f"preemptible sim: {report['trace']}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        _header(report, generated_at),
        _nav(policies),
        _notes(report),
        '<section id="comparison"><h2>Policies compared</h2>',
        _comparison_table(policies),
        (
            _policy_table("Crashes and hangs", "failures", FAILURE_COLUMNS, policies)
            if "failures" in report
            else ""
        ),
        (
            _policy_table("GPU placement within nodes", "islands", ISLAND_COLUMNS, policies)
            if "node_topology" in report
            else ""
        ),
        *(_figure(chart) for chart in charts.comparison()),
        "</section>",
        *(_policy_section(name, m, charts.runs.get(name, [])) for name, m in policies.items()),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def check_writable(path: Path) -> None:
    """Fail before a long simulation, not after it, when the report could not be written.

    Raises:
        OSError: `path` is a directory, or its folder cannot be made or written to.
    """
    if path.is_dir():
        raise IsADirectoryError(f"cannot write the report to {path}: it is a directory")
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise NotADirectoryError(f"cannot write the report to {path}: {blocker} is not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise OSError(f"cannot write the report to {path}: {exc.strerror or exc}") from exc


def write_report(path: Path, page: str) -> int:
    """Atomically replace `path` with `page` (`preemptible._files`).

    Returns:
        The size of the file in bytes.
    """
    check_writable(path)
    data = page.encode("utf-8")
    replace_atomically(path, data)
    return len(data)


# --- sections ---------------------------------------------------------------------------------


def _header(report: Mapping[str, Any], generated_at: datetime) -> str:
    first = next(iter(report["policies"].values()), None)
    overall = first["overall"] if first else {}
    rows = [
        ("trace", str(report["trace"])),
        ("config", str(report["config"])),
        ("jobs", f"{overall.get('jobs', 0):,}"),
        ("cluster", f"{overall.get('gpus', 0):,} GPUs"),
        ("demand", f"{overall.get('demand_ratio', 0.0):.2f}x supply while jobs arrive"),
        ("policies", ", ".join(report["policies"])),
        ("checkpointing", str(report["checkpointing"])),
        ("checkpoint interval", _duration_or_dash(report.get("checkpoint_interval_s"))),
        ("checkpoint cost", _duration_or_dash(report.get("default_checkpoint_s"))),
        ("cycle interval", _duration_or_dash(report.get("cycle_interval_s"))),
        *_failure_rows(report.get("failures")),
        *_island_rows(report.get("node_topology")),
        ("generated", generated_at.strftime("%Y-%m-%d %H:%M:%S %Z").strip()),
        ("preemptible", __version__),
    ]
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in rows)
    return f'<header><h1>Simulation report</h1><dl class="meta">{items}</dl></header>'


def _nav(policies: Iterable[str]) -> str:
    links = ['<a href="#notes">notes</a>', '<a href="#comparison">comparison</a>']
    links += [f'<a href="#{_anchor(name)}">{escape(name)}</a>' for name in policies]
    return f"<nav>{''.join(links)}</nav>"


def _notes(report: Mapping[str, Any]) -> str:
    notes = [str(f["note"]) for f in report.get("quota_shortfalls", [])]
    items = "".join(f"<li>{escape(n)}</li>" for n in notes)
    shortfalls = f"<ul>{items}</ul>" if notes else "<p>No queue has jobs beyond its quota.</p>"
    return (
        '<section id="notes" class="notes"><h2>Notes</h2>'
        f"{shortfalls}<p>How to read this report:</p><ul>"
        "<li>Wait is the total time a job spent pending, requeues included.</li>"
        "<li>Utilisation is GPU-seconds held over GPU-seconds available from the first "
        "submission to the last completion; goodput is the same less the GPU-seconds lost to "
        "preemptions (unsaved work, the save after the notice, the restore), charged at the "
        "notice.</li>"
        "<li>Moves (a job sent to another node so that a blocked gang gets a node block) count "
        "as preemptions.</li>"
        f"{_FAILURE_NOTE if 'failures' in report else ''}"
        f"{_ISLAND_NOTE if 'node_topology' in report else ''}"
        "<li>Per-queue utilisation and goodput are shares of the whole cluster, so they add up "
        "to the overall figures.</li>"
        "<li>In the comparison, the best value of each column is in bold (ties at the printed "
        "precision are all marked).</li>"
        "</ul></section>"
    )


_FAILURE_NOTE = (
    "<li>Jobs crash and hang at the rates in the header, the same jobs after the same GPU-hours "
    "of running under every policy. A crash loses the work since the job's last checkpoint; a "
    "hang holds its GPUs until the hang bound and a grace, and loses the same. Both restart "
    "from the checkpoint after a back-off, up to max_restarts. Goodput subtracts their loss "
    "too; the lost columns of the comparison are preemptions' alone.</li>"
)


_ISLAND_NOTE = (
    "<li>Each node's GPUs are in the NVLink islands of the header; a job gets GPU ids on each "
    "of its nodes by the placement there (topology: one island when one fits, as the queue "
    "manager places; lowest: the lowest free ids). A job is split when its GPUs on some node "
    "span islands, needlessly when they span more than their number needs; a split run "
    "progresses the slowdown times slower. Idle in partly used islands: the share of idle "
    "GPU-hours on GPUs whose island was partly in use.</li>"
)


def _island_rows(settings: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The header's lines on NVLink islands (none where the run models none)."""
    if settings is None:
        return []
    return [
        (
            "node topology",
            f"{settings['islands_per_node']} NVLink islands of {settings['gpus_per_island']} "
            "GPUs per node",
        ),
        ("placement", str(settings["placement"])),
        ("split slowdown", _slowdown_words(settings["split_slowdown"])),
    ]


def _slowdown_words(factor: float) -> str:
    return f"a split job runs {1 + factor:g}x slower" if factor else "none"


def _failure_rows(failures: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The header's lines on crashes and hangs (none where the run models none)."""
    if failures is None:
        return []
    limits = sorted(set(failures["max_restarts"].values()))
    return [
        ("crashes", f"{failures['crashes_per_1000_gpu_h']:g} per 1,000 GPU-hours of running"),
        ("hangs", f"{failures['hangs_per_1000_gpu_h']:g} per 1,000 GPU-hours of running"),
        ("failure seed", str(failures["seed"])),
        ("hang bound", fmt_duration(failures["hang_bound_s"])),
        (
            "restarts",
            f"max_restarts {' to '.join(str(n) for n in limits) or '0'}; back-off "
            f"{fmt_duration(failures['backoff_s'])} doubling to "
            f"{fmt_duration(failures['backoff_max_s'])}; a crash loop after "
            f"{failures['crash_loop_after']} failures without progress",
        ),
    ]


def _policy_table(
    heading: str, css_class: str, columns: Sequence[Column], policies: Mapping[str, Any]
) -> str:
    """A row per policy of its overall `columns` (the failures' or the islands' table)."""
    head = "".join(f"<th>{escape(c.heading)}</th>" for c in columns)
    rows = [
        f"<tr><th>{escape(name)}</th>"
        + "".join(_td(m["overall"][c.key], c.kind) for c in columns)
        + "</tr>"
        for name, m in policies.items()
    ]
    return (
        f'<h3>{escape(heading)}</h3><table class="{css_class}"><thead><tr><th>policy</th>'
        f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _comparison_table(policies: Mapping[str, Any]) -> str:
    best = _best_cells(policies)
    head = "".join(f"<th>{escape(c.heading)}</th>" for c in COMPARISON_COLUMNS)
    rows = []
    for name, metrics in policies.items():
        cells = "".join(
            _td(metrics["overall"][c.key], c.kind, best=(name, c.key) in best)
            for c in COMPARISON_COLUMNS
        )
        rows.append(f"<tr><th>{escape(name)}</th>{cells}</tr>")
    return (
        f'<table class="comparison"><thead><tr><th>policy</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _best_cells(policies: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(policy, metric) of the best value in each column, as printed; none for a single run.

    A policy that preempted nothing has no loss per preemption (its 0 is not a best).
    """
    if len(policies) < 2:
        return set()
    marked = set()
    for c in COMPARISON_COLUMNS:
        values = {
            name: m["overall"][c.key]
            for name, m in policies.items()
            if m["overall"]["preemptions"] or not c.key.endswith("_per_preemption")
        }
        if not values:
            continue
        best = (max if c.higher_is_better else min)(values.values())
        shown = format_metric(best, c.kind)
        marked |= {(n, c.key) for n, v in values.items() if format_metric(v, c.kind) == shown}
    return marked


def _policy_section(name: str, metrics: Mapping[str, Any], charts: Sequence[Chart]) -> str:
    overall = metrics["overall"]
    least = overall.get("least_served_queue") or "-"
    summary = (
        f"{overall['cycles']:,} scheduling cycles, simulated in {overall['sim_seconds']:.1f} s; "
        f"least-served queue {least} "
        f"(max wait {fmt_duration(overall['max_wait_least_served_s'])})."
    )
    return "\n".join(
        [
            f'<section id="{_anchor(name)}"><h2>{escape(name)}</h2>',
            f"<p>{escape(summary)}</p>",
            _queue_table(metrics["queues"]),
            *(_figure(chart) for chart in charts),
            "</section>",
        ]
    )


def _queue_table(queues: Mapping[str, Mapping[str, float]]) -> str:
    first = next(iter(queues.values()), {})
    columns = QUEUE_COLUMNS + (QUEUE_FAILURE_COLUMNS if "crashes" in first else ())
    columns += QUEUE_ISLAND_COLUMNS if "jobs_split" in first else ()
    head = "".join(f"<th>{escape(c.label)}</th>" for c in columns)
    rows = [
        f"<tr><th>{escape(q)}</th>{''.join(_td(m[c.key], c.kind) for c in columns)}</tr>"
        for q, m in queues.items()
    ]
    return (
        f'<table class="queues"><thead><tr><th>queue</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


# --- elements ---------------------------------------------------------------------------------


def _td(value: float, kind: str, *, best: bool = False) -> str:
    """A number cell: printed as the terminal prints it, the exact JSON value in `data-value`."""
    css = "num best" if best else "num"
    return f'<td class="{css}" data-value="{value!r}">{escape(format_metric(value, kind))}</td>'


def _figure(chart: Chart) -> str:
    data = base64.b64encode(chart.png).decode("ascii")
    caption = escape(chart.caption)
    return (
        f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _anchor(policy: str) -> str:
    return escape(f"policy-{policy}")


def _duration_or_dash(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_duration(seconds)
