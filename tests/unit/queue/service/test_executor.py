"""ProcessExecutor and its runner, with real processes and real signals (Linux: /proc).

Nothing is mocked. Jobs that must be in a known state before a signal reach it tell the test
through a file ("ready"), which the test waits for; the only fixed bound is how long a bystander
must survive a SIGKILL that must not reach it.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from preemptible.errors import QueueError, StateStoreError
from preemptible.queue.service import runner
from preemptible.queue.service.executor import (
    Exit,
    ExitKind,
    LaunchSpec,
    ProcessExecutor,
    ProcessHandle,
)

_T = TypeVar("_T")

PY = sys.executable
WAIT_SECS = 10.0
"""Upper bound for anything to happen; a passing run waits milliseconds."""


def wait_for(probe: Callable[[], _T | None], what: str) -> _T:
    deadline = time.monotonic() + WAIT_SECS
    while (value := probe()) is None or value is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
    return value


def wait_for_file(path: Path) -> None:
    wait_for(lambda: path.exists(), str(path))


def read_pid(path: Path) -> int | None:
    """The pid a job wrote to ``path``, or None until it has written all of it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None


def proc_state(pid: int) -> str | None:
    """The process's state letter (R, S, Z...), or None when the pid is free."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()[0]


def start_ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[19])


class Jobs:
    """Launches attempts in a test's directory and kills whatever is left at the end."""

    def __init__(self, workdir: Path, executor: ProcessExecutor) -> None:
        self.workdir = workdir
        self.executor = executor
        self.started: list[ProcessHandle] = []

    def spec(self, command: list[str], **overrides: Any) -> LaunchSpec:
        fields: dict[str, Any] = {
            "job_id": "j1",
            "attempt": 1,
            "command": command,
            "cwd": str(self.workdir),
            "env": {},
            "gpu_ids": [],
            "log_path": self.workdir / "logs" / "j1.1.log",
            "status_path": self.workdir / "status" / "j1.1.json",
        }
        fields.update(overrides)
        return LaunchSpec(**fields)

    def start(self, command: list[str], **overrides: Any) -> ProcessHandle:
        handle = self.executor.launch(self.spec(command, **overrides))
        self.started.append(handle)
        return handle

    def python(self, code: str, **overrides: Any) -> ProcessHandle:
        return self.start([PY, "-c", code], **overrides)

    def wait_exit(self, handle: ProcessHandle, executor: ProcessExecutor | None = None) -> Exit:
        polling = executor or self.executor
        return wait_for(lambda: polling.poll(handle), f"the exit of pid {handle.pid}")

    def log(self) -> str:
        return (self.workdir / "logs" / "j1.1.log").read_text()


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    jobs = Jobs(tmp_path, ProcessExecutor())
    yield jobs
    for handle in jobs.started:
        jobs.executor.kill(handle)
        jobs.wait_exit(handle)


# --- exit statuses -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, exit_code",
    [
        ([PY, "-c", "pass"], 0),
        ([PY, "-c", "raise SystemExit(3)"], 3),
        (["sh", "-c", "exit 42"], 42),
    ],
    ids=["python-0", "python-3", "shell-42"],
)
def test_exit_code_comes_from_the_status_file(
    jobs: Jobs, command: list[str], exit_code: int
) -> None:
    before = time.time()
    handle = jobs.start(command)

    ended = jobs.wait_exit(handle)

    assert ended.how is ExitKind.EXITED
    assert (ended.exit_code, ended.signal, ended.error) == (exit_code, None, None)
    assert ended.ended_at is not None and before <= ended.ended_at <= time.time()
    assert not jobs.executor.alive(handle)


def test_terminate_ends_a_default_handler_job_with_143(jobs: Jobs) -> None:
    handle = jobs.python("import pathlib, time; pathlib.Path('ready').touch(); time.sleep(60)")
    wait_for_file(jobs.workdir / "ready")

    jobs.executor.terminate(handle)

    ended = jobs.wait_exit(handle)
    assert (ended.how, ended.exit_code, ended.signal) == (ExitKind.EXITED, 143, signal.SIGTERM)


def test_kill_takes_the_runner_too_so_the_job_is_reported_killed(jobs: Jobs) -> None:
    handle = jobs.start(["sh", "-c", "touch ready; exec sleep 60"])
    wait_for_file(jobs.workdir / "ready")

    jobs.executor.kill(handle)

    ended = jobs.wait_exit(handle)
    assert ended == Exit(exit_code=None, signal=signal.SIGKILL, ended_at=None, how=ExitKind.KILLED)
    assert not Path(handle.status_path).exists()


def test_a_job_that_ignores_sigterm_survives_terminate_and_dies_on_kill(jobs: Jobs) -> None:
    handle = jobs.python(
        "import pathlib, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: pathlib.Path('got-term').touch())\n"
        "pathlib.Path('ready').touch()\n"
        "while True: time.sleep(1)\n"
    )
    wait_for_file(jobs.workdir / "ready")

    jobs.executor.terminate(handle)
    wait_for_file(jobs.workdir / "got-term")
    assert jobs.executor.alive(handle)
    assert jobs.executor.poll(handle) is None

    jobs.executor.kill(handle)
    assert jobs.wait_exit(handle).how is ExitKind.KILLED


def test_kill_reaches_grandchildren_in_the_group(jobs: Jobs) -> None:
    handle = jobs.start(["sh", "-c", "sleep 60 & echo $! > grandchild; wait"])
    grandchild = wait_for(lambda: read_pid(jobs.workdir / "grandchild"), "the grandchild's pid")

    jobs.executor.kill(handle)

    jobs.wait_exit(handle)
    assert proc_state(grandchild) in (None, "Z")


def test_processes_left_behind_by_an_exited_job_are_killed_before_the_exit_is_reported(
    jobs: Jobs,
) -> None:
    handle = jobs.start(["sh", "-c", "sleep 60 & echo $! > straggler; exit 0"])

    ended = jobs.wait_exit(handle)

    assert (ended.how, ended.exit_code) == (ExitKind.EXITED, 0)
    straggler = read_pid(jobs.workdir / "straggler")
    assert straggler is not None and proc_state(straggler) in (None, "Z")


# --- commands that cannot start ----------------------------------------------------------------


def test_a_missing_command_exits_127_with_the_reason_in_the_exit_and_the_log(jobs: Jobs) -> None:
    handle = jobs.start(["no-such-command-for-preemptible-tests", "--flag"])

    ended = jobs.wait_exit(handle)

    assert (ended.how, ended.exit_code) == (ExitKind.EXITED, 127)
    assert ended.error is not None and "no-such-command-for-preemptible-tests" in ended.error
    assert "cannot start 'no-such-command-for-preemptible-tests'" in jobs.log()


def test_a_file_without_execute_permission_exits_126(jobs: Jobs) -> None:
    script = jobs.workdir / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)

    ended = jobs.wait_exit(jobs.start(["./script.sh"]))

    assert (ended.exit_code, ended.how) == (126, ExitKind.EXITED)
    assert ended.error is not None and "Permission denied" in ended.error


def test_launch_refuses_a_missing_cwd_and_an_empty_command(jobs: Jobs) -> None:
    with pytest.raises(QueueError, match=r"working directory .* does not exist"):
        jobs.start(["true"], cwd=str(jobs.workdir / "absent"))
    with pytest.raises(QueueError, match="command is empty"):
        jobs.start([])


# --- what the job sees -------------------------------------------------------------------------

ENV_DUMP = (
    "import json, os, sys; json.dump({k: os.environ.get(k) for k in sys.argv[1:]}, "
    "open('env.json', 'w'))"
)
ENV_NAMES = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "PREEMPTIBLE_JOB_ID",
    "PREEMPTIBLE_ADMIN_TOKEN",
    "PREEMPTIBLE_SLURM_SIGNAL_SECONDS",
    "TEAM_A_TOKEN",
    "KEPT",
    "USER_VAR",
]


@pytest.mark.parametrize(
    "gpu_ids, visible", [([0, 3], "0,3"), ([], "")], ids=["two-gpus", "no-gpu-hides-all"]
)
def test_the_job_sees_its_gpus_and_env_but_not_the_managers_secrets(
    jobs: Jobs, monkeypatch: pytest.MonkeyPatch, gpu_ids: list[int], visible: str
) -> None:
    for name, value in [
        ("PREEMPTIBLE_ADMIN_TOKEN", "admin-secret"),
        ("PREEMPTIBLE_SLURM_SIGNAL_SECONDS", "120"),
        ("TEAM_A_TOKEN", "team-secret"),
        ("KEPT", "from-manager"),
        ("CUDA_VISIBLE_DEVICES", "7"),
    ]:
        monkeypatch.setenv(name, value)
    jobs.executor = ProcessExecutor(exclude={"TEAM_A_TOKEN"})

    user_env = {"PREEMPTIBLE_JOB_ID": "j1", "USER_VAR": "from-user", "CUDA_VISIBLE_DEVICES": "9"}
    handle = jobs.start([PY, "-c", ENV_DUMP, *ENV_NAMES], env=user_env, gpu_ids=gpu_ids)

    assert jobs.wait_exit(handle).exit_code == 0
    assert json.loads((jobs.workdir / "env.json").read_text()) == {
        "CUDA_VISIBLE_DEVICES": visible,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "PREEMPTIBLE_JOB_ID": "j1",
        "PREEMPTIBLE_ADMIN_TOKEN": None,
        "PREEMPTIBLE_SLURM_SIGNAL_SECONDS": None,
        "TEAM_A_TOKEN": None,
        "KEPT": "from-manager",
        "USER_VAR": "from-user",
    }


