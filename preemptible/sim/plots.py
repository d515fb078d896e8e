"""Charts of a simulation, drawn once and used twice: saved as PNG files (`--plot DIR`) and
embedded in the HTML report (`--html FILE`, `preemptible.sim.html_report`).

Each chart is a function from data to a matplotlib `Figure`, built without pyplot: no global
figure registry to close, no backend to select, nothing shared between two reports drawn in
one process. matplotlib is imported only when a chart is drawn.

Per run: utilisation by queue, wait-time CDF per queue, each queue's share of the used GPUs
against its weight, preemptions by queue over time. Across runs (`Timeline`, small enough to
keep for every policy of a comparison): wait-time CDF of all jobs, utilisation and goodput
over time, cumulative preemptions.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from preemptible._extras import require
from preemptible.sim.engine import SimResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_Corner = Literal["upper right", "upper left", "lower right"]

DPI = 90
"""Dots per inch of every chart: legible on screen, about 30 KB a PNG."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeline:
    """What the cross-policy charts need from one run, without its per-job records."""

    policy: str
    hours: list[float]
    """Start of each time bin, in hours from the first submission."""
    utilization: list[float]
    """Share of the cluster's GPUs held in each bin."""
    goodput: list[float]
    """The same less the GPU-seconds lost to preemptions (charged at the notice) and to crashes
    and hangs (charged when the job left) in the bin."""
    preemptions: list[int]
    """Preemptions in each bin, moves included."""
    waits_h: list[float]
    """Every job's total wait, in hours, sorted."""


def timeline(result: SimResult) -> Timeline:
    """The per-bin totals of one run, over all queues."""
    capacity = _bin_width_s(result) * result.gpus
    held = _total(result.timeline_gpu_s.values(), len(result.timeline_edges) - 1)
    lost = _total(result.timeline_lost_gpu_s.values(), len(held))
    failed = _total(result.timeline_failure_lost_gpu_s.values(), len(held))
    preemptions = _total(result.timeline_preemptions.values(), len(held))
    return Timeline(
        policy=result.policy,
        hours=_bin_hours(result),
        utilization=[h / capacity for h in held],
        goodput=[(h - x - f) / capacity for h, x, f in zip(held, lost, failed, strict=True)],
        preemptions=[round(p) for p in preemptions],
        waits_h=sorted(rec.wait_s / 3600.0 for rec in result.records),
    )


# --- charts of one run ------------------------------------------------------------------------


def utilization_figure(result: SimResult) -> Figure:
    """Stacked share of the cluster's GPUs held by each queue over time."""
    fig, ax = _figure(width=8)
    queues = sorted(result.timeline_gpu_s)
    capacity = _bin_width_s(result) * result.gpus
    series = [[v / capacity for v in result.timeline_gpu_s[q]] for q in queues]
    hours = _bin_hours(result)
    if hours and series:
        ax.stackplot(hours, series, labels=queues, step="post")
    ax.set_xlabel("hours")
    ax.set_ylabel("share of cluster GPUs")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{result.policy}: GPU utilisation by queue")
    _legend(ax, len(queues), "upper right")
    return fig


def wait_cdf_figure(result: SimResult) -> Figure:
    """Fraction of each queue's jobs that waited at most x hours."""
    fig, ax = _figure(width=6)
    by_queue: dict[str, list[float]] = {}
    for rec in result.records:
        by_queue.setdefault(rec.trace.queue, []).append(rec.wait_s / 3600.0)
    for q in sorted(by_queue):
        _cdf(ax, sorted(by_queue[q]), label=q)
    _wait_axes(ax, f"{result.policy}: wait-time CDF per queue")
    return fig


def share_figure(result: SimResult) -> Figure:
    """Each queue's share of the GPUs in use against its weight (dashed)."""
    fig, ax = _figure(width=8)
    queues = sorted(result.timeline_gpu_s)
    hours = _bin_hours(result)
    totals = _total(result.timeline_gpu_s.values(), len(hours))
    weight_total = sum(result.weights.get(q, 0.0) for q in queues) or 1.0
    for q in queues:
        shares = [
            v / t if t else float("nan")
            for v, t in zip(result.timeline_gpu_s[q], totals, strict=True)
        ]
        line = ax.plot(hours, shares, label=f"{q} share")[0]
        weight = result.weights.get(q, 0.0) / weight_total
        ax.axhline(weight, color=line.get_color(), ls="--", lw=0.8)
    ax.set_xlabel("hours")
    ax.set_ylabel("share of used GPUs (dashed: weight)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{result.policy}: share vs weight over time")
    _legend(ax, len(queues), "upper right")
    return fig


