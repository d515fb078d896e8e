"""`preemptible launch -- CMD ...`: relay preemption notices to a command as SIGTERM.

    preemptible launch [--translate-usr2] [--kill-after SECONDS] -- CMD [ARGS...]

Exits with the command's exit status (``128 + signum`` if a signal ended it); a command that
cannot be started gives status 127, like a shell.
"""

from __future__ import annotations

import signal
from typing import Annotated

import typer

from preemptible.cli._common import fail
from preemptible.errors import PreemptibleError

LAUNCH_CONTEXT = {"allow_interspersed_args": False, "ignore_unknown_options": True}
"""Everything after the command's name belongs to the command, dashes included."""

CommandArg = Annotated[
    list[str], typer.Argument(help="The command to run, after `--`.", show_default=False)
]
TranslateUsr2Opt = Annotated[
    bool,
    typer.Option("--translate-usr2", help="Also turn SIGUSR2 into SIGTERM for the command."),
]
KillAfterOpt = Annotated[
    float | None,
    typer.Option(
        "--kill-after",
        metavar="SECONDS",
        help="SIGKILL the command's process group this long after the first notice.",
        min=0,
    ),
]


def launch_command(
    command: CommandArg,
    translate_usr2: TranslateUsr2Opt = False,
    kill_after: KillAfterOpt = None,
) -> None:
    """Run CMD in its own process group; pass SIGTERM/SIGINT/SIGHUP on, turn SIGUSR1 into SIGTERM.

    Why: SLURM's `sbatch --signal=B:USR1@120` warns the batch shell with SIGUSR1, but torchrun dies of SIGUSR1 without telling its workers (they run on as orphans and never save), while it does forward SIGTERM. In a batch script, write:

        exec preemptible launch -- torchrun --nproc-per-node=8 train.py

    and the workers get SIGTERM, save at their next step boundary and exit. The exit status is CMD's (128 + signum if a signal ended it), so SLURM's RequeueExit keeps working.
    """  # noqa: E501 (typer keeps line breaks in help: one paragraph per line)
    from preemptible.runtime.launch import DEFAULT_TRANSLATED, launch

    translate = (*DEFAULT_TRANSLATED, signal.SIGUSR2) if translate_usr2 else DEFAULT_TRANSLATED
    try:
        code = launch(command, translate=translate, kill_after=kill_after)
    except FileNotFoundError as error:
        fail(f"cannot run {command[0]!r}: {error.strerror}", code=127)
    except PermissionError as error:
        fail(f"cannot run {command[0]!r}: {error.strerror}", code=126)
    except PreemptibleError as error:
        fail(error)
    raise typer.Exit(code)
