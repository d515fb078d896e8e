"""SLURM for real: one node (Debian's slurmctld and slurmd, munge) started by the test set-up.

The cluster's policy is `preemptible queue export --to slurm tests/data/slurm_queue.toml`; the
jobs are `integrations/slurm/train.sbatch` running `scripts/queue_train.py` (`@preemptible`).
A low-tier job is preempted by a high-tier one, checkpoints within GraceTime, is requeued,
resumes and ends bitwise equal to an uninterrupted run; a job near its time limit checkpoints
and requeues itself. Needs root (the daemons run as root) and installs the packages with apt
when they are missing: it runs in `make test`, never skips.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from preemptible.runtime.deadline import parse_scontrol_record
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "integrations" / "slurm" / "local"
SBATCH = ROOT / "integrations" / "slurm" / "train.sbatch"
TRAIN = Path(__file__).parent / "scripts" / "queue_train.py"
QUEUE = ROOT / "tests" / "data" / "slurm_queue.toml"
GRACE_TIME_S = 20  # grace_max of slurm_queue.toml: GraceTime of the tier partitions
REQUEUED = "requeueing to resume from the last checkpoint (exit 85)"  # train.sbatch, exit 143


def sh(*argv: str | Path, timeout: float = 60) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A one-node SLURM with the exported policy; yields a directory every job may write."""
    if os.geteuid() != 0:
        pytest.fail("the SLURM test starts slurmctld and slurmd as root: run it as root")
    work = tmp_path_factory.mktemp("slurm")
    work.chmod(0o777)
    cli = Path(sys.executable).with_name("preemptible")
    sh(cli, "queue", "export", "--to", "slurm", QUEUE, "-o", work / "policy")
    sh(LOCAL / "stop.sh", timeout=180)
    sh(LOCAL / "start.sh", work / "policy" / "slurm.conf", timeout=600)
    try:
        yield work
    finally:
        sh(LOCAL / "stop.sh", timeout=180)


def job(job_id: str) -> dict[str, str]:
    return parse_scontrol_record(sh("scontrol", "show", "job", "-o", job_id))


def finished(job_id: str) -> bool:
    return job(job_id)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def wait_finished(job_id: str, what: str, timeout: float) -> None:
    """Until SLURM says the job has ended; its record if it has not."""
    wait_until(
        lambda: finished(job_id), what, timeout=timeout, every=0.25, describe=lambda: job(job_id)
    )


def submit_training(
    work: Path, name: str, *, sbatch_args: list[str], train_args: list[str], env: dict[str, str]
) -> str:
    run = work / name
    run.mkdir()
    argv = [
        "sbatch", "--parsable", f"--output={run}/job.out", f"--chdir={run}", *sbatch_args,
        str(SBATCH), sys.executable, str(TRAIN), str(run / "ckpt"), str(run / "weights.pt"),
        *train_args,
    ]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def train_on_slurm(
    cluster: Path,
    tmp_path: Path,
    name: str,
    *,
    total: int,
    every: int,
    step_s: float,
    sbatch_args: list[str],
    env: dict[str, str] | None = None,
) -> tuple[str, Path, dict[str, torch.Tensor]]:
    """Submit `scripts/queue_train.py` through train.sbatch: the job id, its folder, and the
    weights an uninterrupted run of the same training ends with."""
    train_args = ["--total", str(total), "--every", str(every)]
    expected = reference(tmp_path, train_args)
    job_id = submit_training(
        cluster,
        name,
        sbatch_args=sbatch_args,
        train_args=[*train_args, "--step-s", str(step_s)],
        env=env or {},
    )
    return job_id, cluster / name, expected


def assert_bitwise_equal(run: Path, expected: dict[str, torch.Tensor]) -> None:
    final = torch.load(run / "weights.pt", weights_only=True)
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected), "the weights differ"


