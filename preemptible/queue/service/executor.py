"""Run each admitted job as its own process group, and find it again after a manager restart.

Every attempt runs under ``runner.py`` (see there), which leads a new session: its pid is the
group id, the manager signals the group, and the runner writes the exit status to a file. That file
is what makes a restart harmless: a manager started again holds no child processes and gets no
``waitpid`` status, so it re-adopts a job from its persisted :class:`ProcessHandle` and learns the
exit from the file. A pid alone is not an identity (the kernel recycles them), so the handle also
keeps the runner's start time in clock ticks (``/proc/<pid>/stat`` field 22); a pid whose start
time differs is another process, and is never signalled.

Rejected: a systemd transient unit or a cgroup per job (needs privileges or a user session
manager we cannot assume on a shared machine); pidfds (they do not survive our own restart).

Nothing here blocks: ``poll`` reads at most a few small files and is meant to be called every
second for every running job. Linux only (``/proc``). A read that fails for another reason than
"no such process" or "no such file" (no file descriptor left, say) raises ``OSError`` rather than
pass for an exit: a job is never taken for ended because the manager could not look.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import subprocess
import sys
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from preemptible._env_names import PREFIX as MANAGER_ONLY_PREFIX
from preemptible.errors import QueueError, StateStoreError
from preemptible.queue.service import runner

_T = TypeVar("_T")

RUNNER_ARGV = (sys.executable, "-I", "-S", runner.__file__)
"""How the runner starts: as a script in isolated mode, untouched by the job's PYTHON* variables
and by ``preemptible/__init__.py``, in about 12 ms."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchSpec:
    """Everything needed to start one attempt of a job."""

    job_id: str
    """The job's id; only used in error messages."""
    attempt: int
    """Which attempt of the job this is (1, 2... after requeues); only used in error messages."""
    command: list[str]
    """The argv to run; ``command[0]`` is looked up in ``PATH`` like a shell does."""
    cwd: str | None
    """Working directory; None runs in the manager's."""
    env: dict[str, str]
    """The complete extra environment: the user's variables plus the manager's PREEMPTIBLE_*."""
    gpu_ids: list[int]
    """Physical GPU indices (nvidia-smi order) -> ``CUDA_VISIBLE_DEVICES``; [] hides every GPU."""
    log_path: Path
    """Receives stdout and stderr of this attempt, appended."""
    status_path: Path
    """Where the runner writes the exit status; one per attempt (a leftover one is removed)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessHandle:
    """What the manager persists to find a running attempt again after a restart."""

    pid: int
    """The runner's pid, which is also the attempt's process group id."""
    start_ticks: int
    """The runner's start time (field 22 of ``/proc/<pid>/stat``): a recycled pid differs here."""
    status_path: str
    """Where the runner writes the exit status."""

    def to_json(self) -> str:
        """The handle as a JSON object, to store in the manager's database."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProcessHandle:
        """Read back what :meth:`to_json` wrote.

        Raises:
            StateStoreError: The text is not a handle (a corrupt or foreign state file).
        """
        try:
            data = json.loads(text)
            return cls(
                pid=_exact(data["pid"], int),
                start_ticks=_exact(data["start_ticks"], int),
                status_path=_exact(data["status_path"], str),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise StateStoreError(
                f"a stored process handle is unreadable ({error}); the job's process cannot be "
                "found again: check that the process is gone, then requeue or cancel the job"
            ) from error


class ExitKind(enum.StrEnum):
    """How we know that an attempt ended."""

    EXITED = "exited"
    """The runner wrote the exit status: exit_code and signal are exact."""
    KILLED = "killed"
    """The runner died without a status (SIGKILL to the group, OOM killer): no exit code."""
    LOST = "lost"
    """The runner is gone, its pid belongs to another process and no status exists (a reboot)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Exit:
    """How an attempt ended."""

    exit_code: int | None
    """The command's exit status, 128 + signal if a signal ended it; None when unknown."""
    signal: int | None
    """The signal that ended the command; for ``killed``, the one that ended the runner if known."""
    ended_at: float | None
    """When the command ended (epoch seconds), as the runner saw it; None when unknown."""
    how: ExitKind
    """Whether the exit status is known, and why not."""
    error: str | None = None
    """Why the command could not start (exit 126 or 127), as the runner reported it."""


class _RunnerState(enum.Enum):
    RUNNING = enum.auto()
    ENDED = enum.auto()
    """Gone or a zombie: our own zombies are reaped; an init that never reaps must not stall us."""
    RECYCLED = enum.auto()
    """The pid now belongs to another process."""


