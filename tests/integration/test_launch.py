"""`preemptible launch` with real processes: translation, forwarding, exit codes, --kill-after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_signals_real import alive, expect_line, wait_gone

SCRIPTS = Path(__file__).parent / "scripts"
TORCHRUN = Path(sys.executable).parent / "torchrun"
TIMEOUT = 60


def launch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "preemptible", "launch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def launch_recorder(tmp_path: Path, mode: str, *options: str) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / "signals.txt"
    proc = launch(
        *options, "--", sys.executable, str(SCRIPTS / "record_signals.py"), str(out), mode
    )
    expect_line(proc, "ready")
    return proc, out


def received(out: Path) -> list[str]:
    return out.read_text().split() if out.exists() else []


def test_sigusr1_reaches_the_child_as_sigterm(tmp_path):
    proc, out = launch_recorder(tmp_path, "exit85")
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert received(out) == ["SIGTERM"]
    assert proc.returncode == 85, err  # the child's own exit code, e.g. SLURM's RequeueExit


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name
)
def test_sigterm_sigint_and_sighup_are_forwarded_unchanged(tmp_path, sig):
    proc, out = launch_recorder(tmp_path, "exit85")
    proc.send_signal(sig)
    proc.communicate(timeout=TIMEOUT)
    assert received(out) == [sig.name]


def test_sigusr2_is_translated_only_with_the_option(tmp_path):
    proc, out = launch_recorder(tmp_path, "exit85", "--translate-usr2")
    proc.send_signal(signal.SIGUSR2)
    proc.communicate(timeout=TIMEOUT)
    assert received(out) == ["SIGTERM"]


def test_a_child_killed_by_a_signal_gives_128_plus_signum(tmp_path):
    proc, out = launch_recorder(tmp_path, "die")
    proc.send_signal(signal.SIGUSR1)
    proc.communicate(timeout=TIMEOUT)
    assert received(out) == ["SIGTERM"]
    assert proc.returncode == 143


def test_the_child_has_its_own_process_group_and_knows_the_launcher(tmp_path):
    proc, out = launch_recorder(tmp_path, "exit85")
    info = json.loads(Path(f"{out}.json").read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=TIMEOUT)
    assert info["pgid"] == info["pid"] != os.getpgid(0)
    assert info["launch_pid"] == str(proc.pid)
    assert info["translates"] == "SIGUSR1"


def test_kill_after_sigkills_the_whole_group_when_the_child_ignores_the_notice(tmp_path):
    proc, out = launch_recorder(tmp_path, "ignore", "--kill-after", "0.5")
    grandchild = json.loads(Path(f"{out}.json").read_text())["grandchild"]
    started = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    proc.communicate(timeout=TIMEOUT)
    assert received(out) == ["SIGTERM"]
    assert proc.returncode == 137
    assert 0.4 < time.monotonic() - started < 10
    wait_gone([grandchild], 5)  # the group, not just the child


def test_without_kill_after_a_child_ignoring_the_notice_keeps_running(tmp_path):
    proc, out = launch_recorder(tmp_path, "ignore")
    info = json.loads(Path(f"{out}.json").read_text())
    proc.send_signal(signal.SIGUSR1)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)
    assert alive(info["pid"])
    os.killpg(info["pgid"], signal.SIGKILL)
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 137


@pytest.mark.parametrize("code", [0, 7])
def test_the_childs_exit_code_is_passed_through(code):
    proc = launch("--", sys.executable, "-c", f"raise SystemExit({code})")
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == code


def test_a_missing_program_exits_127_with_a_one_line_error():
    proc = launch("--", "no-such-program-xyz")
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 127
    assert "no-such-program-xyz" in err and "Traceback" not in err


def test_options_after_the_command_belong_to_the_command():
    proc = launch(sys.executable, "-c", "import sys; print(sys.argv[1:])", "--kill-after", "x")
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert out.strip() == "['--kill-after', 'x']"


def test_a_guarded_loop_under_launch_saves_on_sigusr1(tmp_path):
    marker = tmp_path / "saved.json"
    proc = launch("--", sys.executable, str(SCRIPTS / "guarded_loop.py"), str(marker))
    expect_line(proc, "ready")
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 143, err
    assert json.loads(marker.read_text())["signal"] == "SIGTERM"


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")
def test_sigusr1_to_launch_reaches_a_torchrun_worker_as_sigterm(tmp_path):
    # torchrun alone dies of SIGUSR1 and orphans the worker (measured;
    # `docs/user-guide/preemption.md`).
    marker = tmp_path / "saved.json"
    proc = launch(
        "--",
        str(TORCHRUN),
        "--standalone",
        "--nproc-per-node=1",
        str(SCRIPTS / "guarded_loop.py"),
        str(marker),
    )
    expect_line(proc, "ready")
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=TIMEOUT)
    record = json.loads(marker.read_text())
    assert record["signal"] == "SIGTERM" and record["started"] == record["completed"]
    assert proc.returncode == 1, err  # torchrun's own status after a forwarded signal


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM])
def test_an_uncatchable_or_forwarded_signal_cannot_be_translated_and_no_handler_is_left(sig):
    from preemptible.errors import ConfigError
    from preemptible.runtime.launch import launch

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ConfigError, match=f"cannot translate {sig.name}"):
        launch(["true"], translate=[sig])
    assert signal.getsignal(signal.SIGTERM) is before


ABANDONING_PARENT = """
import subprocess, sys
ignoring = "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", ignoring], start_new_session=True)
print(child.pid, flush=True)
raise SystemExit(3)  # leaves without it, as torchrun does on a third SIGTERM
"""


def test_a_process_that_outlives_the_command_is_adopted_and_ended(tmp_path):
    # Under SLURM's proctrack/linuxproc such an orphan escaped the job
    # (`docs/user-guide/schedulers.md`).
    proc = launch("--kill-after", "1", "--", sys.executable, "-c", ABANDONING_PARENT)
    orphan = int(proc.stdout.readline())
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 3  # the command's status, not the orphan's
    assert f"process {orphan} outlived the command" in err
    wait_gone([orphan], 1)  # gone before the launcher exited


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed")
def test_torchrun_workers_left_behind_by_a_third_sigterm_do_not_outlive_launch(tmp_path):
    out = tmp_path / "signals.txt"
    proc = launch(
        "--kill-after", "6", "--",
        str(TORCHRUN), "--standalone", "--nproc-per-node=1",
        str(SCRIPTS / "record_signals.py"), str(out), "ignore",
    )  # fmt: skip
    expect_line(proc, "ready")
    info = json.loads(Path(f"{out}.json").read_text())
    for _ in range(3):  # SLURM signals a step again at the end of its grace
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert "SIGTERM" in received(out)  # the worker had its notice
    assert f"process {info['pid']} outlived the command" in err, err
    wait_gone([info["pid"], info["grandchild"]], 1)