def reference(tmp_path: Path, train_args: list[str]) -> dict[str, torch.Tensor]:
    """The same training without SLURM and without interruption (no sleeping: same numbers)."""
    out = tmp_path / "reference.pt"
    args = [sys.executable, str(TRAIN), str(tmp_path / "ref-ckpt"), str(out), *train_args]
    subprocess.run([*args, "--step-s", "0"], check=True, timeout=120, env=_clean_env())
    return torch.load(out, weights_only=True)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}


def attempts(run: Path) -> dict[int, list[int]]:
    """The steps each run of the job executed."""
    runs: dict[int, list[int]] = {}
    for line in (run / "weights.pt.steps").read_text().split("\n"):
        if line:
            attempt, step = map(int, line.split())
            runs.setdefault(attempt, []).append(step)
    return runs


def assert_resumed_without_redoing_a_step(run: Path, total: int, restarts: int) -> None:
    """Every run of the job started, and together they executed each step once, in order.

    A run may execute no step: a notice that comes while it starts (SLURM checks time-limit
    warnings every 30 s) stops it before its first, and it resumes where it would have begun;
    a notice that comes after the last step, before the run exits, leaves the next run nothing
    to do.
    """
    log = (run / "job.out").read_text()
    started = [int(n) for n in re.findall(r" run (\d+) starts: ", log)]
    assert started == list(range(restarts + 1)), log
    runs = attempts(run)
    assert set(runs) <= set(started), (runs.keys(), log)
    executed = [step for attempt in sorted(runs) for step in runs[attempt]]
    assert executed == list(range(total)), "a step was redone or skipped across the requeues"


def test_a_preempted_job_checkpoints_in_its_grace_is_requeued_and_ends_bitwise_equal(
    cluster: Path, tmp_path: Path
) -> None:
    low, run, expected = train_on_slurm(
        cluster, tmp_path, "preempted", total=160, every=25, step_s=0.05,
        sbatch_args=["--partition=low", "--cpus-per-task=2", "--gres=gpu:4"],
    )  # fmt: skip
    wait_until(lambda: (run / "weights.pt.steps").exists(), "the low job's first steps", timeout=60)
    time.sleep(1.0)
    high = sh(
        "sbatch", "--parsable", "--partition=high", "--cpus-per-task=2", "--gres=gpu:4",
        f"--output={cluster}/high.out", "--wrap", "sleep 2",
    ).strip()  # fmt: skip
    wait_finished(high, "the high job", 120)
    wait_finished(low, "the low job", 180)

    record, log = job(low), (run / "job.out").read_text()
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", log
    assert "SIGUSR1, passing SIGTERM to its steps" in log  # preempt_send_user_signal
    assert REQUEUED in log  # RequeueExit, not the end of the grace
    saved = re.search(r"checkpointed step (\d+) ([\d.]+) s after the notice", log)
    assert saved is not None, log
    stopped_at, after_notice_s = int(saved.group(1)), float(saved.group(2))
    assert after_notice_s < GRACE_TIME_S
    assert attempts(run)[0][-1] == stopped_at  # the run ended on the step it checkpointed
    assert job(high)["JobState"] == "COMPLETED"
    assert_resumed_without_redoing_a_step(run, total=160, restarts=1)

    assert_bitwise_equal(run, expected)

    # The job advertised its measured cost in its comment (the slurm reporter).
    comment = sh("squeue", "-h", "--states=all", "-j", low, "-o", "%k").strip()
    values = dict(part.split("=", 1) for part in comment.split()[1:])
    assert comment.startswith("preemptible ") and float(values["save_p95_s"]) > 0, comment
    assert float(values["restore_s"]) > 0  # reported by the resumed run, after its restore
    assert int(values["bytes"]) > 0


