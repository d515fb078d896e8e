"""A real Accelerator on the CPU under PreemptibleAccelerator, started as its users start it.

One process under the real ``accelerate launch`` CLI and two (``--multi_gpu``: torchrun, gloo):
a real SIGTERM mid-epoch, exit 143 after the commit, the same command again, and weights and
optimizer state bitwise equal to an uninterrupted run. A SIGKILL in the middle of a save with
``total_limit=1`` leaves the previous checkpoint whole and the restart resumes from it. The
example runs, stops on SIGTERM and resumes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version

pytest.importorskip("accelerate")

import accelerate

from preemptible import Checkpointer
from tests.helpers import assert_same
from tests.integration.test_signals_real import wait_gone
from tests.polling import wait_until
from tests.s3servers import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "accelerate_train.py"
EXAMPLE = REPO / "examples" / "accelerate_train.py"
ACCELERATE = str(Path(sys.executable).parent / "accelerate")
TIMEOUT = 120
# Accelerate 1.16 made its launcher handle SIGTERM: it passes it on and exits 128 + signum. Before,
# the one-process launcher died of it and the torchrun launcher exited 1
# (docs/ways-in/accelerate.md).
LAUNCHER_EXITS_143 = Version(accelerate.__version__) >= Version("1.16")
PER_EPOCH = 24  # 96 samples, batch 4, one process; half of it per rank with two


def _env(tmp_path: Path) -> dict[str, str]:
    inherited = ("ACCELERATE_", "SLURM_", "TORCHELASTIC_", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    return {
        **env,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HOME": str(tmp_path / "hf"),  # no accelerate config file of this machine's
    }


def _launch(workdir: Path, *extra: str, procs: int) -> list[str]:
    # On a machine without GPUs only --multi_gpu starts several processes (torchrun, gloo);
    # without it --num_processes 2 runs one (docs/ways-in/accelerate.md).
    many = ["--multi_gpu"] if procs > 1 else []
    return [
        ACCELERATE,
        "launch",
        *many,
        f"--num_processes={procs}",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        f"--main_process_port={free_port()}",
        str(SCRIPT),
        str(workdir),
        *extra,
    ]


def _start(cmd: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a group of its own: signalled as a whole, killed on failure
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out; output:\n{out}")
    return proc.returncode, out


def _run(cmd: list[str], tmp_path: Path) -> str:
    code, out = _finish(_start(cmd, tmp_path))
    assert code == 0, out
    return out


def _wait_for(proc: subprocess.Popen[str], ready: Callable[[], bool], what: str) -> None:
    """Until `ready()`; if the run ends or TIMEOUT passes first, kill it, fail with its output."""

    def output() -> str:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return f"output:\n{proc.communicate()[0]}"

    def seen() -> bool:
        if ready():
            return True
        assert proc.poll() is None, f"the run exited {proc.returncode} before {what}; {output()}"
        return False

    wait_until(seen, what, timeout=TIMEOUT, every=0.001, describe=output)


def _read(workdir: Path, name: str) -> str:
    try:
        return (workdir / name).read_text().strip()
    except FileNotFoundError:
        return ""


def _progress(workdir: Path, rank: int = 0) -> int:
    return int(_read(workdir, f"progress-rank{rank}") or 0)


def _assert_same_result(reference: Path, workdir: Path, ranks: int = 1) -> None:
    for rank in range(ranks):
        expected = Checkpointer(reference / "final").load(rank=rank)
        assert_same(Checkpointer(workdir / "final").load(rank=rank), expected, f"rank{rank}")


def _folders(workdir: Path) -> list[str]:
    found = (workdir / "checkpoints").iterdir()
    return sorted((p.name for p in found), key=lambda n: int(n.rsplit("_", 1)[1]))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, uninterrupted (python, no launcher: the result does not depend on it)."""
    workdir = tmp_path_factory.mktemp("reference")
    _run([sys.executable, str(SCRIPT), str(workdir)], workdir)
    return workdir


