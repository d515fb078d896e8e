"""Debian's Chromium driven by Playwright, for the tests that look at a page in a browser (the
queue manager's dashboard, the simulator's HTML report).

Playwright's own browser download (`playwright install`) needs a network the test machines do
not have; Debian's `chromium` package works with it (headless, `--no-sandbox` as root). The
set-up installs the package with apt when it is missing, as the SLURM test does for its
daemons, and skips with the reason only when that cannot work (not root, no apt, no package).

Screenshots shown in the docs are taken on every run and copied to `docs/img/` only when
`PREEMPTIBLE_UPDATE_SCREENSHOTS=1`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",  # as root, Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
UPDATE_SCREENSHOTS = os.environ.get("PREEMPTIBLE_UPDATE_SCREENSHOTS") == "1"


def chromium() -> Path:
    """Debian's Chromium, installed with apt first if it is missing; skips if it cannot be."""
    if CHROMIUM.exists():
        return CHROMIUM
    why = _install()
    if why is not None or not CHROMIUM.exists():
        pytest.skip(f"the browser tests need Debian's chromium: {why or 'not found'}")
    return CHROMIUM


@contextmanager
def launched() -> Iterator[Any]:
    """A headless Chromium (Playwright's `Browser`), closed on exit; skips without Playwright
    or Chromium."""
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
    path = chromium()
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(path), headless=True, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def keep_screenshot(path: Path) -> None:
    """Copies a screenshot the test took to `docs/img/` under its own name, when asked to."""
    if UPDATE_SCREENSHOTS:
        shutil.copyfile(path, DOCS_IMG / path.name)


def _install() -> str | None:
    """Runs `apt-get install chromium` (after `apt-get update` if the first try fails);
    returns why it could not, or None."""
    if os.geteuid() != 0:
        return "not root, so it cannot be installed here (apt-get install chromium)"
    if shutil.which("apt-get") is None:
        return "no apt-get on this machine to install it with"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    for attempt in ("install", "update, then install"):
        if attempt != "install":
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            return None
    return f"apt-get install chromium failed: {done.stderr.strip().splitlines()[-1:]}"