class _ProcStat(NamedTuple):
    state: str
    process_group: int
    start_ticks: int


class ProcessExecutor:
    """Starts, watches and stops job attempts; safe to re-create after a restart of the manager.

    Only attempts started by this instance are children of this process; for those it reaps the
    runner and knows its fate even without a status file. Any other handle is "adopted": its
    runner's parent is init, and ``/proc`` plus the status file tell us everything.
    """

    def __init__(
        self, *, base_env: Mapping[str, str] | None = None, exclude: Collection[str] = ()
    ) -> None:
        """Fix the environment every job starts from.

        Args:
            base_env: The environment under each job's own. Default: the manager's environment
                without its ``PREEMPTIBLE_*`` variables (the admin token among them).
            exclude: Variables never passed on: the ones holding secrets, such as the queue
                tokens the config names with ``env:``. Applied to ``base_env`` too.
        """
        if base_env is None:
            base_env = _without_manager_variables(os.environ)
        excluded = frozenset(exclude)
        self._base_env = {k: v for k, v in base_env.items() if k not in excluded}
        self._children: dict[tuple[int, int], subprocess.Popen[bytes]] = {}

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        """Start one attempt in a new process group; returns once the runner process exists.

        A command that does not exist is not an error here: the runner reports exit 127 through
        :meth:`poll`, like a shell, and writes the reason to the log.

        Raises:
            QueueError: Nothing could be started: no command, a missing ``cwd``, an unwritable
                log or status directory.
        """
        what = f"job {spec.job_id} attempt {spec.attempt}"
        if not spec.command:
            raise QueueError(f"cannot start {what}: its command is empty")
        if spec.cwd is not None and not os.path.isdir(spec.cwd):
            raise QueueError(
                f"cannot start {what}: its working directory {spec.cwd!r} does not exist; "
                "create it or submit the job with another cwd"
            )
        try:
            _prepare_status_path(spec.status_path)
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(spec.log_path, "ab") as log:
                process = subprocess.Popen(
                    [*RUNNER_ARGV, "--status", str(spec.status_path), "--", *spec.command],
                    cwd=spec.cwd,
                    env=self._job_env(spec),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as error:
            raise QueueError(f"cannot start {what}: {error}") from error
        # Our unreaped child cannot vanish from /proc, so this read cannot race with its exit.
        try:
            stat = _read_proc_stat(process.pid)
        except OSError:
            stat = None  # its identity cannot be read: it cannot be found again, so it goes
        if stat is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise QueueError(f"cannot start {what}: /proc is not readable (Linux is required)")
        self._children[(process.pid, stat.start_ticks)] = process
        return ProcessHandle(
            pid=process.pid, start_ticks=stat.start_ticks, status_path=str(spec.status_path)
        )

    def poll(self, handle: ProcessHandle) -> Exit | None:
        """Return how the attempt ended, or None while any process of its group still runs.

        Once the runner has ended, the job is over: processes it left behind in its group
        (a daemonized helper, a stuck DataLoader worker) are sent SIGKILL, so that GPUs the
        manager hands on are really free, and the exit is reported when they are gone.

        Raises:
            OSError: ``/proc`` or the status file could not be read for another reason than
                their absence (ask again later: nothing is concluded from it).
        """
        state = self._runner_state(handle)
        if state is _RunnerState.RUNNING:
            return None
        if state is _RunnerState.ENDED and _live_group_members(handle.pid):
            _signal_group_quietly(handle.pid, signal.SIGKILL)
            return None
        child = self._children.pop((handle.pid, handle.start_ticks), None)
        return _exit_of(handle, state, None if child is None else child.returncode)

    def terminate(self, handle: ProcessHandle) -> None:
        """Send SIGTERM to the attempt's process group (the notice); nothing if it is gone."""
        self._signal_group(handle, signal.SIGTERM)

    def kill(self, handle: ProcessHandle) -> None:
        """Send SIGKILL to the attempt's process group; nothing if it is gone."""
        self._signal_group(handle, signal.SIGKILL)

    def alive(self, handle: ProcessHandle) -> bool:
        """Whether the handle's runner still runs: same pid and start time, not a zombie."""
        return self._runner_state(handle) is _RunnerState.RUNNING

    def _job_env(self, spec: LaunchSpec) -> dict[str, str]:
        return {
            **self._base_env,
            **spec.env,
            # The manager's GPU numbers are nvidia-smi's; CUDA's default order may differ.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in spec.gpu_ids),
        }

    def _runner_state(self, handle: ProcessHandle) -> _RunnerState:
        child = self._children.get((handle.pid, handle.start_ticks))
        if child is not None and child.poll() is None:
            return _RunnerState.RUNNING
        stat = _read_proc_stat(handle.pid)
        if stat is None:
            return _RunnerState.ENDED
        if stat.start_ticks != handle.start_ticks:
            return _RunnerState.RECYCLED
        return _RunnerState.ENDED if stat.state in "ZX" else _RunnerState.RUNNING

    def _signal_group(self, handle: ProcessHandle, signum: int) -> None:
        # A recycled pid means our group is empty: Linux frees a pid number only once no
        # process uses it as pid, process group or session id. The group id is someone else's.
        if self._runner_state(handle) is _RunnerState.RECYCLED:
            return
        try:
            os.killpg(handle.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as error:
            raise QueueError(
                f"cannot signal process group {handle.pid}: {error}; it runs as another user"
            ) from error


def _exit_of(handle: ProcessHandle, state: _RunnerState, runner_returncode: int | None) -> Exit:
    recorded = _read_status(Path(handle.status_path))
    if recorded is not None:
        return recorded
    if runner_returncode is not None and runner_returncode >= 0:
        # The runner exited on its own but could not write the file; its code is the command's.
        return Exit(exit_code=runner_returncode, signal=None, ended_at=None, how=ExitKind.EXITED)
    if runner_returncode is not None:
        return Exit(exit_code=None, signal=-runner_returncode, ended_at=None, how=ExitKind.KILLED)
    how = ExitKind.LOST if state is _RunnerState.RECYCLED else ExitKind.KILLED
    return Exit(exit_code=None, signal=None, ended_at=None, how=how)


def recorded_exit(status_path: Path) -> Exit | None:
    """The exit an attempt's runner recorded at ``status_path``, or None if it wrote none.

    For an attempt without a handle: a manager that died between a launch and saving its handle
    finds, once restarted, either the runner still running or, if it has ended, this file.
    """
    return _read_status(status_path)


_ABSENT = (
    FileNotFoundError,
    ProcessLookupError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)
"""What a read of `/proc` or of a status file may meet that means "not there (for us)"; any other
`OSError` (no descriptor left, no memory, an I/O error) says nothing of the process."""


def _read_status(path: Path) -> Exit | None:
    """The exit the runner recorded, or None if it wrote none (the rename makes it all or none).

    Raises:
        OSError: the file may exist but could not be read (no descriptor left...).
    """
    try:
        data = path.read_bytes()
    except _ABSENT:
        return None
    try:
        record = json.loads(data)
        return Exit(
            exit_code=_exact(record["exit_code"], int),
            signal=_optional(record.get("signal"), int),
            ended_at=_optional(record.get("ended_at"), float),
            how=ExitKind.EXITED,
            error=_optional(record.get("error"), str),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # not one of ours


def _prepare_status_path(path: Path) -> None:
    """Make the directory, and remove a status left by an earlier launch of the same attempt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + runner.STATUS_SUFFIX_TMP)):
        stale.unlink(missing_ok=True)


def _read_proc_stat(pid: int) -> _ProcStat | None:
    """The process's stat, or None when there is no such process.

    Raises:
        OSError: it could not be read for another reason (no file descriptor left...): the
            caller must not conclude that the process is gone.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            text = stat_file.read()
    except _ABSENT:
        return None
    # Field 2 is the command name in parentheses and may itself hold spaces and ")".
    fields = text[text.rindex(b")") + 2 :].split()
    # fields[0] is field 3 of proc(5): state; field 5 is the process group; field 22 starttime.
    return _ProcStat(
        state=fields[0].decode(), process_group=int(fields[2]), start_ticks=int(fields[19])
    )


def _live_group_members(process_group: int) -> list[int]:
    """Pids of the group's processes that are not zombies (a full scan of /proc: ~1 ms)."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _read_proc_stat(int(name))
            if stat is not None and stat.process_group == process_group and stat.state not in "ZX":
                members.append(int(name))
    return members


def _signal_group_quietly(process_group: int, signum: int) -> None:
    # Gone already, or a member we may not signal: either way nothing more can be done.
    with contextlib.suppress(OSError):
        os.killpg(process_group, signum)


def _without_manager_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(MANAGER_ONLY_PREFIX)}


def _exact(value: Any, kind: type[_T]) -> _T:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


def _optional(value: Any, kind: type[_T]) -> _T | None:
    return None if value is None else _exact(value, kind)