@pytest.mark.parametrize(
    "to",
    [
        "group",
        pytest.param(
            "launcher",
            marks=pytest.mark.skipif(
                not LAUNCHER_EXITS_143, reason="before 1.16 the launcher forwards nothing"
            ),
        ),
    ],
)
def test_one_process_sigterm_mid_epoch_saves_exits_143_and_resumes_bitwise(tmp_path, reference, to):
    workdir = tmp_path / "run"
    workdir.mkdir()
    cmd = _launch(workdir, "--total-limit=2", procs=1)
    proc = _start([*cmd, "--slow=0.05"], tmp_path)
    _wait_for(proc, lambda: _progress(workdir) >= PER_EPOCH + 6, "batches of the second epoch")
    trainer = int(_read(workdir, "pid-rank0"))
    # Before 1.16 the launcher forwarded nothing: a SIGTERM to it alone orphaned the trainer. A
    # shell's Ctrl-C, SLURM and the queue manager signal the whole group; from 1.16 the launcher
    # alone terminates its child's tree.
    if to == "group":
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    code, out = _finish(proc)
    assert code == (143 if LAUNCHER_EXITS_143 else -signal.SIGTERM), out  # the trainer saved:
    wait_gone([trainer], TIMEOUT)
    assert _read(workdir, "exit-rank0") == "143", out
    stopped = _progress(workdir)
    assert PER_EPOCH < stopped < 2 * PER_EPOCH, "stopped mid-epoch"
    assert f"preempted: checkpointed step {stopped}" in out
    assert Checkpointer(workdir / "checkpoints" / "checkpoint_1").latest().step == stopped

    out = _run(cmd, tmp_path)
    assert f"rank 0 resumed from step {stopped}" in out
    _assert_same_result(reference, workdir)
    assert _folders(workdir) == ["checkpoint_1", "checkpoint_2"], "total_limit=2"


def test_two_tiers_sigterm_uploads_before_the_exit_and_another_node_resumes_bitwise(
    tmp_path, reference
):
    """``local=``: the notice's save commits on the local tier and is uploaded to
    ``checkpoints/checkpoint_{i}`` before the exit; a restart with another, empty local directory
    (another node) resumes from the remote copy, bitwise, and ``close`` waits for its uploads."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    cmd = [sys.executable, str(SCRIPT), str(workdir), "--total-limit=2"]
    proc = _start([*cmd, "--local", str(node_a), "--slow=0.05"], tmp_path)
    _wait_for(proc, lambda: _progress(workdir) >= PER_EPOCH + 6, "batches of the second epoch")
    proc.send_signal(signal.SIGTERM)
    code, out = _finish(proc)
    assert code == 143, out
    stopped = _progress(workdir)
    assert PER_EPOCH < stopped < 2 * PER_EPOCH, "stopped mid-epoch"
    assert "the checkpoint saved on the notice is durable" in out, out
    assert Checkpointer(workdir / "checkpoints" / "checkpoint_1").latest().step == stopped
    assert Checkpointer(node_a / "checkpoint_1").latest().step == stopped, "committed locally"

    out = _run([*cmd, "--local", str(node_b)], tmp_path)
    assert f"rank 0 resumed from step {stopped}" in out
    _assert_same_result(reference, workdir)
    assert _folders(workdir) == ["checkpoint_1", "checkpoint_2"], "total_limit=2"
    final = Checkpointer(workdir / "checkpoints" / "checkpoint_2").latest()
    assert final is not None and final.step == 2 * PER_EPOCH, "close waited for the upload"


@pytest.fixture(scope="module")
def reference_two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two processes, uninterrupted."""
    workdir = tmp_path_factory.mktemp("reference-two")
    _run(_launch(workdir, procs=2), workdir)
    return workdir


def test_two_processes_agree_on_the_step_save_together_and_resume_bitwise(tmp_path, reference_two):
    reference = reference_two
    workdir = tmp_path / "run"
    workdir.mkdir()
    cmd = _launch(workdir, procs=2)
    proc = _start([*cmd, "--slow=0.05"], tmp_path)
    half = PER_EPOCH // 2
    _wait_for(proc, lambda: min(_progress(workdir, r) for r in (0, 1)) >= half + 3, "epoch 2")
    trainers = [int(_read(workdir, f"pid-rank{r}")) for r in (0, 1)]
    os.kill(proc.pid, signal.SIGTERM)  # to the launcher alone: its torchrun agent forwards it
    code, out = _finish(proc)
    assert code == (143 if LAUNCHER_EXITS_143 else 1), out  # torchrun's SignalException
    wait_gone(trainers, TIMEOUT)
    assert [_read(workdir, f"exit-rank{r}") for r in (0, 1)] == ["143", "143"], out
    assert [_read(workdir, f"group-rank{r}") for r in (0, 1)] == ["ended", "ended"], out
    stopped = _progress(workdir, 0)
    assert _progress(workdir, 1) == stopped and half < stopped < 2 * half, "one step for both"
    assert out.count(f"preempted: checkpointed step {stopped}") == 2, out
    latest = Checkpointer(workdir / "checkpoints" / "checkpoint_1").latest()
    assert (latest.step, latest.world_size) == (stopped, 2), "one commit, a state per process"

    out = _run(cmd, tmp_path)
    for rank in (0, 1):
        assert f"rank {rank} resumed from step {stopped}" in out
    _assert_same_result(reference, workdir, ranks=2)
    code, out = _finish(_start([sys.executable, str(SCRIPT), str(workdir)], tmp_path))
    assert code == 1 and "saved by 2 processes, this run has 1" in out, out


