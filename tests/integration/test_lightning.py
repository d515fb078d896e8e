"""The real Lightning Trainer on CPU, a real signal mid-epoch, a restart with the same command:
under SLURM's variables and with two tiers (the page's own script, one and two processes, is
run by test_lightning_page.py).

The interrupted-and-resumed run must end with weights and optimizer state bitwise equal to an
uninterrupted one: the save happened at the end of the batch the notice arrived in, and the
restart resumed at the next batch (data order included, via StatefulDataLoader).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from preemptible import Checkpointer
from tests.helpers import assert_same
from tests.polling import wait_until

pytest.importorskip("lightning")

SCRIPT = Path(__file__).parent / "scripts" / "lightning_train.py"
REPO = Path(__file__).resolve().parents[2]
BATCHES_PER_EPOCH = 24  # 96 samples, batch 4
TOTAL = 2 * BATCHES_PER_EPOCH


def _run(
    workdir: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(workdir), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        env=env or _env(),
    )


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    # Lightning reads SLURM_* to pick its cluster environment; keep the test's own.
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    return {**env, **extra}


# What srun sets for one task: Lightning then picks SLURMEnvironment(auto_requeue=True).
SLURM_ENV = {
    "SLURM_NTASKS": "1",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "train",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
}


def _progress(workdir: Path, rank: int = 0) -> int:
    try:
        return int((workdir / f"progress-rank{rank}").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def _interrupt_at(
    workdir: Path,
    batches: int,
    *extra: str,
    sig: signal.Signals = signal.SIGTERM,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Start the script, send ``sig`` once ``batches`` batches are done; its exit code and log."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(workdir), "--slow", "0.05", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env or _env(),
    )

    def output() -> str:
        proc.kill()  # nothing if it has exited
        return proc.communicate()[0]

    def done() -> bool:
        if _progress(workdir) >= batches:
            return True
        assert proc.poll() is None, output()
        return False

    try:
        wait_until(done, f"{batches} batches", timeout=60, every=0.01, describe=output)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def _final(workdir: Path, rank: int = 0) -> tuple[int, dict]:
    store = Checkpointer(workdir / f"final-rank{rank}")
    info = store.latest()
    assert info is not None
    return info.step, store.load()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    done = _run(workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    step, state = _final(workdir)
    assert step == TOTAL
    return state


def test_under_slurm_auto_requeue_our_handler_wins_on_sigusr1(
    tmp_path: Path, reference: dict
) -> None:
    """With SLURM's variables set, Lightning's auto_requeue is on. Our guard is installed first
    (``setup``), so Lightning leaves SIGUSR1 to it: no ``hpc_ckpt_*.ckpt``, no ``scontrol
    requeue``. We save, exit 138, and the same command resumes bitwise. (SIGTERM under SLURM
    takes the path of the test above: Lightning chains our handler after its own.)"""
    sig = signal.SIGUSR1
    env = _env(**SLURM_ENV)
    code, out = _interrupt_at(tmp_path, 5, sig=sig, env=env)
    assert code == 128 + sig, out
    assert "SLURM auto-requeueing enabled" in out, "Lightning did see SLURM"
    assert not list(tmp_path.rglob("hpc_ckpt_*")), "Lightning's requeue handler did not save"
    assert "requeing job" not in out, "nor did it run scontrol requeue"
    assert Checkpointer(tmp_path / "ckpt" / "preempted.ckpt").latest() is not None
    done = _run(tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same(_final(tmp_path)[1], reference)


def test_two_tiers_sigterm_commits_locally_uploads_and_resumes_on_another_node_bitwise(
    tmp_path: Path, reference: dict
) -> None:
    """``local=``: the notice's save commits on the local tier and is uploaded before the exit;
    a restart with another (empty) local directory, as on another node, resumes from the remote
    copy alone, bitwise; the end of fit waits for the uploads of its own saves."""
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    code, out = _interrupt_at(tmp_path, 5, "--local", str(node_a))
    assert code == 128 + signal.SIGTERM, out
    assert "the checkpoint saved on the notice is durable" in out, out
    preempted = Checkpointer(tmp_path / "ckpt" / "preempted.ckpt").latest()
    assert preempted is not None, "uploaded to the framework's path before the exit"
    stopped_at = preempted.metadata["global_step"]
    assert 5 <= stopped_at < BATCHES_PER_EPOCH, "the save is mid-epoch, right after the notice"
    local_copies = {p.name.split("-")[0] for p in node_a.iterdir()}
    assert "preempted.ckpt" in local_copies, local_copies

    done = _run(tmp_path, "--local", str(node_b))  # another node: nothing local
    assert done.returncode == 0, done.stdout + done.stderr
    step, state = _final(tmp_path)
    assert step == TOTAL
    assert_same(state, reference)
    last = Checkpointer(tmp_path / "ckpt" / "last.ckpt").latest()
    assert last is not None and last.metadata["global_step"] == TOTAL, "fit waited for it"