def preemptions_figure(result: SimResult) -> Figure:
    """Preemptions per time bin, stacked by the victims' queue."""
    fig, ax = _figure(width=8)
    queues = sorted(result.timeline_preemptions)
    hours = _bin_hours(result)
    if hours and queues:
        series = [[float(n) for n in result.timeline_preemptions[q]] for q in queues]
        ax.stackplot(hours, series, labels=queues, step="post")
        _legend(ax, len(queues), "upper right")
    else:
        ax.text(0.5, 0.5, "no preemptions", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("hours")
    ax.set_ylabel(f"preemptions per {_bin_width_s(result) / 60:.0f} min")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{result.policy}: preemptions by queue over time")
    return fig


class RunChart(NamedTuple):
    """A chart of one run and the sentence that introduces it in the report."""

    draw: Callable[[SimResult], Figure]
    caption: str


class ComparisonChart(NamedTuple):
    """A chart across runs and the sentence that introduces it in the report."""

    draw: Callable[[Sequence[Timeline]], Figure]
    caption: str


RUN_CHARTS = {
    "utilization": RunChart(utilization_figure, "Share of the cluster's GPUs held, by queue."),
    "wait-cdf": RunChart(wait_cdf_figure, "Fraction of each queue's jobs that waited at most x."),
    "share": RunChart(share_figure, "Each queue's share of the GPUs in use against its weight."),
    "preemptions": RunChart(preemptions_figure, "Preemptions over time, by the victims' queue."),
}
"""Every chart of one run, by the suffix of its file name."""

PLOT_DIR_CHARTS = ("utilization", "wait-cdf", "share")
"""The charts `--plot DIR` writes for each policy."""


# --- charts across runs -----------------------------------------------------------------------


def compare_waits_figure(timelines: Sequence[Timeline]) -> Figure:
    """Wait-time CDF of all jobs, one line per policy."""
    fig, ax = _figure(width=8)
    for t in timelines:
        _cdf(ax, t.waits_h, label=t.policy)
    _wait_axes(ax, "wait-time CDF of all jobs, by policy")
    return fig


def compare_goodput_figure(timelines: Sequence[Timeline]) -> Figure:
    """Utilisation (top) and goodput (bottom) over time, one line per policy."""
    fig = _figure_class()(figsize=(8, 5.4), dpi=DPI)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for t in timelines:
        top.plot(t.hours, t.utilization, label=t.policy, lw=0.9, drawstyle="steps-post")
        bottom.plot(t.hours, t.goodput, label=t.policy, lw=0.9, drawstyle="steps-post")
    top.set_ylabel("utilisation")
    bottom.set_ylabel("goodput")
    for ax in (top, bottom):
        ax.set_ylim(0, 1.05)
    bottom.set_xlabel("hours")
    top.set_title("utilisation and goodput over time, by policy")
    _legend(bottom, len(timelines), "lower right")
    return fig


def compare_preemptions_figure(timelines: Sequence[Timeline]) -> Figure:
    """Preemptions so far against time, one line per policy."""
    fig, ax = _figure(width=8)
    for t in timelines:
        ax.plot(t.hours, list(accumulate(t.preemptions)), label=t.policy, drawstyle="steps-post")
    ax.set_xlabel("hours")
    ax.set_ylabel("preemptions so far")
    ax.set_ylim(bottom=0)
    ax.set_title("cumulative preemptions, by policy")
    _legend(ax, len(timelines), "upper left")
    return fig


COMPARISON_CHARTS = {
    "waits": ComparisonChart(compare_waits_figure, "Fraction of all jobs that waited at most x."),
    "goodput": ComparisonChart(
        compare_goodput_figure,
        "Utilisation and goodput over time (the gap is work lost to preemptions, and to "
        "crashes and hangs where the run models them).",
    ),
    "preemptions": ComparisonChart(compare_preemptions_figure, "Preemptions so far, over time."),
}
"""Every cross-policy chart, by a short name."""


# --- output -----------------------------------------------------------------------------------


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG, without the creation-software stamp (same input, same bytes)."""
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def write_plots(result: SimResult, out_dir: str | Path) -> list[Path]:
    """Write the `--plot` charts of one policy run as `POLICY-CHART.png`; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for chart in PLOT_DIR_CHARTS:
        path = out / f"{result.policy}-{chart}.png"
        path.write_bytes(png_bytes(RUN_CHARTS[chart].draw(result)))
        paths.append(path)
    return paths


# --- helpers ----------------------------------------------------------------------------------


def _figure(*, width: float) -> tuple[Figure, Axes]:
    fig = _figure_class()(figsize=(width, 3.6), dpi=DPI)
    return fig, fig.subplots()


def _figure_class() -> type[Figure]:
    """matplotlib's `Figure`, imported on the first chart; the sim extra installs it."""
    require("sim", "the simulator's charts")
    from matplotlib.figure import Figure

    return Figure


def _bin_width_s(result: SimResult) -> float:
    edges = result.timeline_edges
    return (edges[1] - edges[0]) if len(edges) > 1 else 1.0


def _bin_hours(result: SimResult) -> list[float]:
    edges = result.timeline_edges
    return [(e - edges[0]) / 3600.0 for e in edges[:-1]]


def _total(series: Iterable[Sequence[float]], bins: int) -> list[float]:
    """Bin-by-bin sum of per-queue series (all zeros for none)."""
    totals = [0.0] * bins
    for row in series:
        for i, value in enumerate(row):
            totals[i] += value
    return totals


def _cdf(ax: Axes, sorted_values: Sequence[float], *, label: str) -> None:
    n = len(sorted_values)
    if n:
        ax.step(sorted_values, [(i + 1) / n for i in range(n)], where="post", label=label)


def _wait_axes(ax: Axes, title: str) -> None:
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("wait (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    if ax.get_lines():
        ax.legend(loc="lower right", fontsize=7)


def _legend(ax: Axes, entries: int, loc: _Corner) -> None:
    ax.legend(loc=loc, fontsize=7, ncol=min(entries, 4) or 1)
