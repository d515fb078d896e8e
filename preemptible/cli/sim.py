"""`preemptible sim`: replay a trace through the scheduling core, side by side per policy.

    preemptible sim --trace FILE --config queue.toml [--policy NAME|all] [--json FILE] [--plot DIR]
        [--html FILE] [--crash-rate R] [--hang-rate R] [--failure-seed S]
        [--node-topology ISLANDSxGPUS] [--placement topology|lowest] [--split-slowdown F]
    preemptible sim import SOURCE.csv OUT.csv [--config-out queue.toml]
    preemptible sim synth OUT.csv --jobs N --gpus G [--config-out queue.toml]

Bad input (a missing column, an invalid config value) prints one line and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from preemptible.cli._common import OnceCommand, OnceGroup, console, echo, require_extra, table
from preemptible.errors import PreemptibleError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.table import Table

    from preemptible.queue.core import QueueConfig
    from preemptible.sim.failures import FailureRates
    from preemptible.sim.gpu_ids import NodeTopology
    from preemptible.sim.kpis import Column

app = typer.Typer(
    help="Replay a job trace through the scheduling policies in virtual time.",
    invoke_without_command=True,
    no_args_is_help=False,
    cls=OnceGroup,  # `--policy fifo --policy all` is refused, not run as all
)


def _fail(message: str) -> NoReturn:
    echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.callback()
def sim(
    ctx: typer.Context,
    trace: Annotated[Path | None, typer.Option(help="Canonical trace CSV.")] = None,
    config: Annotated[Path | None, typer.Option(help="Queue configuration (TOML).")] = None,
    policy: Annotated[
        str, typer.Option(help="fifo, priority, kueue, slurm, preemptible, or all.")
    ] = "all",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the metrics as JSON here.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write PNG charts into this folder.")] = None,
    html: Annotated[
        Path | None,
        typer.Option(help="Write a self-contained HTML report (tables and charts) here."),
    ] = None,
    checkpointing: Annotated[
        str, typer.Option(help="aware: jobs save on notice (the SDK); periodic: they do not.")
    ] = "aware",
    checkpoint_interval: Annotated[
        str, typer.Option(help="Period of the jobs' regular checkpoints.")
    ] = "30m",
    checkpoint_cost: Annotated[
        str, typer.Option(help="Save/restore cost for jobs whose trace gives none.")
    ] = "60s",
    cycle_interval: Annotated[
        str, typer.Option(help="Least virtual time between two scheduling cycles.")
    ] = "10s",
    crash_rate: Annotated[
        float,
        typer.Option(
            help="Crashes per 1,000 GPU-hours of running (0: none). A crashed job loses its "
            "work since its last checkpoint and restarts from it, as the config's restarts "
            "table says."
        ),
    ] = 0.0,
    hang_rate: Annotated[
        float,
        typer.Option(
            help="Hangs per 1,000 GPU-hours of running (0: none). A hung job holds its GPUs "
            "doing nothing until the hang bound, then is killed and restarted as after a crash."
        ),
    ] = 0.0,
    failure_seed: Annotated[
        int, typer.Option(help="Seed of the crash and hang draws: same seed, same failures.")
    ] = 0,
    node_topology: Annotated[
        str | None,
        typer.Option(
            help="Each node's NVLink islands, ISLANDSxGPUS (2x4: two islands of 4 GPUs); must "
            "make the config's gpus_per_node. Jobs then get GPU ids within their nodes."
        ),
    ] = None,
    placement: Annotated[
        str | None,
        typer.Option(
            help="With --node-topology: topology (one island when one fits, as the queue "
            "manager places; the default) or lowest (the lowest free GPU ids)."
        ),
    ] = None,
    split_slowdown: Annotated[
        float,
        typer.Option(
            help="With --node-topology: a job whose GPUs on a node span islands runs 1+F "
            "times slower (0: as fast)."
        ),
    ] = 0.0,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
) -> None:
    """Replay TRACE under CONFIG with one policy or all, and report the four signals."""
    if ctx.invoked_subcommand is not None:
        return
    if trace is None or config is None:
        _fail("give --trace FILE and --config queue.toml (or a subcommand: import, synth)")
    if plot is not None or html is not None:
        require_extra("sim", "sim --plot" if html is None else "sim --html")
    try:
        report = run_sim(
            trace=trace,
            config=config,
            policy=policy,
            checkpointing=checkpointing,
            checkpoint_interval=checkpoint_interval,
            checkpoint_cost=checkpoint_cost,
            cycle_interval=cycle_interval,
            failures=_failure_rates(crash_rate, hang_rate, failure_seed),
            node_topology=_node_topology(node_topology, placement, split_slowdown),
            plot=plot,
            html=html,
            quiet=quiet,
        )
    except (PreemptibleError, OSError, ValueError) as exc:  # ValueError: a file not in UTF-8
        _fail(str(exc))
    _print_notes([f["note"] for f in report["quota_shortfalls"]])
    if html is not None:
        echo(f"wrote {html} ({html.stat().st_size / 1024:,.0f} KB)", err=True)
    if json_out is not None:
        try:
            json_out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            _fail(f"cannot write {json_out}: {exc}")
    _print_tables(report)


def run_sim(
    *,
    trace: Path,
    config: Path,
    policy: str,
    checkpointing: str = "aware",
    checkpoint_interval: str = "30m",
    checkpoint_cost: str = "60s",
    cycle_interval: str = "10s",
    failures: FailureRates | None = None,
    node_topology: NodeTopology | None = None,
    plot: Path | None = None,
    html: Path | None = None,
    quiet: bool = True,
) -> dict[str, Any]:
    """Run the simulation(s) and return the `--json` report object.

    With `failures` that model any, the report says what was drawn under `failures` and every
    policy's metrics say what the crashes and hangs cost (`preemptible.sim.kpis`). With a
    `node_topology` that has islands, the report says it under `node_topology` and every
    policy's metrics say how its jobs were placed over the islands.

    With `html`, also write the HTML report there; a path that cannot be written fails before
    any simulation runs.
    """
    from preemptible.errors import ConfigError
    from preemptible.queue.core import POLICIES, parse_config_text, parse_duration
    from preemptible.queue.quiet_gc import quieter_collections
    from preemptible.sim import SimOptions, Simulator, read_trace, summarize
    from preemptible.sim.failures import FailureRates
    from preemptible.sim.gpu_ids import NodeTopology
    from preemptible.sim.importers import quota_shortfalls

    names = list(POLICIES) if policy == "all" else [policy]
    for name in names:
        if name not in POLICIES:
            raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}, all")
    if checkpointing not in ("aware", "periodic"):
        raise ConfigError(f"--checkpointing must be aware or periodic, not {checkpointing!r}")
    page = None
    if html is not None:
        from preemptible.sim.html_report import HtmlReport

        page = HtmlReport(html)  # checks the path now, not after the simulation
    cfg = parse_config_text(_read(config), path=config)
    jobs = read_trace(trace)
    options = SimOptions(
        checkpoint_mode=checkpointing,
        checkpoint_interval_s=parse_duration(checkpoint_interval, key="--checkpoint-interval"),
        default_checkpoint_s=parse_duration(checkpoint_cost, key="--checkpoint-cost"),
        cycle_interval_s=parse_duration(cycle_interval, key="--cycle-interval"),
        failures=failures or FailureRates(),
        node_topology=node_topology or NodeTopology(),
    )
    report: dict[str, Any] = {
        "trace": str(trace),
        "config": str(config),
        "checkpointing": checkpointing,
        "checkpoint_interval_s": options.checkpoint_interval_s,
        "default_checkpoint_s": options.default_checkpoint_s,
        "cycle_interval_s": options.cycle_interval_s,
        "quota_shortfalls": [
            {**dataclasses.asdict(f), "note": f.describe()} for f in quota_shortfalls(jobs, cfg)
        ],
        "policies": {},
    }
    if options.failures.on:
        report["failures"] = failure_settings(options.failures, cfg)
    if options.node_topology.on:
        options.node_topology.check(cfg.cluster)  # before any simulation runs
        report["node_topology"] = topology_settings(options.node_topology)
    with quieter_collections(), _progress(quiet) as bar:  # the trace lives as long as the run
        for name in names:
            task = bar.add_task(name, total=len(jobs)) if bar else None

            def tick(done: int, total: int, task: Any = task) -> None:
                if bar is not None:
                    bar.update(task, completed=done)

            result = Simulator(jobs, cfg, POLICIES[name], options, progress=tick).run()
            report["policies"][name] = summarize(result)
            if plot is not None:
                from preemptible.sim.plots import write_plots

                write_plots(result, plot)
            if page is not None:
                page.add_run(result)
    if page is not None:
        page.write(report)
    return report


def _failure_rates(crash_rate: float, hang_rate: float, seed: int) -> FailureRates:
    """The rates of the command line, checked (a negative rate is refused)."""
    from preemptible.sim.failures import FailureRates

    try:
        return FailureRates(
            crashes_per_1000_gpu_h=crash_rate, hangs_per_1000_gpu_h=hang_rate, seed=seed
        )
    except PreemptibleError as exc:
        _fail(str(exc))


def _node_topology(shape: str | None, placement: str | None, slowdown: float) -> NodeTopology:
    """The islands and placement of the command line, checked."""
    from preemptible.sim.gpu_ids import NodeTopology

    try:
        return NodeTopology.parse(shape, placement, slowdown)
    except PreemptibleError as exc:
        _fail(str(exc))


def topology_settings(layout: NodeTopology) -> dict[str, Any]:
    """The report's `node_topology`: the islands, the placement and the split's cost."""
    return {
        "shape": layout.shape,
        "islands_per_node": layout.islands,
        "gpus_per_island": layout.gpus_per_island,
        "placement": layout.placement.value,
        "split_slowdown": layout.split_slowdown,
    }


def topology_words(settings: dict[str, Any]) -> str:
    """The islands of a run, in words (the `node_topology` of the report)."""
    words = (
        f"nodes of {settings['islands_per_node']} NVLink islands of "
        f"{settings['gpus_per_island']} GPUs, placement {settings['placement']}"
    )
    if settings["split_slowdown"]:
        words += f", a split job {1 + settings['split_slowdown']:g}x slower"
    return words


def failure_settings(rates: FailureRates, cfg: QueueConfig) -> dict[str, Any]:
    """The report's `failures`: the rates and seed, and the restart rules they met."""
    from preemptible.sim.failures import FailureModel

    rules = cfg.restarts
    return {
        "crashes_per_1000_gpu_h": rates.crashes_per_1000_gpu_h,
        "hangs_per_1000_gpu_h": rates.hangs_per_1000_gpu_h,
        "seed": rates.seed,
        "hang_bound_s": FailureModel(rates, rules).hang_bound_s,
        "max_restarts": {q.name: cfg.restart_limit(q.name) for q in cfg.queues},
        "backoff_s": rules.backoff_s,
        "backoff_max_s": rules.backoff_max_s,
        "crash_loop_after": rules.crash_loop_after,
    }


