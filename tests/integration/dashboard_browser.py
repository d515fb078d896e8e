"""Debian's Chromium driven by Playwright, for the dashboard's tests.

Playwright's own browser download (`playwright install`) needs a network the test machines do
not have; Debian's `chromium` package works with it (headless, `--no-sandbox` as root). The
set-up installs the package with apt when it is missing, as the SLURM test does for its
daemons, and skips with the reason only when that cannot work (not root, no apt, no package).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

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


def chromium() -> Path:
    """Debian's Chromium, installed with apt first if it is missing; skips if it cannot be."""
    if CHROMIUM.exists():
        return CHROMIUM
    why = _install()
    if why is not None or not CHROMIUM.exists():
        pytest.skip(f"the dashboard's browser tests need Debian's chromium: {why or 'not found'}")
    return CHROMIUM


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