def test_two_processes_on_two_tiers_upload_the_notice_save_and_resume_locally_bitwise(
    tmp_path, reference_two
):
    """``local=`` with two processes on one node: both write their state to the one local
    folder, the main process commits it and uploads it before the exit. The restart on the same
    node finds the remote copy gone (as if its upload had been cut off): each process resumes
    its own state from the local copy, bitwise, and the main process uploads it again."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    node_a = tmp_path / "node-a"
    cmd = _launch(workdir, procs=2)
    proc = _start([*cmd, "--local", str(node_a), "--slow=0.05"], tmp_path)
    half = PER_EPOCH // 2
    _wait_for(proc, lambda: min(_progress(workdir, r) for r in (0, 1)) >= half + 3, "epoch 2")
    trainers = [int(_read(workdir, f"pid-rank{r}")) for r in (0, 1)]
    os.kill(proc.pid, signal.SIGTERM)  # to the launcher alone: its torchrun agent forwards it
    code, out = _finish(proc)
    assert code == (143 if LAUNCHER_EXITS_143 else 1), out
    wait_gone(trainers, TIMEOUT)
    assert [_read(workdir, f"exit-rank{r}") for r in (0, 1)] == ["143", "143"], out
    stopped = _progress(workdir, 0)
    assert _progress(workdir, 1) == stopped and half < stopped < 2 * half, "one step for both"
    assert out.count("the checkpoint saved on the notice is durable") == 1, "main process only"
    for tier in (workdir / "checkpoints", node_a):
        latest = Checkpointer(tier / "checkpoint_1").latest()
        assert (latest.step, latest.world_size) == (stopped, 2), f"{tier}: a state per process"

    shutil.rmtree(workdir / "checkpoints" / "checkpoint_1")
    out = _run([*cmd, "--local", str(node_a)], tmp_path)
    for rank in (0, 1):
        assert f"rank {rank} resumed from step {stopped}" in out
    _assert_same_result(reference_two, workdir, ranks=2)  # rank 1 read rank 1's state
    again = Checkpointer(workdir / "checkpoints" / "checkpoint_1").latest()
    assert (again.step, again.world_size) == (stopped, 2), "the local copy was uploaded again"
    final = Checkpointer(workdir / "checkpoints" / "checkpoint_2").latest()
    assert (final.step, final.world_size) == (PER_EPOCH, 2), "close waited for the upload"


def test_sigkill_in_a_save_leaves_the_previous_checkpoint_whole_with_total_limit_1(
    tmp_path, reference
):
    workdir = tmp_path / "run"
    workdir.mkdir()
    # 64 MiB of registered state: a save lasts a few hundred ms, long enough to be cut.
    cmd = [sys.executable, str(SCRIPT), str(workdir), "--total-limit=1", "--ballast-mib=64"]
    cmd += ["--save-every=8"]
    proc = _start([*cmd, "--slow=0.02"], tmp_path)
    first, second = (workdir / "checkpoints" / f"checkpoint_{i}" for i in (0, 1))
    _wait_for(proc, lambda: any(first.glob("step-*")), "the first commit")
    _wait_for(proc, lambda: any(second.glob(".tmp-*")), "the second save under way")
    proc.kill()
    code, _ = _finish(proc)
    assert code == -signal.SIGKILL
    assert Checkpointer(second).latest() is None, "killed before the commit"
    assert Checkpointer(first).verify().ok, "Accelerate would have deleted it before writing"
    assert Checkpointer(first).latest().step == 8

    out = _run(cmd, tmp_path)
    assert "rank 0 resumed from step 8" in out
    _assert_same_result(reference, workdir)
    folders = _folders(workdir)
    assert len(folders) == 1 and folders[0] not in ("checkpoint_0", "checkpoint_1"), folders


def test_the_example_stops_on_sigterm_and_resumes(tmp_path):
    cmd = [sys.executable, str(EXAMPLE), "--dir", str(tmp_path / "acc"), "--epochs=2"]
    cmd += ["--samples=256", "--step-seconds=0.05"]  # 8 steps an epoch
    proc = _start(cmd, tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("epoch 1 step 10 "):
            proc.send_signal(signal.SIGTERM)
            break
    code, out = _finish(proc)
    assert code == 143, out
    assert "preempted: checkpointed step 1" in out

    out = _run(cmd, tmp_path)
    assert "resumed at epoch 1, step 1" in out
    assert "done: 16 steps" in out
