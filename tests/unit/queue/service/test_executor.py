"""ProcessExecutor and its runner, with real processes and real signals (Linux: /proc).

Nothing is mocked. Jobs that must be in a known state before a signal reach it tell the test
through a file ("ready"), which the test waits for; the only fixed bound is how long a bystander
must survive a SIGKILL that must not reach it.

The tests of containment run once per mechanism this host offers (the cgroups really made
under /sys/fs/cgroup, the subreaper really set by prctl); one this host lacks is skipped with
the reason `containment.probe` gives.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from preemptible.errors import QueueError, StateStoreError
from preemptible.queue.service import containment, runner
from preemptible.queue.service.containment import Mechanism
from preemptible.queue.service.executor import (
    Exit,
    ExitKind,
    LaunchSpec,
    ProcessExecutor,
    ProcessHandle,
)
from preemptible.queue.service.isolation import JobUser
from tests.polling import wait_until
from tests.unix_users import NEEDS_ROOT, made_users

_T = TypeVar("_T")

PY = sys.executable
WAIT_SECS = 10.0
"""Upper bound for anything to happen; a passing run waits milliseconds."""


def wait_for(probe: Callable[[], _T | None], what: str) -> _T:
    return wait_until(probe, what, timeout=WAIT_SECS, every=0.005)


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


@functools.cache
def offered(mechanism: Mechanism) -> containment.Containment:
    """The mechanism as probed on this host (once per test run)."""
    return containment.probe(mechanism)


CONTAINED = [m for m in Mechanism if m is not Mechanism.PROCESS_GROUP]


def executor_with(mechanism: Mechanism) -> ProcessExecutor:
    """An executor that contains jobs with `mechanism`; the test is skipped where it is lacking."""
    found = offered(mechanism)
    if not found.available:
        pytest.skip(f"{mechanism} is not offered here: {found.why}")
    return ProcessExecutor(containment=found)


@pytest.fixture(params=CONTAINED, ids=[m.name.lower() for m in CONTAINED])
def contained(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Jobs]:
    """Jobs contained by each mechanism in turn that this host offers."""
    jobs = Jobs(tmp_path, executor_with(request.param))
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


# --- every process of the job, setsid or not --------------------------------------------------

HOLDER_ON_TERM = {
    "dies": "pass",
    "ignores": "signal.signal(signal.SIGTERM, signal.SIG_IGN)",
    "notes": "signal.signal(signal.SIGTERM, lambda *_: (open('holder-got-term', 'w').close(), "
    "os._exit(0)))",
}


def escaping_job(*, holder: str = "dies", main: str = "sleeps") -> str:
    """A job whose main process starts a holder the way a daemonising launcher does: a fork,
    `setsid()` (a new session and process group), a second fork, the middle process exits (the
    holder is an orphan). The holder writes its pid and its GPUs to 'holder', then holds them
    for two minutes; on SIGTERM it `dies`, `ignores` it or `notes` it in a file and exits. The
    main process then touches 'ready' and `sleeps`, `exits` 0 at once, or `ignores` SIGTERM
    (noting it in 'main-got-term') and sleeps."""
    main_code = {
        "sleeps": "time.sleep(120)",
        "exits": "raise SystemExit(0)",
        "ignores": "time.sleep(120)",
    }[main]
    main_term = (
        "signal.signal(signal.SIGTERM, lambda *_: open('main-got-term', 'w').close())\n"
        if main == "ignores"
        else ""
    )
    return (
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        {HOLDER_ON_TERM[holder]}\n"
        "        with open('holder.tmp', 'w') as f:\n"
        "            f.write(f\"{os.getpid()} {os.environ.get('CUDA_VISIBLE_DEVICES')}\\n\")\n"
        "        os.rename('holder.tmp', 'holder')\n"
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "while not os.path.exists('holder'):\n"
        "    time.sleep(0.005)\n"
        f"{main_term}"
        "open('ready', 'w').close()\n"
        f"{main_code}\n"
    )


def holder_of(workdir: Path) -> int:
    """The holder's pid, once the job says it is ready."""
    wait_for_file(workdir / "ready")
    return int((workdir / "holder").read_text().split()[0])


def gone(pid: int) -> bool:
    return proc_state(pid) in (None, "Z")