def test_an_explicit_base_env_is_used_as_given_minus_the_excluded(jobs: Jobs) -> None:
    base = {"PATH": os.environ["PATH"], "PREEMPTIBLE_ADMIN_TOKEN": "x", "KEPT": "y"}
    jobs.executor = ProcessExecutor(base_env=base, exclude=["PREEMPTIBLE_ADMIN_TOKEN"])

    handle = jobs.start([PY, "-c", ENV_DUMP, "PREEMPTIBLE_ADMIN_TOKEN", "KEPT", "HOME"])

    assert jobs.wait_exit(handle).exit_code == 0
    seen = json.loads((jobs.workdir / "env.json").read_text())
    assert seen == {"PREEMPTIBLE_ADMIN_TOKEN": None, "KEPT": "y", "HOME": None}


def test_stdout_and_stderr_are_appended_to_the_log_in_the_jobs_cwd(jobs: Jobs) -> None:
    code = "import os, sys; print('out', os.getcwd()); print('err', file=sys.stderr)"
    elsewhere = jobs.workdir / "elsewhere"
    elsewhere.mkdir()

    for attempt_cwd in (jobs.workdir, elsewhere):
        assert jobs.wait_exit(jobs.python(code, cwd=str(attempt_cwd))).exit_code == 0

    assert jobs.log().splitlines() == [f"out {jobs.workdir}", "err", f"out {elsewhere}", "err"]


# --- after a manager restart -------------------------------------------------------------------

MANAGER = """
import sys
from pathlib import Path
from preemptible.queue.service.executor import LaunchSpec, ProcessExecutor

work = Path(sys.argv[1])
spec = LaunchSpec(
    job_id="j1", attempt=1, command=sys.argv[2:], cwd=str(work), env={}, gpu_ids=[],
    log_path=work / "logs" / "j1.1.log", status_path=work / "status" / "j1.1.json",
)
print(ProcessExecutor().launch(spec).to_json())
"""

WAIT_FOR_GO_THEN_EXIT_7 = ["sh", "-c", "touch ready; until [ -e go ]; do sleep 0.01; done; exit 7"]


def launch_from_a_manager_that_then_dies(workdir: Path, command: list[str]) -> ProcessHandle:
    """Launch in another process that exits at once: the runner is no child of this test."""
    manager = subprocess.run(
        [PY, "-c", MANAGER, str(workdir), *command],
        capture_output=True,
        text=True,
        check=True,
        timeout=WAIT_SECS,
    )
    return ProcessHandle.from_json(manager.stdout)


def test_a_new_executor_adopts_a_running_job_and_learns_its_exit_code(jobs: Jobs) -> None:
    handle = launch_from_a_manager_that_then_dies(jobs.workdir, WAIT_FOR_GO_THEN_EXIT_7)
    jobs.started.append(handle)
    wait_for_file(jobs.workdir / "ready")
    restarted = ProcessExecutor()

    assert restarted.alive(handle)
    assert restarted.poll(handle) is None
    (jobs.workdir / "go").touch()

    ended = jobs.wait_exit(handle, restarted)
    assert (ended.how, ended.exit_code, ended.signal) == (ExitKind.EXITED, 7, None)


def test_an_adopted_job_killed_as_a_group_is_reported_killed(jobs: Jobs) -> None:
    handle = launch_from_a_manager_that_then_dies(jobs.workdir, WAIT_FOR_GO_THEN_EXIT_7)
    jobs.started.append(handle)
    wait_for_file(jobs.workdir / "ready")
    restarted = ProcessExecutor()

    restarted.kill(handle)

    ended = jobs.wait_exit(handle, restarted)
    assert ended == Exit(exit_code=None, signal=None, ended_at=None, how=ExitKind.KILLED)


POLL_WITHOUT_FDS = """
import json, os, resource, sys
from preemptible.queue.service.executor import ProcessExecutor, ProcessHandle
handle, executor = ProcessHandle.from_json(sys.argv[1]), ProcessExecutor()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass  # every descriptor is taken, as a flood of connections would take them
answers = {}
for name in ("alive", "poll"):
    try:
        answers[name] = repr(getattr(executor, name)(handle))
    except OSError as error:
        answers[name] = f"raised {error.errno}"
print(json.dumps(answers))
"""


