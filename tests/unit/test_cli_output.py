"""The CLI's one way out to the terminal (`preemptible/cli/_common.py`): control characters
are shown escaped, markup is shown as written, JSON is left to `json.dumps`."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from preemptible.cli._common import (
    EscapingConsole,
    EscapingTable,
    echo,
    echo_json,
    fail,
    printable,
)

HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b6n[link=https://e.x]x[/link]:warning:"
SHOWN = r"\x1b[2J\x1b]0;pwned\x07\x9b6n[link=https://e.x]x[/link]:warning:"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J\x1b[H", r"\x1b[2J\x1b[H"),
        ("\x1b]0;pwned\x07", r"\x1b]0;pwned\x07"),
        ("\x9b31m", r"\x9b31m"),  # the 8-bit CSI, a C1 control
        ("\x00\x08\x7f\x85", r"\x00\x08\x7f\x85"),
        ("a\nb\tc\rd", r"a\nb\tc\rd"),
        ("\u202egnp.exe", r"\u202egnp.exe"),  # right-to-left override
        ("\u2028", r"\u2028"),
        ("name-\udcff", r"name-\udcff"),  # a file name that is not UTF-8
        ("exp-1 ✓ 日本 émigré [red]x[/] C:\\x1b", "exp-1 ✓ 日本 émigré [red]x[/] C:\\x1b"),
        ("", ""),
    ],
    ids=["csi", "osc", "c1", "c0-del", "whitespace", "bidi", "line-sep", "surrogate", "plain",
         "empty"],
)  # fmt: skip
def test_printable_writes_control_characters_out(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_printable_keeps_lines_and_tabs_when_asked() -> None:
    assert printable("a\tb\n\x1b[31mc\r\n", lines=True) == "a\tb\n\\x1b[31mc\\r\n"
    assert printable(42) == "42"


def test_the_console_prints_strings_escaped_and_reads_no_markup_even_on_a_terminal() -> None:
    console = EscapingConsole(force_terminal=True, width=200)  # markup and emoji left on
    with console.capture() as captured:
        console.print(HOSTILE)
    assert captured.get() == SHOWN + "\n"


def test_the_table_shows_cells_and_title_escaped() -> None:
    console = EscapingConsole(force_terminal=True, width=200)
    table = EscapingTable(title=HOSTILE, box=None)
    table.add_column("name")
    table.add_row(HOSTILE)
    with console.capture() as captured:
        console.print(table)
    out = captured.get()
    assert out.count(SHOWN) == 2
    assert "\x1b]" not in out and "\x9b" not in out and "⚠" not in out


def test_echo_escapes_and_echo_json_is_json_dumps(capsys: pytest.CaptureFixture[str]) -> None:
    echo(HOSTILE)
    data = {"name": HOSTILE, "text": "a\nb", "ok": True}
    echo_json(data, indent=2)
    out = capsys.readouterr().out
    line, rest = out.split("\n", 1)
    assert line == SHOWN
    assert rest == json.dumps(data, indent=2) + "\n" and json.loads(rest) == data
    assert out.isascii() and "\x1b" not in out and "\x07" not in out


def test_an_error_is_one_escaped_line() -> None:
    app = typer.Typer()

    @app.command()
    def main() -> None:
        fail(f"cannot read {HOSTILE}")

    result = CliRunner().invoke(app, [])
    assert result.exit_code == 2
    assert result.stderr == f"error: cannot read {SHOWN}\n"
