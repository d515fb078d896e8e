"""The examples run as their opening comments say: started, preempted for real, resumed.

Each way in has one example; the others are run by their own tests: `plain_pytorch.py`
(test_exact_resume.py), `torchrun_elastic.py` (test_torchrun.py), `accelerate_train.py`
(test_accelerate.py), the SLURM and Kubernetes files of `integrations/` (test_slurm.py,
test_sidecar.py, tests/unit/runtime/test_k8s_manifests.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.test_torchrun import Output

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PREEMPTIBLE_"))}
    return {**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def test_the_lightning_example_saves_on_sigterm_and_the_same_command_resumes(tmp_path):
    argv = [sys.executable, str(EXAMPLES / "lightning_train.py"), "--dir", str(tmp_path / "run")]
    first = subprocess.Popen(
        [*argv, "--epochs", "2", "--batch-seconds", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=REPO,
        start_new_session=True,  # its own group, killed by Output if it fails
    )
    output = Output(first)
    output.until(r"^epoch 0 batch 8 ")
    first.send_signal(signal.SIGTERM)
    code, out = output.finish(timeout=60)
    assert code == 143, out
    assert (tmp_path / "run" / "preempted.ckpt").is_dir()

    second = subprocess.run(
        [*argv, "--epochs", "2"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=120
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming from {tmp_path / 'run' / 'preempted.ckpt'}" in second.stdout
    assert "epoch 0 batch 0 " not in second.stdout  # mid-epoch: not from the epoch's start
    assert "done: global step 32," in second.stdout  # 2 epochs of 16 batches, none twice


def test_the_lightning_example_run_again_after_it_finished_says_so_and_exits_0(tmp_path):
    argv = [sys.executable, str(EXAMPLES / "lightning_train.py"), "--dir", str(tmp_path / "run")]
    runs = [
        subprocess.run(
            [*argv, "--epochs", "1"],
            capture_output=True,
            text=True,
            env=_env(),
            cwd=REPO,
            timeout=120,
        )
        for _ in range(2)
    ]
    first, again = runs
    assert first.returncode == 0 and "done: global step 16," in first.stdout, first.stderr
    assert again.returncode == 0, again.stdout + again.stderr  # was a KeyError on "loss"
    assert "already complete at step 16: the checkpoint at " in again.stderr
    assert "done:" not in again.stdout and "Traceback" not in again.stderr


def test_the_queue_manager_demo_keeps_its_promises():
    # `make demo`: a server, two teams, a reclaim by a shrink, a grow, a bit-exact resume; it
    # checks its own promises and exits 1 if one is broken.
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "queue_demo.py")],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "bit for bit" in done.stdout
    assert "shrunk, not evicted, and grew back: 4 -> 2 GPUs then 2 -> 4 GPUs" in done.stdout
    assert "resized, apart from preemptions: team-b 2" in done.stdout


def test_the_checkpoint_demo_recovers_from_a_torn_save_and_a_flipped_bit(tmp_path):
    # `make demo-checkpoint`; it works in runs/demo under its working directory.
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "checkpoint_demo.py")],
        capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "training can resume at" in done.stdout


def test_the_example_queue_reclaims_borrowed_gpus_within_the_first_minute(tmp_path):
    """getting-started.md's shared box: `examples/queue.toml` as it ships, team B borrowing
    four GPUs of team A's, team A asking for them: B's job is told to go at once, saves, and
    A's job starts within a minute of its submission; B's comes back and resumes."""
    import time

    from tests.integration.queue_server import Server, events, wait_for
    from tests.polling import wait_until

    tokens = {
        "PREEMPTIBLE_ADMIN_TOKEN": "admin-token",
        "TEAM_A_TOKEN": "a-token",
        "TEAM_B_TOKEN": "b-token",
        "TEAM_C_TOKEN": "c-token",
    }
    server = Server(tmp_path, (EXAMPLES / "queue.toml").read_text(), tokens)
    server.start()

    def job(team: str, steps: int) -> list[str]:
        script = str(EXAMPLES / "plain_pytorch.py")
        run = ["--dir", str(tmp_path / f"runs-{team}"), "--steps", str(steps)]
        return [sys.executable, script, *run, "--every", "20", "--step-seconds", "0.05"]

    try:
        with server.client("b-token") as b, server.client("a-token") as a:
            borrower = b.post(
                "/v1/jobs",
                json={"queue": "team-b", "command": job("b", 300), "gpus": 6, "cwd": str(REPO)},
            ).json()
            wait_for(b, borrower["id"], {"running"})
            wait_until(  # it is training (a job told to go before its loop starts cannot save)
                lambda: "step 30 " in b.get(f"/v1/jobs/{borrower['id']}/logs").json()["text"],
                "the borrower's step 30",
                timeout=60,
            )
            asked = time.time()
            owner = a.post(
                "/v1/jobs",
                json={"queue": "team-a", "command": job("a", 40), "gpus": 4, "cwd": str(REPO)},
            ).json()
            started = wait_for(a, owner["id"], {"running", "completed"}, timeout=60)
            assert started["started_at"] - asked < 60, "team A started within the first minute"
            notice = next(e for e in events(b, borrower["id"]) if e["kind"] == "notice")
            assert "reclaim" in notice["reason"], notice
            assert notice["at"] - asked < 10, "reclaimed at once, not after reclaim_within"
            back = wait_for(b, borrower["id"], {"completed", "failed"}, timeout=180)
            params = {"attempt": 2, "limit": 1 << 20}
            again = b.get(f"/v1/jobs/{borrower['id']}/logs", params=params).json()["text"]
    finally:
        server.stop()
    assert back["state"] == "completed" and back["attempts"] == 2, back
    first = re.search(r"^step (\d+) ", again, re.MULTILINE)
    assert first is not None and int(first.group(1)) > 0, "the second attempt resumed"
