"""The Lightning page's script, run as printed: stopped by a real SIGTERM, resumed by the same
command, and bitwise equal to a run that never stopped.

The page (docs/ways-in/lightning.md) promises that with its loader and a model with dropout the
resumed run reads the same batches and draws the same dropout masks as an uninterrupted one,
from the preemption save and from an end-of-epoch save (what a resume falls back to when the
preemption save is corrupt), with one process and with ddp on two. Each run's every batch is
traced (what it read, the loss dropout gave it) by a harness the page's code does not see
(tests/integration/scripts/lightning_page/sitecustomize.py); the final weights and optimizer
state are read from the run's own ``last.ckpt``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import block
from tests.helpers import assert_same

pytest.importorskip("lightning")

from preemptible.lightning import PreemptibleCheckpointIO

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).parent / "scripts" / "lightning_page"
PAGE = "docs/ways-in/lightning.md"
STEPS_PER_EPOCH = 32  # 512 samples, batch 16
CKPT = Path("runs") / "lightning"


def _run(workdir: Path, *args: str, kill_at: int | None = None) -> subprocess.CompletedProcess:
    script = workdir / "train.py"
    if not script.exists():
        script.write_text(block(PAGE, "lightning-train"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(HARNESS), str(REPO)]),
        OMP_NUM_THREADS="1",
        PAGE_TRACE=str(workdir / "trace-rank"),
    )
    if kill_at is not None:
        env["PAGE_KILL_AT"] = str(kill_at)
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _trace(workdir: Path, rank: int = 0) -> dict[int, str]:
    """Each global step's batch and loss; a step run twice (before the stop and after the
    resume) keeps its last run."""
    lines = (workdir / f"trace-rank{rank}").read_text().splitlines()
    return {int(line.split()[0]): line for line in lines}


def _final(workdir: Path) -> dict:
    state = PreemptibleCheckpointIO().load_checkpoint(workdir / CKPT / "last.ckpt")
    return {"weights": state["state_dict"], "optimizer": state["optimizer_states"]}


def _stop(workdir: Path, *args: str, kill_at: int) -> str:
    stopped = _run(workdir, *args, kill_at=kill_at)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    said = f"preemptible: SIGTERM: saved step {kill_at} to {CKPT / 'preempted.ckpt'}; "
    assert said + "exiting with 143" in stopped.stderr, stopped.stderr[-3000:]
    return stopped.stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    done = _run(workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_trace(workdir)) == 3 * STEPS_PER_EPOCH
    return workdir


def test_page_script_sigterm_mid_epoch_resumes_bitwise(tmp_path: Path, uninterrupted: Path) -> None:
    """Stopped in the middle of the second epoch: the sampler's epoch, the loader's position
    and the RNG states must all come back."""
    _stop(tmp_path, kill_at=STEPS_PER_EPOCH + 9)
    resumed = _run(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = f"preemptible: resuming from {CKPT / 'preempted.ckpt'} at step {STEPS_PER_EPOCH + 9}"
    assert said in resumed.stderr
    assert _trace(tmp_path) == _trace(uninterrupted), "a batch read or drew something else"
    assert_same(_final(tmp_path), _final(uninterrupted))


def test_page_script_corrupt_preemption_save_falls_back_to_end_of_epoch_bitwise(
    tmp_path: Path, uninterrupted: Path
) -> None:
    """The preemption save is corrupted on disk: the resume takes ModelCheckpoint's save at the
    end of the first epoch, and the second epoch is dealt as in the run that never stopped."""
    _stop(tmp_path, kill_at=STEPS_PER_EPOCH + 5)
    payloads = (tmp_path / CKPT / "preempted.ckpt").rglob("*.bin")
    payload = max(payloads, key=lambda p: p.stat().st_size)
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))

    resumed = _run(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "skipping" in resumed.stderr and "preempted.ckpt" in resumed.stderr
    assert f"resuming from {CKPT / 'last.ckpt'} at step {STEPS_PER_EPOCH}" in resumed.stderr
    assert _trace(tmp_path) == _trace(uninterrupted), "a batch read or drew something else"
    assert_same(_final(tmp_path), _final(uninterrupted))


def test_page_script_ddp_on_two_processes_resumes_bitwise(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``python train.py 2``: ddp on gloo. SIGTERM reaches rank 0 alone; the ranks agree on the
    step, rank 0 saves, both exit; the same command resumes both, each reading its own shard of
    the second epoch as the uninterrupted run did."""
    steps = STEPS_PER_EPOCH // 2
    reference = tmp_path_factory.mktemp("ddp-uninterrupted")
    done = _run(reference, "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_trace(reference, 1)) == 3 * steps

    workdir = tmp_path_factory.mktemp("ddp-stopped")
    _stop(workdir, "2", kill_at=steps + 5)
    resumed = _run(workdir, "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for rank in (0, 1):
        assert _trace(workdir, rank) == _trace(reference, rank), f"rank {rank}"
    assert_same(_final(workdir), _final(reference))
