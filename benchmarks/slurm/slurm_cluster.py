"""A one-node SLURM for benchmarks/queue_service.py: start, fill, submit, crash, recover.

The cluster is the one `integrations/slurm/local/start.sh` makes with the policy in
`partitions.conf` (next to this file): munged, slurmctld and slurmd as root, 4 CPUs and 4 fake
GPUs, `StateSaveLocation=/var/spool/slurmctld`; `stop.sh` cancels every job and stops the
daemons.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCAL = HERE.parents[1] / "integrations" / "slurm" / "local"


def sh(*argv: str, timeout: float = 60, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def missing() -> str | None:
    """Why the SLURM side cannot run here, or None."""
    if not all(shutil.which(b) for b in ("sbatch", "squeue", "scontrol", "slurmctld", "slurmd")):
        return "SLURM is not installed (apt-get install slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "the one-node SLURM is started as root (integrations/slurm/local/start.sh)"
    if up():
        return "a SLURM controller is already running; stop it first (this starts its own)"
    return None


def up() -> bool:
    try:
        return "UP" in sh("scontrol", "ping", timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False


def start() -> None:
    sh(str(LOCAL / "start.sh"), str(HERE / "partitions.conf"), timeout=300)


def stop() -> None:
    sh(str(LOCAL / "stop.sh"), timeout=180, check=False)


def controller_pid() -> int:
    return int(Path("/run/slurmctld.pid").read_text())


def sbatch_submit(workdir: Path) -> Callable[[int], str]:
    argv = ["sbatch", "--parsable", "-p", "batch", "-c", "1", "-o", "/dev/null"]

    def submit(i: int) -> str:
        done = subprocess.run(
            [*argv, "-J", f"b{i}", "--wrap", "true"], capture_output=True, text=True, cwd=workdir
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip()[:150])
        return done.stdout.strip().split(";")[0]

    return submit


def blocked() -> None:
    """A fresh controller (`slurmctld -c`) whose node is held by a `sleep` job."""
    stop()
    start()
    blocker = sh(
        "sbatch", "--parsable", "-p", "batch", "-c", "4", "--gres=gpu:4", "-o", "/dev/null",
        "--wrap", "sleep 3600",
    ).strip()  # fmt: skip
    deadline = time.monotonic() + 30
    while sh("squeue", "-h", "-j", blocker, "-o", "%T").strip() != "RUNNING":
        if time.monotonic() > deadline:
            raise RuntimeError("the SLURM blocker job never ran")
        time.sleep(0.2)


def crash_and_recover() -> set[str]:
    """SIGKILL slurmctld, start it again on its StateSaveLocation: the job ids it knows."""
    pid = controller_pid()
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    subprocess.run(["/usr/sbin/slurmctld"], check=True, timeout=60)
    deadline = time.monotonic() + 60
    while not up():
        if time.monotonic() > deadline:
            raise RuntimeError("slurmctld did not come back after SIGKILL")
        time.sleep(0.2)
    return set(sh("squeue", "-h", "--states=all", "-o", "%i").split())
