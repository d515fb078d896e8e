"""The one `preemptible` command. Each family of subcommands lives in its own module."""

from __future__ import annotations

from typing import Annotated

import typer

from preemptible.cli._common import OnceCommand, OnceGroup, echo
from preemptible.cli.ckpt import app as ckpt_app
from preemptible.cli.launch import LAUNCH_CONTEXT, launch_command
from preemptible.cli.queue import app as queue_app
from preemptible.cli.sidecar import sidecar_command
from preemptible.cli.sim import app as sim_app

app = typer.Typer(
    name="preemptible",
    help="Checkpoint-and-preemption layer for PyTorch training on shared GPUs.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion: bash, zsh, fish
    pretty_exceptions_enable=False,
    cls=OnceGroup,
)
app.add_typer(ckpt_app, name="ckpt")
app.add_typer(sim_app, name="sim")
app.add_typer(queue_app, name="queue")
app.command("launch", context_settings=LAUNCH_CONTEXT, cls=OnceCommand)(launch_command)
app.command("sidecar", cls=OnceCommand)(sidecar_command)


def _print_version(asked: bool) -> None:
    if asked:
        from preemptible import __version__

        echo(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the installed version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Checkpoint-and-preemption layer for PyTorch training on shared GPUs."""


@app.command(cls=OnceCommand)
def version() -> None:
    """Print the installed version."""
    from preemptible import __version__

    echo(__version__)


def main() -> None:
    app()
