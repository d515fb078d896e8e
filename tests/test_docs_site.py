"""The docs site builds with warnings as errors, and the getting-started page runs as written.

`mkdocs.yml` makes a broken link, a missing anchor, a page left out of the nav and a docstring
griffe cannot read into warnings, and `--strict` makes a warning an error, so building the site
is the check. The getting-started page is run for real: its script is extracted, started, sent
SIGTERM, started again (and once more, finished), and every output line the page shows must be
one the runs printed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import preemptible
from tests.doc_blocks import block

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"
# The commands of the page, which the test below does with a wait in place of `sleep 5`.
KILL_COMMAND = '$ python train.py & sleep 5; kill -TERM $!; wait $!; echo "exit status $?"'
RUN_COMMAND = "$ python train.py"
FINISHED_COMMAND = '$ python train.py; echo "exit status $?"'
NOTICE_LINE = re.compile(
    r"^preempted: checkpointed step (\d+) \d+\.\d\d s after the notice \(SIGTERM\) "
    r"in \S+/runs/first; exiting with 143$",
    re.M,
)
STEP_LINE = re.compile(r"^step (\d+) loss \S+$")


def _blocks(markdown: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", markdown, re.M | re.S)


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "getting-started" / "index.html").is_file()
    assert (tmp_path / "api" / "preemptible" / "index.html").is_file()


def test_the_api_page_covers_every_public_name() -> None:
    page = (DOCS / "api" / "preemptible.md").read_text()
    missing = [
        name
        for name in preemptible.__all__
        if f"::: preemptible.{name}\n" not in page
        and f"[`{name}`][" not in page
        and f"| `{name}` |" not in page
    ]
    assert not missing, f"docs/api/preemptible.md neither documents nor links {missing}"


def test_getting_started_pins_the_torch_of_the_makefile() -> None:
    pin = re.search(r"^TORCH\s*\?=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pin is not None
    installs = re.findall(r"pip install \"(torch==[^\"]+)\"", GETTING_STARTED.read_text())
    assert installs and set(installs) == {pin.group(1)}


@pytest.mark.timeout(180)
def test_getting_started_runs_as_written(tmp_path: Path) -> None:
    page = GETTING_STARTED.read_text()
    script = block("docs/getting-started.md", "getting-started")
    killed, resumed, finished = _blocks(page, "console")
    assert killed.splitlines()[0] == KILL_COMMAND
    assert resumed.splitlines()[0] == RUN_COMMAND
    assert finished.splitlines()[0] == FINISHED_COMMAND
    (tmp_path / "train.py").write_text(script)

    # 1. Run it, and SIGTERM it once the loop is running (the page's `sleep 5`).
    first = subprocess.Popen(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert first.stdout is not None
    printed = []
    for line in first.stdout:
        printed.append(line.rstrip("\n"))
        if line.startswith("step 5 "):
            break
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=60)
    printed += out.splitlines()
    assert first.returncode == 128 + signal.SIGTERM, err
    notice = NOTICE_LINE.search(err)
    assert notice is not None, err
    saved = int(notice.group(1))
    assert printed[-1].startswith(f"step {saved} ")
    assert (tmp_path / "runs" / "first" / f"step-{saved:012d}" / "manifest.json").is_file()

    # 2. Run it again: it resumes at the next step and ends as an uninterrupted run does.
    second = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    rerun = second.stdout.splitlines()
    assert rerun[0].startswith(f"step {saved + 1} ")
    printed += rerun

    # 3. The page shows what the runs printed: the same loss at each step shown, the same end.
    real = {int(m.group(1)): line for line in printed if (m := STEP_LINE.match(line))}
    assert sorted(real) == list(range(100))
    shown = killed.splitlines() + resumed.splitlines()
    for line in shown:
        if m := STEP_LINE.match(line):
            assert line == real[int(m.group(1))]
    assert resumed.splitlines()[-1] == rerun[-1]
    assert rerun[-1].startswith("done: loss ")

    # 4. The page's own example is consistent: the step it killed at, the one it resumed from,
    # the checkpoint folder it names and the exit status.
    page_saved = NOTICE_LINE.search(killed)
    assert page_saved is not None
    page_step = int(page_saved.group(1))
    killed_steps = [int(m.group(1)) for ln in killed.splitlines() if (m := STEP_LINE.match(ln))]
    resumed_steps = [int(m.group(1)) for ln in resumed.splitlines() if (m := STEP_LINE.match(ln))]
    assert killed_steps[-1] == page_step and resumed_steps[0] == page_step + 1
    assert f"runs/first/step-{page_step:012d}/" in page
    assert "exit status 143" in killed.splitlines()

    # 5. Once more, after it finished: the line the page shows, on stderr, and status 0.
    third = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    [said, status] = finished.splitlines()[1:]
    assert third.returncode == 0 and status == "exit status 0", third.stderr
    assert third.stdout == ""
    assert third.stderr.splitlines() == [said.replace("/home/you", str(tmp_path))]
