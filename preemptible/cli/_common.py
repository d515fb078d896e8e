"""Helpers shared by the CLI modules: one-line errors and readable sizes."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

_err = Console(stderr=True)


def fail(error: Exception | str, code: int = 2) -> NoReturn:
    """Print ``error: ...`` on stderr (no traceback) and exit with ``code``."""
    _err.print(f"[red]error:[/] {error}", highlight=False, markup=True)
    raise typer.Exit(code)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
