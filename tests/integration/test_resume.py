"""A real training program started again: after it finished, and over corrupt checkpoints.

The program is `examples/plain_pytorch.py` (`@preemptible`), run as a subprocess. A finished job
that is submitted again must say so and exit 0, not crash or print a result it did not compute;
a job whose checkpoints all fail verification must stop and name them, not train from step 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from preemptible import Checkpointer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "plain_pytorch.py"
STEPS = 6


def train(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PREEMPTIBLE_"))}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--dir", str(root), "--steps", str(STEPS), "--every", "2"],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        cwd=REPO,
        timeout=120,
    )


def test_a_finished_job_run_again_says_already_complete_and_exits_0(tmp_path):
    first = train(tmp_path / "ckpt")
    assert first.returncode == 0, first.stderr
    assert f"step {STEPS - 1} " in first.stdout and "final loss" in first.stdout

    again = train(tmp_path / "ckpt")
    assert again.returncode == 0, again.stderr
    assert f"already complete at step {STEPS - 1}" in again.stderr
    assert "Traceback" not in again.stderr
    assert again.stdout == ""  # no step ran, and no "final loss" of a loop that did not run
    assert [i.step for i in Checkpointer(tmp_path / "ckpt").list()] == [3, 5]


def test_a_job_whose_checkpoints_are_all_corrupt_stops_and_names_them(tmp_path):
    root = tmp_path / "ckpt"
    assert train(root).returncode == 0
    for step in (3, 5):  # keep=2: every checkpoint there is
        data = sorted((root / f"step-{step:012d}").glob("data-*.bin"))[0]
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        data.write_bytes(bytes(raw))

    again = train(root)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "NoValidCheckpointError" in again.stderr
    assert "fails verification (steps 5, 3)" in again.stderr
    assert "checksum mismatch" in again.stderr
    assert 'on_no_valid_checkpoint="start_over"' in again.stderr
    assert "step 0 " not in again.stdout  # it did not start over without a word
