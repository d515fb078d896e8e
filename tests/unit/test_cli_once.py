"""A single-valued option given twice is refused, not silently the last one."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "preemptible", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["sim", "--policy", "fifo", "--policy=all", "--trace", "t", "--config", "c"],
            "--policy given 2 times (fifo, all): give it once",
        ),
        (["sim", "--quiet", "--quiet"], "--quiet given 2 times"),
        (["queue", "submit", "--queue", "a", "--queue", "b", "--", "true"], "--queue given 2"),
        (["ckpt", "list", "--json", "--json", "somewhere"], "--json given 2 times"),
    ],
)
def test_a_repeated_option_is_one_error_line_and_exit_2(args, message):
    done = run(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_repeatable_options_and_the_jobs_own_options_are_not_checked():
    """`--env` may repeat; what follows the command is the job's, even `--queue` again."""
    done = run(
        "queue", "submit", "--queue", "a", "--env", "A=1", "--env", "B=2",
        "--url", "http://127.0.0.1:9", "--", "python", "x.py", "--queue", "b",
    )  # fmt: skip
    assert done.returncode == 1 and "cannot reach the queue manager" in done.stderr, done.stderr