def _print_notes(notes: list[str], limit: int = 5) -> None:
    """Queues with jobs beyond their nominal quota, one line each (on stderr)."""
    for note in notes[:limit]:
        echo(f"note: {note}", err=True)
    if len(notes) > limit:
        echo(f"note: and {len(notes) - limit} more queue(s) like these", err=True)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise OSError(f"cannot read {path}: {exc.strerror or exc}") from exc


class _NoBar:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _progress(quiet: bool) -> Any:
    if quiet or not sys.stderr.isatty():
        return _NoBar()
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description:>12}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} jobs"),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
    )


def _print_tables(report: dict[str, Any]) -> None:
    from preemptible.sim.kpis import COMPARISON_COLUMNS, duration_unit, in_unit

    out = console()
    if not out.is_terminal:
        out = console(width=170)
    policies = report["policies"]
    first = next(iter(policies.values()))
    o = first["overall"]
    where = (
        f"{report['trace']}: {o['jobs']} jobs on {o['gpus']} GPUs, demand "
        f"{o['demand_ratio']:.2f}x supply, checkpointing {report['checkpointing']}"
    )
    if "failures" in report:
        where += ", " + failure_words(report["failures"])
    if "node_topology" in report:
        where += ", " + topology_words(report["node_topology"])
    if len(policies) > 1:
        out.print(where)
        out.print(_summary(policies))
    title = where if len(policies) == 1 else "every signal, per policy"
    out.print(_policy_table(title, COMPARISON_COLUMNS, policies))
    queues = list(first["queues"])
    waits = [
        m["queues"][q][key]
        for m in policies.values()
        for q in queues
        if q in m["queues"]
        for key in ("p95_wait_s", "max_wait_s")
    ]
    unit, per = duration_unit(waits)
    per_queue = table(title=f"p95 wait (max wait) per queue, {unit}")
    per_queue.add_column("queue")
    for name in policies:
        per_queue.add_column(name, justify="right")
    for q in queues:
        row = [q]
        for metrics in policies.values():
            m = metrics["queues"].get(q)
            if m is None:
                row.append("-")
                continue
            row.append(f"{in_unit(m['p95_wait_s'] / per)} ({in_unit(m['max_wait_s'] / per)})")
        per_queue.add_row(*row)
    out.print(per_queue)
    _print_lost_by_kind(out, policies)
    if "failures" in report:
        _print_failures(out, policies)
    if "node_topology" in report:
        _print_islands(out, policies, report["node_topology"])