def test_a_process_group_alone_loses_a_process_that_calls_setsid(tmp_path: Path) -> None:
    # The executor before containment: the holder misses the notice and outlives the job.
    # Every test below fails this way on that executor.
    jobs = Jobs(tmp_path, ProcessExecutor(containment=Mechanism.PROCESS_GROUP))
    handle = jobs.python(escaping_job())
    holder = holder_of(tmp_path)
    try:
        jobs.executor.terminate(handle)

        ended = jobs.wait_exit(handle)

        assert (ended.how, ended.exit_code, handle.cgroup, handle.subreaper) == (
            ExitKind.EXITED,
            143,
            None,
            False,
        )
        assert not gone(holder)
    finally:
        os.kill(holder, signal.SIGKILL)


def test_the_notice_reaches_a_process_that_left_the_group(contained: Jobs) -> None:
    # The main process stays: once it has ended, what it left is killed at once (the next
    # test), and the holder's handler would race that SIGKILL.
    handle = contained.python(escaping_job(holder="notes", main="ignores"))
    holder = holder_of(contained.workdir)

    contained.executor.terminate(handle)

    wait_for_file(contained.workdir / "holder-got-term")
    wait_for_file(contained.workdir / "main-got-term")
    wait_for(lambda: gone(holder), "the holder to exit on its notice")
    assert contained.executor.poll(handle) is None  # the main process still runs


def test_kill_ends_a_process_that_left_the_group_and_ignores_the_notice(contained: Jobs) -> None:
    handle = contained.python(escaping_job(holder="ignores", main="ignores"))
    holder = holder_of(contained.workdir)
    contained.executor.terminate(handle)
    wait_for_file(contained.workdir / "main-got-term")
    assert contained.executor.poll(handle) is None and not gone(holder)

    contained.executor.kill(handle)

    ended = contained.wait_exit(handle)
    assert gone(holder)
    # A subreaper runner is spared to reap what it adopted, and records the command's SIGKILL.
    expected = ExitKind.EXITED if handle.subreaper else ExitKind.KILLED
    assert (ended.how, ended.signal) == (expected, signal.SIGKILL)


def test_an_attempt_has_ended_only_once_no_process_of_it_is_left(contained: Jobs) -> None:
    handle = contained.python(escaping_job(holder="ignores", main="exits"))

    ended = contained.wait_exit(handle)

    holder = holder_of(contained.workdir)
    assert (ended.how, ended.exit_code) == (ExitKind.EXITED, 0)
    assert gone(holder)
    assert ended.ended_at is not None and ended.ended_at <= time.time()
    if handle.cgroup is not None:
        assert not os.path.exists(handle.cgroup)  # removed once empty


def test_kill_ends_a_job_whose_processes_keep_forking_away(tmp_path: Path) -> None:
    # Each generation forks the next and exits: no pid lives for more than a millisecond or
    # so, too short for a scan of /proc to find. A cgroup freezes it (or refuses it new
    # processes) before it signals; a subreaper runner kills each generation the moment it is
    # orphaned, from the kernel's list of its children. Each generation writes its number to
    # 'beat', which stops once the chain is dead.
    chain = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    deadline, n = time.time() + 30, 0\n"
        "    while time.time() < deadline:\n"
        "        if os.fork():\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "        open('beat.tmp', 'w').write(str(n))\n"
        "        os.replace('beat.tmp', 'beat')\n"
        "        time.sleep(0.001)\n"
        "    os._exit(0)\n"
        "while not os.path.exists('beat'):\n"
        "    time.sleep(0.005)\n"
        "open('ready', 'w').close()\n"
        "time.sleep(120)\n"
    )
    for mechanism in CONTAINED:
        if not offered(mechanism).available:
            continue
        jobs = Jobs(tmp_path, ProcessExecutor(containment=offered(mechanism)))
        handle = jobs.python(chain)
        wait_for_file(tmp_path / "ready")
        wait_for(lambda: int((tmp_path / "beat").read_text()) > 20, "twenty generations")

        jobs.executor.kill(handle)

        assert jobs.wait_exit(handle).signal == signal.SIGKILL, mechanism
        last = (tmp_path / "beat").read_text()
        time.sleep(0.2)  # a live chain makes a hundred generations meanwhile
        assert (tmp_path / "beat").read_text() == last, f"{mechanism}: the chain lives on"
        for made in ("ready", "beat", "beat.tmp"):
            (tmp_path / made).unlink(missing_ok=True)


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


# --- whom the job runs as, and its files ------------------------------------------------------


def mode_and_owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid


def test_the_attempts_files_are_the_managers_alone_whatever_the_umask(jobs: Jobs) -> None:
    old_umask = os.umask(0o022)
    try:
        handle = jobs.python("print('out')", own_dir=jobs.workdir / "logs" / "cost")
    finally:
        os.umask(old_umask)

    assert jobs.wait_exit(handle).exit_code == 0
    me = os.geteuid()
    assert mode_and_owner(jobs.workdir / "logs") == (0o700, me)
    assert mode_and_owner(jobs.workdir / "logs" / "j1.1.log") == (0o600, me)
    assert mode_and_owner(jobs.workdir / "logs" / "cost") == (0o700, me)
    assert mode_and_owner(jobs.workdir / "status" / "j1.1.json") == (0o600, me)


@pytest.fixture(scope="module")
def job_user() -> Iterator[JobUser]:
    with made_users(1) as (user,):
        yield JobUser.lookup(user.name)


WHO = 'echo "$(id -u) $(id -g) $(id -G)"; echo "$HOME $USER $LOGNAME $PWD"; env | sort'


@NEEDS_ROOT
def test_a_job_of_another_user_runs_as_it_from_a_clean_environment(
    jobs: Jobs, job_user: JobUser
) -> None:
    base = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MANAGERS": "never seen"}
    jobs.executor = ProcessExecutor(base_env=base)
    own = jobs.workdir / "logs" / "cost"

    handle = jobs.start(
        ["sh", "-c", WHO], cwd=None, run_as=job_user, own_dir=own, env={"MINE": "1"}
    )

    assert jobs.wait_exit(handle).exit_code == 0
    ids, where, *env = jobs.log().splitlines()
    groups = " ".join(str(g) for g in job_user.groups)
    assert ids.split(" ", 2) == [str(job_user.uid), str(job_user.gid), groups]
    home = job_user.home if os.path.isdir(job_user.home) else "/"
    assert where == f"{job_user.home} {job_user.name} {job_user.name} {home}"
    names = {line.split("=", 1)[0] for line in env}
    assert names - {"PWD", "SHLVL", "_"} == {
        "PATH", "LANG", "HOME", "USER", "LOGNAME", "MINE", "CUDA_DEVICE_ORDER",
        "CUDA_VISIBLE_DEVICES",
    }  # fmt: skip
    # The folders are the manager's, the job passes through; the log and the cost folder its.
    assert mode_and_owner(jobs.workdir / "logs") == (0o711, 0)
    assert mode_and_owner(jobs.workdir / "logs" / "j1.1.log") == (0o600, job_user.uid)
    assert mode_and_owner(own) == (0o700, job_user.uid)
    assert mode_and_owner(jobs.workdir / "status" / "j1.1.json") == (0o600, 0)


@NEEDS_ROOT
def test_the_jobs_variables_never_reach_its_runner_which_keeps_the_managers_privileges(
    jobs: Jobs, job_user: JobUser
) -> None:
    # LD_LIBRARY_PATH, LD_PRELOAD...: in the runner's environment they would run the team's
    # code with the manager's privileges.
    env = {"LD_LIBRARY_PATH": "/nonexistent", "MINE": "1"}
    code = 'echo "$LD_LIBRARY_PATH $MINE"; echo ready; exec sleep 30'
    handle = jobs.start(["sh", "-c", code], cwd=None, run_as=job_user, env=env)

    wait_for(lambda: "ready" in jobs.log(), "the job to start")
    runner_env = Path(f"/proc/{handle.pid}/environ").read_bytes()
    assert b"LD_LIBRARY_PATH" not in runner_env and b"MINE" not in runner_env
    assert jobs.log().splitlines()[0] == "/nonexistent 1"


@NEEDS_ROOT
def test_a_working_directory_the_user_may_not_enter_fails_with_the_reason(
    jobs: Jobs, job_user: JobUser
) -> None:
    private = jobs.workdir / "private"
    private.mkdir(mode=0o700)

    ended = jobs.wait_exit(jobs.start(["true"], cwd=str(private), run_as=job_user))

    assert ended.exit_code == 126
    assert ended.error is not None
    assert f"cannot enter {private} as uid {job_user.uid}: Permission denied" in ended.error


@NEEDS_ROOT
def test_a_job_of_another_user_cannot_kill_its_runner(jobs: Jobs, job_user: JobUser) -> None:
    kill = "kill -KILL $PPID 2>/dev/null && echo killed || echo refused"
    handle = jobs.start(["sh", "-c", kill], cwd=None, run_as=job_user)

    ended = jobs.wait_exit(handle)

    assert jobs.log() == "refused\n"
    assert ended.how is ExitKind.EXITED and ended.exit_code == 0  # the runner wrote the status


# --- after a manager restart -------------------------------------------------------------------

MANAGER = """
import sys
from pathlib import Path
from preemptible.queue.service.containment import Mechanism
from preemptible.queue.service.executor import LaunchSpec, ProcessExecutor

work, mechanism = Path(sys.argv[1]), sys.argv[2]
spec = LaunchSpec(
    job_id="j1", attempt=1, command=sys.argv[3:], cwd=str(work), env={}, gpu_ids=[],
    log_path=work / "logs" / "j1.1.log", status_path=work / "status" / "j1.1.json",
)
executor = ProcessExecutor(containment=Mechanism(mechanism) if mechanism else None)
print(executor.launch(spec).to_json())
"""

WAIT_FOR_GO_THEN_EXIT_7 = ["sh", "-c", "touch ready; until [ -e go ]; do sleep 0.01; done; exit 7"]


def launch_from_a_manager_that_then_dies(
    workdir: Path, command: list[str], mechanism: Mechanism | None = None
) -> ProcessHandle:
    """Launch in another process that exits at once: the runner is no child of this test."""
    manager = subprocess.run(
        [PY, "-c", MANAGER, str(workdir), mechanism or "", *command],
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


def test_an_adopted_job_is_never_taken_for_gone_while_proc_cannot_be_read(jobs: Jobs) -> None:
    # Out of file descriptors for real (EMFILE): /proc cannot be opened, which says nothing
    # about the job. It must stay alive and unended, or the manager would kill or rerun it.
    handle = launch_from_a_manager_that_then_dies(jobs.workdir, WAIT_FOR_GO_THEN_EXIT_7)
    jobs.started.append(handle)
    wait_for_file(jobs.workdir / "ready")
    restarted = ProcessExecutor()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with pytest.raises(OSError):
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        alive, ended = restarted.alive(handle), restarted.poll(handle)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert alive and ended is None
    assert restarted.alive(handle)  # and, /proc readable again, it still runs
    (jobs.workdir / "go").touch()
    assert jobs.wait_exit(handle, restarted).exit_code == 7


def test_an_adopted_job_killed_as_a_group_is_reported_killed(jobs: Jobs) -> None:
    handle = launch_from_a_manager_that_then_dies(jobs.workdir, WAIT_FOR_GO_THEN_EXIT_7)
    jobs.started.append(handle)
    wait_for_file(jobs.workdir / "ready")
    restarted = ProcessExecutor()

    restarted.kill(handle)

    ended = jobs.wait_exit(handle, restarted)
    assert ended == Exit(exit_code=None, signal=None, ended_at=None, how=ExitKind.KILLED)


@pytest.mark.parametrize("mechanism", CONTAINED, ids=[m.name.lower() for m in CONTAINED])
def test_a_new_executor_reaches_every_process_of_an_adopted_job(
    tmp_path: Path, mechanism: Mechanism
) -> None:
    executor_with(mechanism)  # skips where the host lacks it
    command = [PY, "-c", escaping_job(holder="ignores", main="ignores")]
    handle = launch_from_a_manager_that_then_dies(tmp_path, command, mechanism)
    holder = holder_of(tmp_path)
    restarted = Jobs(tmp_path, ProcessExecutor(containment=Mechanism.PROCESS_GROUP))
    restarted.started.append(handle)  # killed at the end whatever happens
    try:
        restarted.executor.terminate(handle)
        wait_for_file(tmp_path / "main-got-term")
        assert restarted.executor.poll(handle) is None and not gone(holder)

        restarted.executor.kill(handle)

        assert restarted.wait_exit(handle).signal in (signal.SIGKILL, None)
        assert gone(holder)
        # The handle said how the attempt is contained, whatever the new executor would choose.
        assert (handle.cgroup is not None, handle.subreaper) == (
            mechanism.is_cgroup,
            mechanism is Mechanism.SUBREAPER,
        )
    finally:
        if not gone(holder):
            os.kill(holder, signal.SIGKILL)


@pytest.mark.parametrize(
    "mechanism", [Mechanism.CGROUP_V2, Mechanism.CGROUP_V1_FREEZER], ids=["cgroup_v2", "freezer"]
)
def test_adopting_thaws_a_job_that_a_dying_manager_left_frozen(
    tmp_path: Path, mechanism: Mechanism
) -> None:
    # The manager died between freezing the cgroup for a signal and thawing it.
    executor_with(mechanism)
    command = ["sh", "-c", "touch ready; until [ -e go ]; do sleep 0.01; done; touch went; exit 3"]
    handle = launch_from_a_manager_that_then_dies(tmp_path, command, mechanism)
    restarted = Jobs(tmp_path, ProcessExecutor(containment=Mechanism.PROCESS_GROUP))
    restarted.started.append(handle)
    wait_for_file(tmp_path / "ready")
    assert handle.cgroup is not None
    containment._freeze(handle.cgroup)
    (tmp_path / "go").touch()
    time.sleep(0.2)
    assert not (tmp_path / "went").exists()  # frozen, it cannot see it

    restarted.executor.adopt(handle)

    assert restarted.wait_exit(handle).exit_code == 3
    assert (tmp_path / "went").exists()


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
    in_cgroup = ProcessHandle(
        pid=1, start_ticks=2, status_path="s", cgroup="/sys/fs/cgroup/preemptible/j1-1-abc123"
    )
    under_subreaper = ProcessHandle(pid=1, start_ticks=2, status_path="s", subreaper=True)
    stored_before_containment = (
        '{"pid": 4242, "start_ticks": 987654, "status_path": "/state/j1.1.json"}'
    )

    for each in (handle, in_cgroup, under_subreaper):
        assert ProcessHandle.from_json(each.to_json()) == each
    assert ProcessHandle.from_json(stored_before_containment) == handle
    for garbage in [
        "",
        "[]",
        '{"pid": "4242", "start_ticks": 1, "status_path": "x"}',
        '{"pid": 1, "start_ticks": 1, "status_path": "x", "subreaper": 1}',
        # Not an attempt's cgroup: every process of this one would be killed.
        '{"pid": 1, "start_ticks": 1, "status_path": "x", "cgroup": "/sys/fs/cgroup"}',
    ]:
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


def test_the_runner_refuses_to_run_a_command_outside_the_cgroup_it_was_given(
    tmp_path: Path,
) -> None:
    status = tmp_path / "status.json"
    argv = [PY, "-I", "-S", runner.__file__, "--status", str(status)]
    argv += ["--cgroup", str(tmp_path / "no-such-cgroup"), "--", "touch", "ran"]

    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_SECS, check=False)

    assert done.returncode == runner.EXIT_NOT_EXECUTABLE
    assert "cannot join the job's cgroup" in done.stderr
    assert "cannot join the job's cgroup" in json.loads(status.read_text())["error"]
    assert not (tmp_path / "ran").exists()


