"""The last save fits the deadline, with real deadlines and a remote that is slow for real.

A real training process (`scripts/last_save_train.py`) writes to ``slowdir://``, the local disk
with a real sleep per file written, optionally behind a fast local tier. Once its costs are
measured (its cost file says so), it gets a real SIGTERM with a grace (``PREEMPTIBLE_GRACE_
SECONDS``) that leaves room for all, part or none of its last save.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from preemptible import Checkpointer
from tests.integration.test_torchrun import Output, spawn

REPO = Path(__file__).parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "last_save_train.py"
NOTICE_EXIT = 143


def start(
    tmp: Path, *, grace_s: float, write_delay_s: float, local: Path | None, total: int = 100_000
) -> Output:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREEMPTIBLE_")}
    env.update(
        PREEMPTIBLE_GRACE_SECONDS=str(grace_s),
        PREEMPTIBLE_COST_FILE=str(tmp / "cost.json"),
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    command = [sys.executable, str(SCRIPT), str(tmp / "remote")]
    command += ["--write-delay", str(write_delay_s), "--total", str(total)]
    if local is not None:
        command += ["--local", str(local)]
    return Output(spawn(command, env))


def wait_for_costs(tmp: Path, measured: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The job's cost file, once `measured` says it has the numbers the test needs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            cost = json.loads((tmp / "cost.json").read_text())
        except (OSError, ValueError):
            cost = {}
        if cost and measured(cost):
            return cost
        time.sleep(0.1)
    raise AssertionError(f"the job never measured what the test needs: {cost}")


def stop(job: Output) -> tuple[int, str, int]:
    """SIGTERM the job; its exit code, its output and the last step it completed."""
    os.kill(job.proc.pid, signal.SIGTERM)
    code, out = job.finish()
    return code, out, max(int(s) for s in re.findall(r"^step (\d+)$", out, re.MULTILINE))


def newest(root: Path) -> int | None:
    info = Checkpointer(root).latest()
    return None if info is None else info.step


def test_one_tier_exits_at_once_when_the_save_cannot_finish(tmp_path) -> None:
    # Three files per save at 0.5 s each: a 1.5 s save against a 0.5 s grace.
    job = start(tmp_path, grace_s=0.5, write_delay_s=0.5, local=None)
    wait_for_costs(tmp_path, lambda cost: cost["samples"] >= 1)
    code, out, last = stop(job)
    assert code == NOTICE_EXIT, out
    assert "last save: none, exiting on the last checkpoint (0." in out, out
    assert "it cannot finish" in out and "not saved" in out
    saved = newest(tmp_path / "remote")
    assert saved is not None and saved < last  # the stop step was not saved: nothing was torn
    assert Checkpointer(tmp_path / "remote").verify(saved).ok


def test_two_tiers_commit_locally_and_leave_the_upload_to_the_next_start(tmp_path) -> None:
    # The local commit takes milliseconds, the upload 3 x 1 s: only the local commit fits 1.5 s.
    node = tmp_path / "node-a"
    job = start(tmp_path, grace_s=1.5, write_delay_s=1.0, local=node)
    wait_for_costs(tmp_path, lambda cost: (cost["upload_samples"] or 0) >= 1)
    code, out, last = stop(job)
    assert code == NOTICE_EXIT, out
    assert "last save: local, then the upload for up to" in out, out
    assert f"step {last} is committed locally, not remotely" in out
    assert newest(node) == last
    remote = newest(tmp_path / "remote")
    assert remote is not None and remote < last

    # Another node has no local copy: it resumes from the remote's newest (already complete).
    other = start(
        tmp_path, grace_s=30, write_delay_s=0.0, local=tmp_path / "node-b", total=remote + 1
    )
    code, out = other.finish()
    assert code == 0 and f"already complete at step {remote}" in out, out

    # This node resumes from its local copy, newer than the remote's, and uploads it.
    again = start(tmp_path, grace_s=30, write_delay_s=0.0, local=node, total=last + 2)
    code, out = again.finish()
    assert code == 0 and f"resumed from {last}\n" in out, out
    assert newest(tmp_path / "remote") == last + 1  # its final save, uploaded before the exit
    assert Checkpointer(tmp_path / "remote").verify(last).ok  # the stranded step, uploaded too


def test_two_tiers_wait_for_the_upload_when_the_grace_allows(tmp_path) -> None:
    node = tmp_path / "node-a"
    job = start(tmp_path, grace_s=30, write_delay_s=0.2, local=node)
    wait_for_costs(tmp_path, lambda cost: (cost["upload_samples"] or 0) >= 1)
    code, out, last = stop(job)
    assert code == NOTICE_EXIT, out
    assert "last save: durable (" in out and "not remotely" not in out, out
    assert newest(node) == last and newest(tmp_path / "remote") == last