SUMMARY = (
    ("goodput", "goodput", True),
    ("utilization", "utilisation", True),
    ("p95_wait_s", "p95 wait", False),
    ("max_wait_least_served_s", "max wait of the least served queue", False),
    ("lost_gpu_s", "work lost to preemption", False),
)
"""The signals the summary compares: (key, words, higher is better)."""
FAILURE_SUMMARY = ("failure_lost_gpu_s", "work lost to crashes and hangs", False)
"""The summary's last signal where the run models crashes and hangs."""


def _summary(policies: dict[str, Any]) -> Any:
    """The report's opening: on each main signal, the policy judged (`preemptible`, else the
    first) against the best of the others, and which one that is."""
    from preemptible.sim.kpis import COMPARISON_COLUMNS, Column, column_format

    judged = "preemptible" if "preemptible" in policies else next(iter(policies))
    columns = {c.key: c for c in COMPARISON_COLUMNS}
    signals: tuple[tuple[str, str, bool], ...] = SUMMARY
    if "failure_lost_gpu_s" in policies[judged]["overall"]:
        signals = (*SUMMARY, FAILURE_SUMMARY)
        columns[FAILURE_SUMMARY[0]] = Column(FAILURE_SUMMARY[0], "lost", "gpuh", False)
    summary = table(title=f"summary: {judged} against the best other policy")
    for heading in ("signal", judged, "best other", "which"):
        summary.add_column(heading, justify="left" if heading in ("signal", "which") else "right")
    for key, words, higher in signals:
        values = {name: m["overall"][key] for name, m in policies.items()}
        others = {n: v for n, v in values.items() if n != judged}
        best = (max if higher else min)(others, key=lambda n: others[n])
        label, fmt = column_format(columns[key], list(values.values()))
        unit = label[label.rfind("(") :] if label.endswith(")") else ""
        summary.add_row(f"{words} {unit}".strip(), fmt(values[judged]), fmt(others[best]), best)
    return summary


