"""Faults, one at a time, each where it hurts: the manager killed at each named moment of a job's
life, its state folder full or read-only. docs/user-guide/reliability.md lists the promises.

The kills are real (SIGKILL, from the manager itself at a crash point of
`preemptible.queue.service.crash_points`); the jobs are `scripts/queue_train.py`, which train
under `@preemptible`, report their cost, save on the notice, ack and resume. After each fault and
a restart: every acknowledged job is there and completes, no two attempts of a job ran at once,
no step was skipped, every checkpoint on disk verifies, and a fault that is the user's to fix is
named in one clear line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from preemptible.checkpoint import CheckpointReader
from preemptible.queue.service.crash_points import POINTS

from .queue_server import CLI, Server, free_port, ready, submit, wait_for

SCRIPT = Path(__file__).parent / "scripts" / "queue_train.py"
TOKENS = {"T_ADMIN": "admin-secret", "T_LAB": "lab-secret", "T_GUEST": "guest-secret"}
CONFIG = """
[cluster]
gpus = 2

[preemption]
grace_min = "10s"
grace_max = "20s"
min_runtime = "0s"
cooldown = "0s"

[service]
admin_token = "env:T_ADMIN"

[[queues]]
name = "lab"
nominal = { gpus = 2 }
token = "env:T_LAB"

[[queues]]
name = "guest"
nominal = { gpus = 0 }
borrowing_limit = { gpus = 2 }
token = "env:T_GUEST"
"""
TOTAL = 30


class CrashingServer(Server):
    """A server that kills itself at the crash point `at` (then runs normally once restarted)."""

    def __init__(self, tmp: Path, at: str):
        super().__init__(tmp, CONFIG, TOKENS)
        self.at = at

    def start_armed(self) -> None:
        self.tokens = {**TOKENS, "PREEMPTIBLE_CRASH_AT": self.at}
        try:
            self.start()
        finally:
            self.tokens = dict(TOKENS)

    def died(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)


def train(tmp_path: Path, name: str) -> list[str]:
    out = tmp_path / f"{name}.pt"
    options = ["--total", str(TOTAL), "--step-s", "0.05", "--every", "5"]
    return [sys.executable, str(SCRIPT), str(tmp_path / f"{name}-ckpt"), str(out), *options]


def attempts_in_order(out: Path) -> list[tuple[int, int]]:
    """(attempt, step) in the order the steps ran (appended to one file by every attempt)."""
    lines = Path(f"{out}.steps").read_text().split("\n")
    return [(int(a), int(s)) for a, s in (line.split() for line in lines if line)]


def check_the_job_ran_whole_and_never_twice(tmp_path: Path, name: str) -> None:
    ran = attempts_in_order(tmp_path / f"{name}.pt")
    attempts = [a for a, _ in ran]
    assert attempts == sorted(attempts), f"two attempts of {name} ran at once: {ran}"
    steps = {s for _, s in ran}
    assert steps == set(range(TOTAL)), f"{name} skipped steps: {sorted(set(range(TOTAL)) - steps)}"
    reader = CheckpointReader(tmp_path / f"{name}-ckpt")
    for info in reader.list():
        assert reader.verify(info.step).ok, f"{name}'s checkpoint {info.step} is torn"
    assert (tmp_path / f"{name}.pt").exists()  # the final weights were written


@pytest.mark.parametrize("at", sorted(POINTS))
def test_a_manager_killed_at_each_moment_loses_nothing_and_runs_nothing_twice(tmp_path, at):
    server = CrashingServer(tmp_path, at)
    server.start_armed()
    acknowledged: list[str] = []
    with server.client("admin-secret") as admin:
        try:
            borrower = submit(admin, "guest", train(tmp_path, "borrower"), gpus=2, tier="low")
            acknowledged.append(borrower["id"])
            if at in ("noticed", "acked"):  # a reclaim: notice, save, ack, requeue
                ready(admin, borrower["id"])
                owner = submit(admin, "lab", train(tmp_path, "owner"), gpus=2, tier="high")
                acknowledged.append(owner["id"])
        except httpx.HTTPError:
            pass  # the crash came before the answer: that job was never acknowledged
    assert server.died() == -9, f"the manager never reached {at!r}: {server.log()}"

    server.start()  # not armed
    try:
        with server.client("admin-secret") as admin:
            jobs = {job["id"]: job for job in admin.get("/v1/jobs").json()}
            assert set(acknowledged) <= set(jobs), f"acknowledged jobs lost: {jobs}"
            for job_id in jobs:
                done = wait_for(admin, job_id, {"completed", "failed", "cancelled"}, timeout=120)
                assert done["state"] == "completed", (done, server.log())
        for job in jobs.values():
            check_the_job_ran_whole_and_never_twice(
                tmp_path, "borrower" if job["queue"] == "guest" else "owner"
            )
    finally:
        server.stop()


def test_a_full_state_disk_refuses_submissions_clearly_and_loses_none(tmp_path, tiny_disk):
    (tiny_disk / "state").mkdir()
    (tmp_path / "state").symlink_to(tiny_disk / "state")  # the state folder on a 4 MiB tmpfs
    server = Server(tmp_path, CONFIG, TOKENS)
    server.start()
    try:
        with server.client("admin-secret") as admin:
            before = submit(admin, "lab", [sys.executable, "-c", "print('before')"])
            wait_for(admin, before["id"], {"completed"})
            fill(tiny_disk / "filler")
            refused = admin.post("/v1/jobs", json={"queue": "lab", "command": ["true"]})
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "state_unwritable" and "free space" in error["message"]
            assert [j["id"] for j in admin.get("/v1/jobs").json()] == [before["id"]]
            (tiny_disk / "filler").unlink()
            after = submit(admin, "lab", [sys.executable, "-c", "print('after')"])
            wait_for(admin, after["id"], {"completed"})
        server.stop()
        server.start()
        with server.client("admin-secret") as admin:
            jobs = {j["id"]: j["state"] for j in admin.get("/v1/jobs").json()}
        assert jobs == {before["id"]: "completed", after["id"]: "completed"}
    finally:
        server.stop()


def test_a_read_only_state_folder_stops_the_server_in_one_clear_line(tmp_path, tiny_disk):
    (tiny_disk / "state").mkdir()
    (tmp_path / "state").symlink_to(tiny_disk / "state")
    server = Server(tmp_path, CONFIG, TOKENS)
    server.start()
    with server.client("admin-secret") as admin:
        kept = submit(admin, "lab", [sys.executable, "-c", "print('kept')"])
        wait_for(admin, kept["id"], {"completed"})
    server.stop()
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    try:
        args = ["--config", str(tmp_path / "queue.toml"), "--state", str(tmp_path / "state")]
        done = subprocess.run(
            [*CLI, "queue", "serve", *args, "--port", str(free_port()), "--allow-jobs-as-root"],
            env={**os.environ, **TOKENS},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_disk)], check=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "make it writable" in lines[0], done.stderr
    server.start()  # writable again: nothing was lost
    try:
        with server.client("admin-secret") as admin:
            assert admin.get(f"/v1/jobs/{kept['id']}").json()["state"] == "completed"
    finally:
        server.stop()


def fill(path: Path) -> None:
    """Write zeros to `path` until the disk is full (ENOSPC from the kernel)."""
    with open(path, "wb") as f:
        block = b"\0" * 65536
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass
