"""Helpers shared by the CLI modules: the one way out to the terminal, one-line errors and
readable sizes.

Job names, commands, reasons, queue names, paths, checkpoint keys and values, error messages:
whatever the CLI prints may come from someone else, and a terminal obeys the control
characters in what it is sent (``ESC [2J`` clears the screen, ``ESC ]0;...BEL`` retitles the
window, ``ESC ]8;;URL`` makes a link), and rich obeys the markup in a string (``[link=URL]``,
``:emoji:``). So the CLI modules write only through this module, and everything a human reads
passes `printable` on its way:

- `echo` prints one line of text, escaped;
- `echo_json` prints JSON, ASCII only (`json.dumps` escapes every control character itself);
- `echo_raw` prints data the user asked for as it is (`queue logs --raw`, the files of
  `queue export`): nothing else;
- `console` makes a rich console that shows every string it prints escaped and reads no markup
  or emoji in it, and `table` a rich table whose string cells and title are shown the same way.
  A `rich.text.Text` passes as it is: build one from fixed words, or with `text`.

A house rule (`tests/unit/test_house_rules.py`) checks that no other CLI module prints by
itself.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, NoReturn

import typer
import typer.core
from rich.console import Console
from rich.table import Table
from rich.text import Text

from preemptible._extras import require
from preemptible.errors import BackendNotInstalledError

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
# C0 controls, DEL and C1 controls (category Cc); the bidirectional formatting characters,
# which reorder what a line shows; the line and paragraph separators; lone surrogates (a file
# name that is not UTF-8), which cannot be written at all.
_UNSAFE = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff"
_CONTROL = re.compile(f"[{_UNSAFE}]")
_CONTROL_BUT_LINES = re.compile(f"(?![\n\t])[{_UNSAFE}]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(value: object, *, lines: bool = False) -> str:
    """`str(value)` with every terminal control character written out as an escape.

    ESC becomes ``\\x1b``, BEL ``\\x07``, CSI ``\\x9b``, a newline ``\\n``, a tab ``\\t``, a
    right-to-left override ``\\u202e``. Text without them comes back unchanged (a backslash
    stays one backslash). With ``lines=True``, newlines and tabs are kept: for many lines of
    output, such as a job's log.
    """
    return (_CONTROL_BUT_LINES if lines else _CONTROL).sub(_escape, str(value))


def text(value: object, style: str = "") -> Text:
    """`value` as a rich `Text`, escaped: never read as markup."""
    return Text(printable(value), style=style)


def echo(message: str, *, err: bool = False, nl: bool = True) -> None:
    """Print one line (on stderr with ``err``), its control characters escaped."""
    typer.echo(printable(message), err=err, nl=nl)


def echo_json(data: Any, *, indent: int | None = None) -> None:
    """Print `data` as JSON; `json.dumps` writes ASCII alone, every control character escaped."""
    typer.echo(json.dumps(data, indent=indent, ensure_ascii=True))


def echo_raw(data: str) -> None:
    """Write `data` to stdout as it is: only what the user asked for verbatim."""
    sys.stdout.write(data)
    sys.stdout.flush()


class EscapingConsole(Console):
    """A rich console that prints a string escaped, as text: no markup, no emoji."""

    def print(self, *objects: Any, **options: Any) -> None:
        super().print(*(text(o) if isinstance(o, str) else o for o in objects), **options)


class EscapingTable(Table):
    """A rich table whose string cells, title and caption are shown escaped, as text."""

    def __init__(self, *headers: Any, **options: Any) -> None:
        for key in ("title", "caption"):
            if isinstance(options.get(key), str):
                options[key] = text(options[key])
        super().__init__(*headers, **options)

    def add_row(self, *renderables: Any, **options: Any) -> None:
        super().add_row(*(text(r) if isinstance(r, str) else r for r in renderables), **options)


def console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console for the CLI's output (see `EscapingConsole`)."""
    return EscapingConsole(stderr=stderr, width=width, markup=False, emoji=False, highlight=False)


def table(**options: Any) -> Table:
    """A rich table for the CLI's output (see `EscapingTable`)."""
    return EscapingTable(**options)


_err = console(stderr=True)


def fail(error: Exception | str, code: int = 2) -> NoReturn:
    """Print ``error: ...`` on stderr, one line however long (no traceback), and exit with
    ``code``."""
    _err.print(Text.assemble(("error:", "red"), " ", text(error)), soft_wrap=True)
    raise typer.Exit(code)


def require_extra(extra: str, command: str, *, modules: tuple[str, ...] | None = None) -> None:
    """Return if the packages of `extra` (its `modules` alone, if given) are installed;
    otherwise print the one line that says which extra `preemptible COMMAND` needs and its
    `pip install` line, and exit 2."""
    try:
        require(extra, f"preemptible {command}", modules=modules)
    except BackendNotInstalledError as error:
        fail(error)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def repeated_options(command: Any, args: list[str]) -> str | None:
    """Why `args` name one of `command`'s single-valued options twice (click keeps the last
    without a word: `--policy fifo --policy all` would run all); None when none is."""
    single: dict[str, Any] = {}
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        if param.multiple or getattr(param, "count", False):
            continue
        for name in (*param.opts, *param.secondary_opts):
            single[name] = param
    seen: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-"):
            break  # the command's arguments, or a subcommand with options of its own
        name, has_value, value = arg.partition("=")
        param = single.get(name)
        if param is not None:
            if not has_value and not param.is_flag:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            seen.setdefault(param.opts[0], []).append(value if value else name)
        i += 1
    for option, values in seen.items():
        if len(values) > 1:
            return f"{option} given {len(values)} times ({', '.join(values)}): give it once"
    return None


def _refuse_repeats(command: Any, args: list[str]) -> None:
    problem = repeated_options(command, args)
    if problem is not None:
        echo(f"error: {problem}", err=True)
        raise typer.Exit(2)


_METAVARS = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "Path": "PATH", "list[str]": "TEXT"}


def _no_type(ctx: Any) -> None:
    return None


def plain_metavars(params: list[Any]) -> None:
    """Help without type markers: a flag shows none (Typer writes `<bool>`), a value its kind
    as click always did (`--gpus INTEGER`, not `<int>`), an argument its name."""
    for param in params:
        if param.metavar is not None:
            continue
        if param.param_type_name == "argument":
            param.metavar = param.name.upper()
            param.display_type_rich = _no_type  # its name says it; the type would be `<str>`
        elif getattr(param, "is_flag", False):
            param.metavar = ""
        else:
            param.metavar = _METAVARS.get(param.bare_type(), "VALUE")


class _Plain:
    """What every command of ours does besides Typer's: single-valued options given once
    (`repeated_options`), help without type markers (`plain_metavars`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]  # --help too
        plain_metavars(params)
        return params

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _refuse_repeats(self, args)
        parsed: list[str] = super().parse_args(ctx, args)  # type: ignore[misc]
        return parsed


class OnceGroup(_Plain, typer.core.TyperGroup):
    """A command group of ours (`_Plain`)."""


class OnceCommand(_Plain, typer.core.TyperCommand):
    """A command of ours (`_Plain`)."""