def test_a_subreaper_runner_writes_the_status_once_nothing_the_command_left_is_alive(
    tmp_path: Path,
) -> None:
    # The command leaves a process that called setsid and is no child of anyone it knows.
    status = tmp_path / "status.json"
    orphan = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        open('orphan', 'w').write(f'{os.getpid()}\\n')\n"
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "while not os.path.exists('orphan'):\n"
        "    time.sleep(0.005)\n"
    )
    argv = [PY, "-I", "-S", runner.__file__, "--status", str(status), "--subreaper"]

    done = subprocess.run(
        [*argv, "--", PY, "-c", orphan], cwd=tmp_path, timeout=WAIT_SECS, check=False
    )

    assert done.returncode == 0 and json.loads(status.read_text())["exit_code"] == 0
    left = read_pid(tmp_path / "orphan")
    assert left is not None and proc_state(left) is None  # killed, and reaped by the runner


@pytest.mark.parametrize("options", [[], ["--subreaper"]], ids=["group", "subreaper"])
def test_the_runner_imports_nothing_heavy(tmp_path: Path, options: list[str]) -> None:
    argv = [PY, "-X", "importtime", "-I", "-S", runner.__file__]
    argv += ["--status", str(tmp_path / "s.json"), *options, "--", "true"]

    done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_SECS, check=True)

    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    heavy = {"preemptible", "torch", "json", "argparse", "subprocess", "typing"}
    assert not imported & heavy
