"""Every Python block of the README and the guides runs in a test or says what completes it,
and every ``preemptible`` command they show exists with the options it is shown with.

A block marked ``<!-- test: NAME -->`` is taken by a test with ``block(PAGE, "NAME")`` (the
README's two are run here; the framework pages' by their integration tests). One marked
``<!-- fragment: PATH -->`` is part of a program: PATH, a page or a file that is run, holds the
whole. A fragment must still be Python, import only names that exist, and its whole must use the
same names of ours.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import typer

import preemptible
from preemptible.cli import app
from tests.doc_blocks import ROOT, Block, block, blocks

GUIDES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs").glob("ways-in/*.md")),
    *sorted((ROOT / "docs").glob("user-guide/*.md")),
    *sorted((ROOT / "docs").glob("evaluation/*.md")),
    *sorted((ROOT / "docs").glob("maintainers/*.md")),
]
TESTS_TEXT = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))


def _python_blocks() -> list[Block]:
    return [b for page in GUIDES for b in blocks(page) if b.lang == "python"]


def _where(b: Block) -> str:
    return f"{b.page.relative_to(ROOT)}:{b.line}"


def _our_names(code: str) -> set[str]:
    """The public names of ``preemptible`` a block uses."""
    tree = ast.parse(code)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("preemptible"):
            used.update(alias.name for alias in node.names)
    return used & set(preemptible.__all__)


def test_every_python_block_is_tested_or_a_fragment_of_a_whole() -> None:
    problems = []
    for b in _python_blocks():
        if b.kind is None:
            problems.append(f"{_where(b)}: neither <!-- test: NAME --> nor <!-- fragment: PATH -->")
        elif b.kind == "test" and not re.search(rf'\bblock\([^)]*"{b.target}"\)', TESTS_TEXT):
            problems.append(f"{_where(b)}: no test takes the block {b.target!r}")
        elif b.kind == "fragment":
            whole = ROOT / str(b.target)
            if not whole.is_file():
                problems.append(f"{_where(b)}: its whole, {b.target}, does not exist")
                continue
            try:
                missing = _our_names(b.code) - set(re.findall(r"\w+", whole.read_text()))
            except SyntaxError as e:
                problems.append(f"{_where(b)}: not Python: {e}")
                continue
            if missing:
                problems.append(f"{_where(b)}: {b.target} never uses {sorted(missing)}")
    assert not problems, "\n".join(problems)


def test_the_imports_of_every_block_exist() -> None:
    problems = []
    for b in _python_blocks():
        for node in ast.walk(ast.parse(b.code)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("preemptible"):
                module = importlib.import_module(str(node.module))
                problems += [
                    f"{_where(b)}: {node.module} has no {alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                ]
    assert not problems, "\n".join(problems)


# --- the commands -------------------------------------------------------------------------------


def _commands() -> list[tuple[str, list[str]]]:
    """Every ``preemptible ...`` command line of the guides' shell blocks, as words."""
    found = []
    for page in GUIDES:
        for b in blocks(page):
            if b.lang not in ("bash", "console", "sh", "shell"):
                continue
            for line in b.code.replace("\\\n", " ").splitlines():
                line = line.removeprefix("$ ").strip()
                if line.startswith("preemptible "):
                    words = shlex.split(line, comments=True)
                    found.append((f"{page.relative_to(ROOT)}:{b.line}", words[1:]))
    return found


def _check(words: list[str], command: click.Command) -> str | None:
    """None if ``words`` name a command under ``command`` and only options it has."""
    options = {opt: p for p in command.params for opt in [*p.opts, *p.secondary_opts]}
    skip = False
    for i, word in enumerate(words):
        if skip:  # the value of the option before
            skip = False
            continue
        if word in ("--", "..."):
            return None
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if name == "--help":
                continue
            if name not in options:
                return f"{command.name} has no option {name}"
            skip = "=" not in word and not getattr(options[name], "is_flag", False)
            continue
        subcommands = getattr(command, "commands", None)  # a group (typer's own click)
        if subcommands is not None and not word.startswith("-"):
            if word not in subcommands:
                return f"{command.name} has no command {word!r}"
            return _check(words[i + 1 :], subcommands[word])
    return None


def test_every_command_shown_exists_with_its_options() -> None:
    root = typer.main.get_command(app)
    commands = _commands()
    assert len(commands) > 20, "the guides show the CLI"
    problems = [
        f"{where}: preemptible {' '.join(w)}: {p}"
        for where, w in commands
        if (p := _check(w, root))
    ]
    assert not problems, "\n".join(problems)


# --- the README's programs, run -------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _train(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "train.py"],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(180)
def test_the_readme_training_loop_stops_on_sigterm_and_resumes_bit_exactly(tmp_path: Path) -> None:
    script = block("README.md", "readme-train")
    for run in ("once", "twice"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "train.py").write_text(script)
    once = _train(tmp_path / "once")
    assert once.returncode == 0 and once.stdout.startswith("loss "), once.stderr

    first = subprocess.Popen(
        [sys.executable, "train.py"],
        cwd=tmp_path / "twice",
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list((tmp_path / "twice" / "runs" / "readme").glob("step-*/manifest.json")):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.01)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    if first.returncode == 0:
        pytest.skip("the loop finished before the signal arrived (a very fast machine)")
    assert first.returncode == 143 and "preempted: checkpointed step" in err, err
    again = _train(tmp_path / "twice")
    assert again.returncode == 0, again.stderr
    assert again.stdout == once.stdout, "the resumed run ends where the uninterrupted one did"


def test_the_readme_checkpointer_saves_and_restores_the_newest(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", block("README.md", "readme-checkpointer")],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "restored step 200\n"
    steps = sorted(p.parent.name for p in (tmp_path / "runs" / "ckpt").glob("step-*/manifest.json"))
    assert steps == ["step-000000000100", "step-000000000200"]
