"""`preemptible ckpt`: list, verify and inspect checkpoints."""

from __future__ import annotations

import typer

app = typer.Typer(help="List, verify and inspect checkpoints.", no_args_is_help=True)
