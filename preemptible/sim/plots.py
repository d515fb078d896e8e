"""PNG charts of a simulation: utilisation per queue over time, wait-time CDF per queue, and
each queue's share of the used GPUs against its weight. matplotlib with the Agg backend (no
display needed), imported only when plots are asked for.
"""

from __future__ import annotations

from pathlib import Path

from preemptible.sim.engine import SimResult


def write_plots(result: SimResult, out_dir: str | Path) -> list[Path]:
    """Write the three charts for one policy run; returns the file paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = result.policy
    edges = result.timeline_edges
    hours = [(e - edges[0]) / 3600.0 for e in edges[:-1]] if edges else []
    width = (edges[1] - edges[0]) if len(edges) > 1 else 1.0
    queues = sorted(result.timeline_gpu_s)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=90)
    series = [[v / (width * result.gpus) for v in result.timeline_gpu_s[q]] for q in queues]
    if hours and series:
        ax.stackplot(hours, series, labels=queues, step="post")
    ax.set_xlabel("hours")
    ax.set_ylabel("share of cluster GPUs")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{name}: GPU utilisation by queue")
    ax.legend(loc="upper right", fontsize=7, ncol=min(len(queues), 4) or 1)
    paths.append(_save(fig, out / f"{name}-utilization.png"))

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
    by_queue: dict[str, list[float]] = {}
    for rec in result.records:
        by_queue.setdefault(rec.trace.queue, []).append(rec.wait_s / 3600.0)
    for q in sorted(by_queue):
        waits = sorted(by_queue[q])
        n = len(waits)
        ax.step(waits, [(i + 1) / n for i in range(n)], where="post", label=q)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("wait (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"{name}: wait-time CDF per queue")
    ax.legend(loc="lower right", fontsize=7)
    paths.append(_save(fig, out / f"{name}-wait-cdf.png"))

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=90)
    totals = [sum(result.timeline_gpu_s[q][i] for q in queues) for i in range(len(hours))]
    weight_total = sum(result.weights.get(q, 0.0) for q in queues) or 1.0
    for q in queues:
        shares = [
            v / t if t else float("nan")
            for v, t in zip(result.timeline_gpu_s[q], totals, strict=True)
        ]
        line = ax.plot(hours, shares, label=f"{q} share")[0]
        ax.axhline(
            result.weights.get(q, 0.0) / weight_total, color=line.get_color(), ls="--", lw=0.8
        )
    ax.set_xlabel("hours")
    ax.set_ylabel("share of used GPUs (dashed: weight)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{name}: share vs weight over time")
    ax.legend(loc="upper right", fontsize=7, ncol=min(len(queues), 4) or 1)
    paths.append(_save(fig, out / f"{name}-share.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
