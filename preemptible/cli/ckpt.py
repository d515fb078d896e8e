"""`preemptible ckpt`: list, verify and inspect checkpoints as tables (or JSON for scripts)."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from preemptible.cli._common import (
    OnceCommand,
    OnceGroup,
    console,
    echo_json,
    fail,
    human_bytes,
    table,
    text,
)
from preemptible.errors import ConfigError, PreemptibleError

if TYPE_CHECKING:
    from preemptible.checkpoint import CheckpointReader

app = typer.Typer(
    help="List, verify and inspect checkpoints under a root (a local path or any fsspec URL).",
    no_args_is_help=True,
    cls=OnceGroup,
)
out = console()
err = console(stderr=True)

RootArg = Annotated[str, typer.Argument(help="Checkpoint root: a local path or fsspec URL.")]
StepOpt = Annotated[int | None, typer.Option("--step", help="One step (default: see command).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]
OptionOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--option",
        "-o",
        help="fsspec storage option KEY=VALUE (VALUE parsed as JSON when it can be); repeatable.",
    ),
]
EndpointOpt = Annotated[
    str | None,
    typer.Option("--endpoint-url", help="S3-compatible endpoint, e.g. http://127.0.0.1:9000."),
]


def _reader(root: str, options: list[str] | None, endpoint_url: str | None) -> CheckpointReader:
    """A reader: these commands never write, so they never delete or collect anything."""
    from preemptible.checkpoint import CheckpointReader

    storage_options: dict[str, Any] = {}
    for item in options or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option expects KEY=VALUE, got {item!r}")
        try:
            storage_options[key] = json.loads(raw)
        except json.JSONDecodeError:
            storage_options[key] = raw
    if endpoint_url:
        storage_options.setdefault("client_kwargs", {})["endpoint_url"] = endpoint_url
    return CheckpointReader(root, storage_options=storage_options)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


@app.command("list", cls=OnceCommand)
def list_(
    root: RootArg,
    all_: Annotated[bool, typer.Option("--all", help="Also show what is ignored and why.")] = False,
    as_json: JsonOpt = False,
    option: OptionOpt = None,
    endpoint_url: EndpointOpt = None,
) -> None:
    """List committed checkpoints, oldest first."""
    try:
        committed, ignored = _reader(root, option, endpoint_url).scan()
    except PreemptibleError as e:
        fail(e)
    if as_json:
        payload: dict[str, Any] = {"root": root, "checkpoints": [_info_json(i) for i in committed]}
        if all_:
            payload["ignored"] = [{"name": i.name, "reason": i.reason} for i in ignored]
        echo_json(payload, indent=1)
        return
    found = table(title=f"checkpoints under {root}", title_justify="left")
    for col in ("step", "created", "size", "files", "save s", "world", "writer"):
        found.add_column(
            col, justify="right" if col in ("step", "size", "files", "save s", "world") else "left"
        )
    for i in committed:
        found.add_row(
            str(i.step),
            _when(i.created_at),
            human_bytes(i.bytes),
            str(i.files),
            f"{i.save_seconds:.2f}",
            str(i.world_size),
            i.writer,
        )
    out.print(found if committed else f"no committed checkpoint under {root}")
    if ignored and all_:
        extra = table(title="ignored (garbage-collected once stale)", title_justify="left")
        extra.add_column("name")
        extra.add_column("reason")
        for entry in ignored:
            extra.add_row(entry.name, entry.reason)
        out.print(extra)
    elif ignored:
        out.print(
            Text(f"{len(ignored)} incomplete or invalid entries ignored (--all shows them)", "dim")
        )


def _info_json(i: Any) -> dict[str, Any]:
    return {
        "step": i.step,
        "url": i.url,
        "created_at": i.created_at,
        "bytes": i.bytes,
        "files": i.files,
        "save_seconds": i.save_seconds,
        "world_size": i.world_size,
        "writer": i.writer,
        "metadata": i.metadata,
    }


@app.command(cls=OnceCommand)
def verify(
    root: RootArg,
    step: StepOpt = None,
    as_json: JsonOpt = False,
    option: OptionOpt = None,
    endpoint_url: EndpointOpt = None,
) -> None:
    """Check sizes and CRC32C checksums of every file (all checkpoints, or --step N).

    Exits 1 if any checkpoint is damaged, 2 on usage or storage errors.
    """
    try:
        ckpt = _reader(root, option, endpoint_url)
        committed = ckpt.list()
        steps = [step] if step is not None else [i.step for i in committed]
        if not steps:
            fail(f"no committed checkpoint under {root}")
        total = sum(i.bytes for i in committed if i.step in steps)
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
            disable=as_json,
        ) as progress:
            task = progress.add_task("verifying", total=total or None)
            reports = []
            for s in steps:
                progress.update(task, description=f"verifying step {s}")
                reports.append(ckpt.verify(s, on_bytes=lambda n: progress.advance(task, n)))
    except PreemptibleError as e:
        fail(e)
    bad = [r for r in reports if not r.ok]
    if as_json:
        payload = [
            {
                "step": r.step,
                "url": r.url,
                "ok": r.ok,
                "problems": r.problems,
                "bytes": r.bytes_checked,
            }
            for r in reports
        ]
        echo_json({"root": root, "ok": not bad, "checkpoints": payload}, indent=1)
    else:
        checked = table(title=f"verification of {root}", title_justify="left")
        checked.add_column("step", justify="right")
        checked.add_column("result")
        checked.add_column("files", justify="right")
        checked.add_column("checked", justify="right")
        for r in reports:
            problems = Text("\n").join(text(p, "red") for p in r.problems)
            verdict = Text("ok", "green") if r.ok else problems
            checked.add_row(
                str(r.step), verdict, str(r.files_checked), human_bytes(r.bytes_checked)
            )
        out.print(checked)
        if bad:
            out.print(
                Text.assemble(
                    (f"{len(bad)} damaged checkpoint(s)", "red"),
                    ": restore() skips them and falls back to the newest valid one (and refuses "
                    "to start over when none is valid); delete them or restore from a copy",
                )
            )
    raise typer.Exit(1 if bad else 0)


@app.command(cls=OnceCommand)
def inspect(
    root: RootArg,
    step: Annotated[int | None, typer.Option("--step", help="Step (default: newest).")] = None,
    as_json: JsonOpt = False,
    option: OptionOpt = None,
    endpoint_url: EndpointOpt = None,
) -> None:
    """Show the keys, dtypes, shapes and sizes saved in a checkpoint (default: the newest)."""
    try:
        info, items = _reader(root, option, endpoint_url).inspect(step)
    except PreemptibleError as e:
        fail(e)
    if as_json:
        echo_json({"checkpoint": _info_json(info), "keys": [x.to_json() for x in items]}, indent=1)
        return
    keys = table(title=f"step {info.step} at {info.url}", title_justify="left")
    for col in ("key", "kind", "dtype", "shape", "bytes / value"):
        keys.add_column(col, justify="right" if col == "bytes / value" else "left")
    for x in items:
        shape = "×".join(map(str, x.shape)) if x.shape else ("scalar" if x.dtype else "")
        keys.add_row(x.key, x.kind, x.dtype, shape, human_bytes(x.nbytes) if x.dtype else x.value)
    out.print(keys)
    out.print(f"{len(items)} values, {human_bytes(sum(x.nbytes for x in items))} of array data")
