"""The Accelerate page's script, run as printed with the commands its table gives: stopped by a
real SIGTERM, resumed by the same command, and bitwise equal to a run that never stopped.

Each step's batch is traced by a harness the page's code does not see
(tests/integration/scripts/accelerate_page/sitecustomize.py). The final state is compared
through the newest checkpoint's manifest: it lists every file of the state (weights, optimizer,
scheduler, each process's RNG states and data position) with its checksum.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from tests.doc_blocks import block

accelerate = pytest.importorskip("accelerate")

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).parent / "scripts" / "accelerate_page"
PAGE = "docs/ways-in/accelerate.md"
ACCELERATE = str(Path(sys.executable).parent / "accelerate")
STEPS_PER_EPOCH = 32  # 512 samples, batch 16, one process
TWO_CPU_PROCESSES = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2"]


def _run(
    workdir: Path, *launch: str, kill_at: int | None = None, **env_extra: str
) -> subprocess.CompletedProcess[str]:
    script = workdir / "train.py"
    if not script.exists():
        script.write_text(block(PAGE, "accelerate-train"))
    inherited = ("ACCELERATE_", "SLURM_", "TORCHELASTIC_", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    env.update(
        PYTHONPATH=os.pathsep.join([str(HARNESS), str(REPO)]),
        OMP_NUM_THREADS="1",
        HF_HOME=str(workdir / "hf"),  # no accelerate config file of this machine's
        PAGE_TRACE=str(workdir / "trace-rank"),
        **env_extra,
    )
    if kill_at is not None:
        env["PAGE_KILL_AT"] = str(kill_at)
    command = [*launch, "train.py"] if launch else [sys.executable, "train.py"]
    return subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=240
    )


def _trace(workdir: Path, rank: int = 0) -> dict[int, str]:
    """Each step's batch; a step run twice (before the stop and after the resume) keeps its
    last run."""
    lines = (workdir / f"trace-rank{rank}").read_text().splitlines()
    return {int(line.split()[0]): line for line in lines}


def _final_files(workdir: Path) -> dict[str, object]:
    """The files, sizes and checksums of the newest checkpoint (the highest step)."""
    manifests = (workdir / "runs" / "acc" / "checkpoints").glob("checkpoint_*/step-*/manifest.json")
    newest = max((json.loads(m.read_text()) for m in manifests), key=lambda m: m["step"])
    return {"step": newest["step"], "files": newest["files"]}


def _stopped_and_resumed(workdir: Path, *launch: str, kill_at: int, **env: str) -> int:
    """Stop the run after step ``kill_at``, resume it with the same command; the step it
    stopped at."""
    stopped = _run(workdir, *launch, kill_at=kill_at, **env)
    # Before 1.16 the torchrun launcher exits 1 on a SIGTERM (its processes still exit 143).
    exits_143 = not launch or Version(accelerate.__version__) >= Version("1.16")
    assert stopped.returncode == (143 if exits_143 else 1), stopped.stderr[-3000:]
    said = re.findall(
        r"^preempted: checkpointed step (\d+) \S+ s after the notice \(SIGTERM\) in "
        r"\S+/runs/acc/checkpoints; exiting with 143$",
        stopped.stderr,
        re.M,
    )
    processes = 2 if launch else 1
    assert len(said) == processes and len(set(said)) == 1, stopped.stderr[-3000:]
    step = int(said[0])
    assert step == kill_at, "at the step boundary after the notice"
    resumed = _run(workdir, *launch, **env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f" at step {step}\n" in resumed.stderr, resumed.stderr[-3000:]
    assert resumed.stderr.count("preemptible: resuming from ") == 1, "the main process says it"
    return step


def test_page_script_one_process_sigterm_mid_epoch_resumes_bitwise(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    reference = tmp_path_factory.mktemp("one-uninterrupted")
    done = _run(reference)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(_trace(reference)) == 3 * STEPS_PER_EPOCH

    workdir = tmp_path_factory.mktemp("one-stopped")
    _stopped_and_resumed(workdir, kill_at=STEPS_PER_EPOCH + 9)
    assert _trace(workdir) == _trace(reference), "a step read another batch"
    assert _final_files(workdir) == _final_files(reference)


def test_page_script_two_cpu_processes_as_the_table_says_resume_bitwise(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    steps = STEPS_PER_EPOCH // 2
    reference = tmp_path_factory.mktemp("two-uninterrupted")
    done = _run(reference, *TWO_CPU_PROCESSES, ACCELERATE_USE_CPU="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [len(_trace(reference, r)) for r in (0, 1)] == [3 * steps, 3 * steps]

    workdir = tmp_path_factory.mktemp("two-stopped")
    _stopped_and_resumed(workdir, *TWO_CPU_PROCESSES, kill_at=steps + 5, ACCELERATE_USE_CPU="1")
    for rank in (0, 1):
        assert _trace(workdir, rank) == _trace(reference, rank), f"process {rank}"
    assert _final_files(workdir) == _final_files(reference)


def test_two_processes_that_each_run_alone_are_refused_with_the_command_to_run(
    tmp_path: Path,
) -> None:
    """Without ACCELERATE_USE_CPU on a machine without GPUs, ``--multi_gpu`` starts two
    processes whose Accelerators each run alone: refused before either trains or saves."""
    refused = _run(tmp_path, *TWO_CPU_PROCESSES)
    assert refused.returncode != 0
    assert refused.stderr.count("this process was started as one of 2 (WORLD_SIZE=2)") == 2
    assert "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2" in refused.stderr
    assert not (tmp_path / "runs" / "acc" / "checkpoints").exists(), "nothing was saved"
