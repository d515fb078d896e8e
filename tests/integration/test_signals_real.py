"""Real signals to real processes: a guarded loop saves at the step boundary; DataLoader workers
survive the SIGTERM meant for the trainer only when protected."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.polling import wait_until

SCRIPTS = Path(__file__).parent / "scripts"
TIMEOUT = 60


def start(*args: str) -> subprocess.Popen[str]:
    """Start a script in its own process group (so killpg never reaches pytest)."""
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )


def expect_line(proc: subprocess.Popen[str], expected: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != expected:
        proc.kill()
        _, err = proc.communicate(timeout=TIMEOUT)
        pytest.fail(f"expected {expected!r} from the child, got {line!r}; stderr:\n{err}")


def alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float) -> None:
    """Until none of `pids` is alive; fails naming those that still are."""
    wait_until(
        lambda: not any(alive(p) for p in pids),
        f"processes {pids} to exit",
        timeout=timeout,
        describe=lambda: f"still alive: {[p for p in pids if alive(p)]}",
    )


# --- a guarded loop without torch --------------------------------------------------------------


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT], ids=["term", "usr1", "int"]
)
def test_a_signalled_loop_finishes_its_step_saves_and_exits_with_128_plus_signum(tmp_path, sig):
    marker = tmp_path / "saved.json"
    proc = start(str(SCRIPTS / "guarded_loop.py"), str(marker))
    expect_line(proc, "ready")
    time.sleep(0.12)  # let it get into a step; where exactly does not matter
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + sig, err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err
    record = json.loads(marker.read_text())
    assert record["signal"] == sig.name and record["count"] == 1
    assert record["started"] == record["completed"]  # the step in progress was finished
    assert record["last_step_started_at"] <= record["received_at"]  # and no new one began


def test_a_second_sigterm_during_the_final_save_does_not_abort_it(tmp_path):
    marker = tmp_path / "saved.json"
    proc = start(str(SCRIPTS / "guarded_loop.py"), str(marker), "0.5")
    expect_line(proc, "ready")
    os.kill(proc.pid, signal.SIGTERM)
    expect_line(proc, "saving")
    os.kill(proc.pid, signal.SIGTERM)  # SLURM and torchrun both repeat SIGTERM
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 143, err
    record = json.loads(marker.read_text())
    assert record["count"] == 3 and record["signal"] == "SIGTERM"


# --- DataLoader workers and a SIGTERM to the whole process group -------------------------------


def run_dataloader_loop(
    tmp_path: Path, mode: str, context: str = "spawn"
) -> tuple[subprocess.Popen[str], str, list[int]]:
    proc = start(str(SCRIPTS / "dataloader_loop.py"), str(tmp_path), mode, context)
    expect_line(proc, "ready")
    workers = [int((tmp_path / f"worker-{i}").read_text()) for i in range(2)]
    os.killpg(proc.pid, signal.SIGTERM)  # what the queue manager and torchrun do
    _, err = proc.communicate(timeout=TIMEOUT)
    return proc, err, workers


@pytest.mark.parametrize("context", ["spawn", "forkserver", "fork"])
def test_protected_dataloader_workers_survive_a_group_sigterm_until_the_final_save(
    tmp_path, context
):
    proc, err, workers = run_dataloader_loop(tmp_path, "protect", context)
    assert proc.returncode == 143, err
    assert json.loads((tmp_path / "saved.json").read_text())["step"] >= 3
    wait_gone(workers, 15)  # and they do not outlive the trainer


def test_unprotected_dataloader_workers_die_of_the_group_sigterm_and_the_save_is_lost(tmp_path):
    proc, err, _ = run_dataloader_loop(tmp_path, "plain")
    assert proc.returncode != 143
    assert not (tmp_path / "saved.json").exists()
    assert "DataLoader worker" in err  # torch's SIGCHLD handler raised in the trainer


def test_protected_workers_still_exit_when_the_trainer_is_killed(tmp_path):
    # fork: the quickest to start; the parent watchdog is the same for every start method
    proc = start(str(SCRIPTS / "dataloader_loop.py"), str(tmp_path), "protect", "fork")
    expect_line(proc, "ready")
    workers = [int((tmp_path / f"worker-{i}").read_text()) for i in range(2)]
    proc.kill()  # SIGKILL to the trainer alone: no shutdown of the loader
    proc.communicate(timeout=TIMEOUT)
    wait_gone(workers, 15)  # the DataLoader's parent watchdog ends them