def failure_words(failures: dict[str, Any]) -> str:
    """The failure rates of a run, in words (the `failures` of the report)."""
    return (
        f"{failures['crashes_per_1000_gpu_h']:g} crashes and {failures['hangs_per_1000_gpu_h']:g} "
        f"hangs per 1,000 GPU-hours of running (seed {failures['seed']})"
    )


def _print_failures(out: Any, policies: dict[str, Any]) -> None:
    """What crashes and hangs cost each policy."""
    from preemptible.sim.kpis import FAILURE_COLUMNS

    title = "crashes and hangs, per policy (their loss counted apart from preemptions')"
    out.print(_policy_table(title, FAILURE_COLUMNS, policies))


def _print_islands(out: Any, policies: dict[str, Any], settings: dict[str, Any]) -> None:
    """How each policy's jobs were placed over the NVLink islands."""
    from preemptible.sim.kpis import ISLAND_COLUMNS

    title = f"GPU placement within nodes ({topology_words(settings)})"
    out.print(_policy_table(title, ISLAND_COLUMNS, policies))


def _policy_table(title: str, columns: Sequence[Column], policies: dict[str, Any]) -> Table:
    """A row per policy of its overall `columns`, each in the unit that suits its values."""
    from preemptible.sim.kpis import column_format

    out = table(title=title)
    out.add_column("policy")
    formats = []
    for column in columns:
        label, fmt = column_format(column, [m["overall"][column.key] for m in policies.values()])
        out.add_column(label, justify="right")
        formats.append((column.key, fmt))
    for name, metrics in policies.items():
        out.add_row(name, *(fmt(metrics["overall"][key]) for key, fmt in formats))
    return out