def test_a_job_near_its_time_limit_checkpoints_and_requeues_itself(
    cluster: Path, tmp_path: Path
) -> None:
    # --time=1 (minute) and a 59 s lead: SLURM checks for due warnings every 30 s, so SIGUSR1 comes
    # 1 to 31 s into each run, before the 40 s of work end.
    job_id, run, expected = train_on_slurm(
        cluster, tmp_path, "time-limit", total=400, every=50, step_s=0.1,
        sbatch_args=["--partition=low", "--time=1", "--cpus-per-task=1"],
        env={"SBATCH_SIGNAL": "B:USR1@59"},
    )  # fmt: skip
    wait_finished(job_id, "the time-limited job", 400)

    record, log = job(job_id), (run / "job.out").read_text()
    restarts = int(record["Restarts"])
    assert record["JobState"] == "COMPLETED" and restarts >= 1, log
    assert log.count("SIGUSR1, passing SIGTERM to its steps") >= restarts
    assert log.count(REQUEUED) == restarts
    assert_resumed_without_redoing_a_step(run, total=400, restarts=restarts)
    assert_bitwise_equal(run, expected)


def test_a_job_reads_its_grace_from_the_partition_and_its_signal(cluster: Path) -> None:
    probe = (
        "from preemptible.runtime.deadline import GraceCheck, discover_grace; import os; "
        "g = discover_grace(os.environ); print(g.seconds, g.source); "
        "print(GraceCheck()(g, 30.0, measured='a probe'))"
    )
    out = cluster / "probe.out"
    job_id = sh(
        "sbatch", "--parsable", "--partition=low", f"--output={out}",
        "--wrap", f"{shutil.which('env')} {sys.executable} -c \"{probe}\"",
    ).strip()  # fmt: skip
    wait_finished(job_id, "the probe job", 60)
    text = out.read_text()
    assert text.splitlines()[0] == f"{GRACE_TIME_S:.1f} slurm", text
    assert "GraceTime=45 on partition low" in text  # 1.5 x 30 s, in SLURM's words


def test_a_sigterm_to_the_steps_only_is_heard_and_the_job_requeued(cluster: Path, tmp_path: Path):
    # Without preempt_send_user_signal, preemption sends SIGTERM at the start of GraceTime to the
    # job's steps and not to the batch shell; `scancel --signal=TERM` delivers exactly that.
    job_id, run, expected = train_on_slurm(
        cluster, tmp_path, "steps-only", total=120, every=40, step_s=0.05,
        sbatch_args=["--partition=low", "--cpus-per-task=1"],
    )  # fmt: skip
    wait_until(lambda: (run / "weights.pt.steps").exists(), "the job's first steps", timeout=60)
    sh("scancel", "--signal=TERM", job_id)
    wait_finished(job_id, "the job", 180)

    record, log = job(job_id), (run / "job.out").read_text()
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", log
    assert "passing SIGTERM" not in log  # the batch shell heard nothing
    assert REQUEUED in log
    assert_resumed_without_redoing_a_step(run, total=120, restarts=1)
    assert_bitwise_equal(run, expected)


def test_the_sbatch_example_runs_as_its_comment_says(cluster: Path) -> None:
    out = cluster / "example.out"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "CKPT_DIR": str(cluster / "example-ckpt"),
        "STEPS": "150",
        "STEP_SECONDS": "0.05",
    }
    done = subprocess.run(
        ["sbatch", "--parsable", "--partition=low", f"--output={out}",
         str(ROOT / "examples" / "slurm_plain_pytorch.sbatch")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    wait_until(
        lambda: out.exists() and "step 20 " in out.read_text(), "the example's step 20", timeout=90
    )
    sh("scancel", "--signal=TERM", job_id)  # what a preemption sends its steps
    wait_finished(job_id, "the example", 180)

    record, log = job(job_id), out.read_text()
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", log
    saved = re.search(r"checkpointed step (\d+) ", log)
    assert saved is not None and REQUEUED in log, log
    steps = [int(s) for s in re.findall(r"^step (\d+) loss", log, re.MULTILINE)]
    assert steps == list(range(150)), "every step once: resumed right after the checkpoint"
    assert "run 1 starts" in log and "final loss" in log