def test_a_job_is_not_taken_for_ended_when_proc_cannot_be_read(jobs: Jobs) -> None:
    handle = launch_from_a_manager_that_then_dies(jobs.workdir, WAIT_FOR_GO_THEN_EXIT_7)
    jobs.started.append(handle)
    wait_for_file(jobs.workdir / "ready")
    polled = subprocess.run(
        [PY, "-c", POLL_WITHOUT_FDS, handle.to_json()],
        capture_output=True,
        text=True,
        check=True,
        timeout=WAIT_SECS,
    )
    # Neither "gone" (a restarted manager would run it twice) nor an exit: ask again later.
    raised = f"raised {errno.EMFILE}"
    assert json.loads(polled.stdout) == {"alive": raised, "poll": raised}
    assert ProcessExecutor().alive(handle)  # it runs


def test_a_runner_left_a_zombie_by_a_parent_that_never_reaps_counts_as_ended(jobs: Jobs) -> None:
    # The launching executor stays alive and never polls: like an init that does not reap.
    handle = jobs.start(["sh", "-c", "exit 4"])
    wait_for(lambda: proc_state(handle.pid) == "Z", "the runner to become a zombie")
    other = ProcessExecutor()

    assert not other.alive(handle)
    ended = other.poll(handle)
    assert ended is not None and (ended.how, ended.exit_code) == (ExitKind.EXITED, 4)


def test_a_recycled_pid_is_not_alive_is_lost_and_is_never_signalled(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        handle = ProcessHandle(
            pid=bystander.pid,
            start_ticks=start_ticks(bystander.pid) + 1,
            status_path=str(tmp_path / "never-written.json"),
        )
        executor = ProcessExecutor()

        assert not executor.alive(handle)
        executor.terminate(handle)
        executor.kill(handle)
        assert executor.poll(handle) == Exit(
            exit_code=None, signal=None, ended_at=None, how=ExitKind.LOST
        )
        with pytest.raises(subprocess.TimeoutExpired):
            bystander.wait(timeout=0.2)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_handle_round_trips_through_json_and_garbage_is_refused() -> None:
    handle = ProcessHandle(pid=4242, start_ticks=987654, status_path="/state/j1.1.json")

    assert ProcessHandle.from_json(handle.to_json()) == handle
    for garbage in ["", "[]", '{"pid": "4242", "start_ticks": 1, "status_path": "x"}']:
        with pytest.raises(StateStoreError, match="process handle is unreadable"):
            ProcessHandle.from_json(garbage)


def test_a_stale_status_file_from_an_earlier_launch_is_removed(jobs: Jobs) -> None:
    status = jobs.workdir / "status" / "j1.1.json"
    status.parent.mkdir()
    status.write_text('{"exit_code": 0, "signal": null, "ended_at": 1.0}')

    handle = jobs.start(["sh", "-c", "touch ready; exec sleep 60"])
    wait_for_file(jobs.workdir / "ready")

    assert jobs.executor.poll(handle) is None


# --- the runner on its own ---------------------------------------------------------------------


def test_the_runner_exits_with_the_commands_code_and_writes_exactly_the_status(
    tmp_path: Path,
) -> None:
    status = tmp_path / "status.json"
    argv = [PY, "-m", "preemptible.queue.service.runner", "--status", str(status), "--"]

    done = subprocess.run([*argv, "sh", "-c", "exit 5"], timeout=WAIT_SECS, check=False)

    assert done.returncode == 5
    record = json.loads(status.read_text())
    assert record.keys() == {"exit_code", "signal", "ended_at"}
    assert (record["exit_code"], record["signal"]) == (5, None)
    assert not (tmp_path / ("status.json" + runner.STATUS_SUFFIX_TMP)).exists()


def test_the_runner_without_a_command_prints_usage_and_exits_2(tmp_path: Path) -> None:
    argv = [PY, "-I", "-S", runner.__file__, "--status", str(tmp_path / "s.json"), "--"]

    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_SECS, check=False)

    assert done.returncode == 2
    assert "usage:" in done.stderr


def test_the_runner_imports_nothing_heavy(tmp_path: Path) -> None:
    argv = [PY, "-X", "importtime", "-I", "-S", runner.__file__]
    argv += ["--status", str(tmp_path / "s.json"), "--", "true"]

    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_SECS, check=True)

    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    heavy = {"preemptible", "torch", "json", "argparse", "subprocess", "typing"}
    assert not imported & heavy