def _print_lost_by_kind(out: Any, policies: dict[str, Any]) -> None:
    """Lost GPU-hours per policy by the rule that sent the notice, when any policy preempted."""
    lost = {name: m["overall"]["lost_gpu_s_by_kind"] for name, m in policies.items()}
    if not any(any(v.values()) for v in lost.values()):
        return
    kinds = list(next(iter(lost.values())))
    by_rule = table(title="lost GPU-h by the rule that sent the notice (preemptions)")
    by_rule.add_column("policy")
    for kind in kinds:
        by_rule.add_column(kind, justify="right")
    for name, by_kind in lost.items():
        counts = policies[name]["overall"]["preemptions_by_kind"]
        by_rule.add_row(name, *(f"{by_kind[k] / 3600:,.1f} ({counts[k]:,})" for k in kinds))
    out.print(by_rule)


@app.command("import", cls=OnceCommand)
def import_cmd(
    source: Annotated[Path, typer.Argument(help="A public trace CSV (Philly, Chronus, ITP...).")],
    out: Annotated[Path, typer.Argument(help="Where to write the canonical trace CSV.")],
    config_out: Annotated[
        Path | None, typer.Option(help="Also write a matching queue configuration here.")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option(help="Cluster size (default: the offered load).")
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node (0: one flat pool).")] = 8,
    teams: Annotated[int, typer.Option(help="Synthetic queues for traces without groups.")] = 4,
) -> None:
    """Convert a public trace to the canonical CSV (and optionally write a config for it)."""
    from preemptible.queue.core import parse_config_text
    from preemptible.sim.importers import import_trace, quota_shortfalls, suggest_config
    from preemptible.sim.trace import write_trace

    notes: list[str] = []
    try:
        imported = import_trace(source, teams=teams)
        n = write_trace(out, imported.jobs)
        if config_out is not None:
            text = suggest_config(imported.jobs, gpus=gpus, gpus_per_node=gpus_per_node or None)
            config_out.write_text(text)
            notes = [f.describe() for f in quota_shortfalls(imported.jobs, parse_config_text(text))]
    except (PreemptibleError, OSError) as exc:
        _fail(str(exc))
    note = f" ({imported.note})" if imported.note else ""
    echo(f"{source} [{imported.layout}] -> {out}: {n} jobs{note}")
    _print_notes(notes)


@app.command("synth", cls=OnceCommand)
def synth_cmd(
    out: Annotated[Path, typer.Argument(help="Where to write the canonical trace CSV.")],
    jobs: Annotated[int, typer.Option(help="Number of jobs.")] = 5000,
    gpus: Annotated[int, typer.Option(help="Cluster GPUs (multiple of 8).")] = 64,
    load: Annotated[float, typer.Option(help="Offered load / capacity.")] = 1.1,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    config_out: Annotated[
        Path | None, typer.Option(help="Also write a matching queue configuration here.")
    ] = None,
) -> None:
    """Generate a bursty synthetic workload (LoRA, 8-GPU gang training, inference sweeps)."""
    from preemptible.sim.synth import generate, synth_config
    from preemptible.sim.trace import write_trace

    if gpus <= 0 or gpus % 8 or jobs <= 0 or load <= 0:
        _fail("--gpus must be a positive multiple of 8, --jobs and --load positive")
    try:
        n = write_trace(out, generate(jobs=jobs, gpus=gpus, load=load, seed=seed))
        if config_out is not None:
            config_out.write_text(synth_config(gpus))
    except OSError as exc:
        _fail(str(exc))
    echo(f"wrote {n} jobs to {out}")
