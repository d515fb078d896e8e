"""Crashes and hangs of real torchrun jobs under the real queue manager.

A real `preemptible queue serve` runs `scripts/elastic_train.py` (an MLP under DDP, gloo on the
CPU, checkpointed by the SDK every 2 steps) as `torchrun --nproc-per-node 2`, with a failure
injected at step 5 (`--fault`):

- a segfault on the first attempt: the manager restarts the job after the back-off, it resumes
  from its checkpoint of step 3 (which its step beats told the manager of), and its final
  parameters equal an uninterrupted run's, bit for bit;
- an error at step 5 on every attempt: the second attempt resumes from step 3 and fails at
  step 5 again, no newer checkpoint: a crash loop, failed, and `queue why` says so with the
  error's line;
- a deadlocked collective (the last rank stops taking part at step 5): the SDK's step beats
  stop, the manager's bound, learned from the job's own step times, runs out, the notice
  goes unheard (the ranks are stuck), the kill comes at the deadline, the restart resumes,
  and the result is again bit for bit the uninterrupted one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import assert_same
from tests.integration.test_elastic_queue import run
from tests.integration.test_elastic_queue import torchrun as elastic_torchrun

from .queue_server import CLI, Server, events, submit, wait_for

CONFIG = """
[cluster]
gpus = 2
[preemption]
grace_min = "2s"
grace_max = "2s"
min_runtime = "0s"
[restarts]
backoff = "0.5s"
backoff_max = "2s"
crash_loop_after = 1
hang_min = "1s"
hang_factor = 10
beat = "0.2s"
[service]
admin_token = "env:R_ADMIN"
[[queues]]
name = "lab"
nominal = { gpus = 2 }
token = "env:R_LAB"
"""
TOKENS = {"R_ADMIN": "admin-secret", "R_LAB": "lab-secret"}
EPOCHS = 2  # 12 steps of 8 samples


def torchrun(root: Path, *args: str) -> list[str]:
    """The job: two ranks, a checkpoint every 2 steps."""
    return elastic_torchrun(root, "2", "--every-steps", "2", *args, epochs=EPOCHS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("uninterrupted")
    code, out = run(torchrun(root))
    assert code == 0, out
    return dict(torch.load(root / "out" / "final.pt", weights_only=True))


@pytest.fixture
def server(tmp_path: Path):
    (tmp_path / "server").mkdir()
    s = Server(tmp_path / "server", CONFIG, TOKENS)
    s.start()
    yield s
    s.stop()


def kinds(found: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in found]


def test_a_segfault_restarts_from_the_checkpoint_and_ends_as_if_uninterrupted(
    server, tmp_path, reference
):
    with server.client("lab-secret") as lab:
        cmd = torchrun(tmp_path, "--fault", "segv", "--fault-at", "5", "--step-s", "0.3")
        job = submit(lab, "lab", cmd, gpus=2)
        done = wait_for(lab, job["id"], {"completed", "failed"}, timeout=120)
        history = events(lab, job["id"])
    assert done["state"] == "completed", history
    assert (done["attempts"], done["restarts"]) == (2, 1)
    restarting = next(e for e in history if e["kind"] == "restarting")
    assert restarting["reason"].startswith("exited with 1 ("), restarting  # its first error
    assert "; restart 1 of 3 in 0.5 s" in restarting["reason"]
    # step 3's checkpoint reaches the manager with the next step beat, well before the crash;
    # under a heavy load the beat may come after it (then step 1's, from the cost report)
    assert re.search(r"\(last checkpoint reported: step [13]\)$", restarting["reason"])
    assert "Signal 11 (SIGSEGV)" in "\n".join(restarting["data"]["tail"]), "torchrun's report"
    final = torch.load(tmp_path / "out" / "final.pt", weights_only=True)
    assert_same(dict(final), reference)


def test_the_same_failing_step_twice_is_a_crash_loop_and_why_says_so(server, tmp_path):
    with server.client("lab-secret") as lab:
        fault = ("--fault", "exit", "--fault-at", "5", "--fault-attempts", "0", "--step-s", "0.3")
        cmd = torchrun(tmp_path, *fault)
        job = submit(lab, "lab", cmd, gpus=2)
        failed = wait_for(lab, job["id"], {"completed", "failed"}, timeout=120)
    assert failed["state"] == "failed" and failed["attempts"] == 2, failed
    assert failed["reason"].startswith(
        "failed: crash loop: 1 failures in a row without progress"
    ), failed["reason"]
    why = subprocess.run(
        [*CLI, "queue", "why", job["id"], "--url", server.url],
        env={"PREEMPTIBLE_TOKEN": "lab-secret", "PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert why.returncode == 0, why.stderr
    # the beats told the manager the step (4, the last boundary before the error at the end of
    # step 5; 3 if a beat came late) or at least the checkpoint (3, reported again)
    assert re.search(
        r"\((failing after step [34] each time|no checkpoint newer than step 3)\)",
        failed["reason"],
    ), failed["reason"]
    assert "(RuntimeError: injected NCCL error at step 5)" in failed["reason"]
    assert "crash loop" in why.stdout and "its last output:" in why.stdout, why.stdout


def test_a_deadlocked_collective_is_noticed_killed_and_restarted(server, tmp_path, reference):
    with server.client("lab-secret") as lab:
        cmd = torchrun(tmp_path, "--fault", "hang", "--fault-at", "5", "--step-s", "0.3")
        job = submit(lab, "lab", cmd, gpus=2)
        done = wait_for(lab, job["id"], {"completed", "failed"}, timeout=180)
        history = events(lab, job["id"])
    assert done["state"] == "completed", history
    assert (done["attempts"], done["restarts"]) == (2, 1)
    after_start = kinds(history)[kinds(history).index("admitted") + 1 :]
    steps = [k for k in after_start if k in ("notice", "killed", "restarting", "admitted")]
    assert steps == ["notice", "killed", "restarting", "admitted"], kinds(history)
    notice = next(e for e in history if e["kind"] == "notice")
    assert notice["reason"].startswith("hung: step 5 has not advanced for "), notice
    assert "x its slowest step" in notice["reason"], "the bound was learned from its steps"
    final = torch.load(tmp_path / "out" / "final.pt", weights_only=True)
    assert_same(dict(final), reference)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
