"""Preempt a real training process with a real SIGTERM and resume it: the result is bit-exact.

The training script is `examples/plain_pytorch.py` (model with dropout, AdamW, cosine schedule,
numpy and Python RNG draws, shuffled data through a DataLoader). Each configuration runs once
uninterrupted; then again with SIGTERM sent at a random step, restarted, and finished. Model,
optimizer, schedule and data position must equal the uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from preemptible import Checkpointer
from tests.helpers import assert_same

SCRIPT = Path(__file__).parents[2] / "examples" / "plain_pytorch.py"
STEPS = 60


def train(root: Path, options: list[str], kill_at: int | None = None) -> tuple[int, list[int]]:
    """Run the script; SIGTERM it when it reports ``kill_at``. Returns (exit code, steps run)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--dir",
            str(root),
            "--steps",
            str(STEPS),
            "--every",
            "10",
            "--step-seconds",
            "0.02",
            *options,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    steps = []
    for line in proc.stdout:
        if line.startswith("step "):
            steps.append(int(line.split()[1]))
            if steps[-1] == kill_at:
                os.kill(proc.pid, signal.SIGTERM)
    return proc.wait(timeout=120), steps


def final_state(root: Path) -> dict:
    return Checkpointer(root).load(STEPS - 1)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(["--sync"], id="sync-save"),
        pytest.param(["--workers", "2"], id="async-save-2-workers"),
        pytest.param(["--loader", "stateful"], id="async-save-stateful-dataloader"),
    ],
)
def test_sigterm_at_a_random_step_then_resume_is_bitwise_equal_to_an_uninterrupted_run(
    tmp_path, options
):
    code, steps = train(tmp_path / "reference", options)
    assert code == 0 and steps == list(range(STEPS))
    reference = final_state(tmp_path / "reference")

    rng = random.Random(" ".join(options))
    for trial, kill_at in enumerate(sorted(rng.sample(range(3, STEPS - 10), 2))):
        root = tmp_path / f"preempted-{trial}"
        code, first = train(root, options, kill_at=kill_at)
        assert code == 128 + signal.SIGTERM, f"exit code {code}"
        stopped = Checkpointer(root).latest().step
        assert stopped == first[-1] >= kill_at, "the notice step was not the checkpointed step"
        code, second = train(root, options)
        assert code == 0 and second[0] == stopped + 1 and second[-1] == STEPS - 1
        resumed = final_state(root)
        for key in ("model", "optim", "sched", "data"):
            assert_same(reference[key], resumed[key], key)
