"""Run each admitted job as its own process group, and find it again after a manager restart.

Every attempt runs under ``runner.py`` (see there), which leads a new session: its pid is the
group id, and the runner writes the exit status to a file. A group does not hold every process
of a job (``setsid`` leaves it), so the attempt is also contained as ``containment.py`` chose
when the executor was made: in a cgroup of its own, whose every process is signalled, or under
a runner that is a child subreaper, whose every descendant is; the group alone only where the
host offers neither. An attempt has ended once none of its processes is left; only then are
its GPUs handed on.

The status file is what makes a restart harmless: a manager started again holds no child
processes and gets no ``waitpid`` status, so it re-adopts a job from its persisted
:class:`ProcessHandle` and learns the exit from the file. A pid alone is not an identity (the
kernel recycles them), so the handle also keeps the runner's start time in clock ticks
(``/proc/<pid>/stat`` field 22); a pid whose start time differs is another process, and is
never signalled.

Rejected: a systemd transient unit (needs a user session manager we cannot assume on a shared
machine); pidfds (they do not survive our own restart).

Nothing here blocks for long: ``poll`` reads a few small files (and scans ``/proc``, about a
millisecond, once a runner has ended) and is meant to be called every second for every running
job; a signal to a cgroup freezes it for the few milliseconds its list takes to signal. Linux
only (``/proc``).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, NamedTuple, TypeVar

from preemptible._env_names import PREFIX as MANAGER_ONLY_PREFIX
from preemptible.errors import QueueError, StateStoreError
from preemptible.queue.service import containment as containment_module
from preemptible.queue.service import runner
from preemptible.queue.service.containment import CGROUP_DIR, Containment, Mechanism
from preemptible.queue.service.isolation import (
    PASSAGE_FOLDER,
    PRIVATE_FILE,
    PRIVATE_FOLDER,
    JobUser,
    job_base_environment,
)

_T = TypeVar("_T")

RUNNER_ARGV = (sys.executable, "-I", "-S", runner.__file__)
"""How the runner starts: as a script in isolated mode, untouched by the job's PYTHON* variables
and by ``preemptible/__init__.py``, in about 12 ms."""

log = logging.getLogger("preemptible.queue")


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
    run_as: JobUser | None = None
    """The user the job runs as (the runner switches to it); None: the manager's own user. The
    job then starts from a clean environment (``PATH``, ``LANG``, who it is), not the manager's."""
    own_dir: Path | None = None
    """A folder made the job's own (its user's, 0700): its cost file is written there."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessHandle:
    """What the manager persists to find a running attempt again after a restart."""

    pid: int
    """The runner's pid, which is also the attempt's process group id."""
    start_ticks: int
    """The runner's start time (field 22 of ``/proc/<pid>/stat``): a recycled pid differs here."""
    status_path: str
    """Where the runner writes the exit status."""
    cgroup: str | None = None
    """The attempt's own cgroup (every process of it is listed there); None when it has none."""
    subreaper: bool = False
    """Whether the runner is a child subreaper (every process of the attempt descends from it)."""

    def __post_init__(self) -> None:
        # Every process listed in this cgroup is signalled and killed: never take a cgroup that
        # is not an attempt's (a corrupt state file naming a hierarchy's root) for one.
        if self.cgroup is not None and Path(self.cgroup).parent.name != CGROUP_DIR:
            raise StateStoreError(
                f"a stored process handle is unreadable: it names {self.cgroup!r}, which is "
                f"not the cgroup of a job attempt (those are in a folder named {CGROUP_DIR!r}); "
                "check that the job's processes are gone, then requeue or cancel the job"
            )

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
                # A handle stored before containment existed has neither: its group is the job.
                cgroup=_optional(data.get("cgroup"), str),
                subreaper=_flag(data.get("subreaper", False)),
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
    runner's parent is init, and ``/proc`` plus the status file tell us everything. How an
    attempt is contained is in its handle, so an adopted one is reached as it was started.
    """

    def __init__(
        self,
        *,
        base_env: Mapping[str, str] | None = None,
        exclude: Collection[str] = (),
        containment: Containment | Mechanism | None = None,
    ) -> None:
        """Fix the environment every job starts from, and how its processes are kept together.

        Args:
            base_env: The environment under each job's own. Default: the manager's environment
                without its ``PREEMPTIBLE_*`` variables (the admin token among them).
            exclude: Variables never passed on: the ones holding secrets, such as the queue
                tokens the config names with ``env:``. Applied to ``base_env`` too.
            containment: How new attempts are contained. Default: the strongest mechanism this
                host offers (:func:`containment.choose`, probed now, once). A `Mechanism` forces
                that one (tests do, to run the subreaper where cgroups work too).

        Raises:
            QueueError: The mechanism asked for does not work on this host.
        """
        if base_env is None:
            base_env = _without_manager_variables(os.environ)
        excluded = frozenset(exclude)
        self._base_env = {k: v for k, v in base_env.items() if k not in excluded}
        self._children: dict[tuple[int, int], subprocess.Popen[bytes]] = {}
        if not isinstance(containment, Containment):
            containment = containment_module.choose(containment)
        self.containment = containment
        """How this executor contains the attempts it launches."""

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
        env = self._job_env(spec)
        # A job of another user: its variables go to the runner on stdin, never into the
        # environment of the runner, which keeps the manager's privileges (see runner.py).
        switch = [] if spec.run_as is None else ["--as", spec.run_as.runner_ids()]
        cgroup = self.containment.new_cgroup(spec.job_id, spec.attempt)
        options = self.containment.runner_options(cgroup)  # joined before any switch of user
        argv = [*RUNNER_ARGV, "--status", str(spec.status_path), *switch, *options]
        try:
            log = _open_job_files(spec)
            _prepare_status_path(spec.status_path)
            with log:
                process = subprocess.Popen(
                    [*argv, "--", *spec.command],
                    cwd=_working_directory(spec),
                    env=env if spec.run_as is None else {},
                    stdin=subprocess.DEVNULL if spec.run_as is None else subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as error:
            if cgroup is not None:
                containment_module.remove_cgroup(cgroup)
            raise QueueError(f"cannot start {what}: {error}") from error
        if cgroup is not None:
            # In the cgroup before this returns: a notice sent while the runner is still starting
            # (it joins by itself too, but some milliseconds later) must not find it empty.
            with contextlib.suppress(OSError):
                runner.write_control(cgroup, "cgroup.procs", str(process.pid))
        if process.stdin is not None:
            _hand_environment(process.stdin, env)
        # Our unreaped child cannot vanish from /proc, so this read cannot race with its exit.
        try:
            stat = _read_proc_stat(process.pid)
        except ProcUnreadableError:
            stat = None
        if stat is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise QueueError(f"cannot start {what}: /proc is not readable (Linux is required)")
        self._children[(process.pid, stat.start_ticks)] = process
        return ProcessHandle(
            pid=process.pid,
            start_ticks=stat.start_ticks,
            status_path=str(spec.status_path),
            cgroup=cgroup,
            subreaper=self.containment.mechanism is Mechanism.SUBREAPER,
        )

    def poll(self, handle: ProcessHandle) -> Exit | None:
        """Return how the attempt ended, or None while any process of it still runs.

        Once the runner has ended, the job is over: processes left behind (a daemonized
        helper, a stuck DataLoader worker) are sent SIGKILL, so that GPUs the manager hands on
        are really free, and the exit is reported when they are gone. The runner does the same
        before it writes the status; this covers a runner that was killed.
        """
        try:
            state = self._runner_state(handle)
            if state is _RunnerState.RUNNING:
                return None
            if self._kill_leftovers(handle, state):
                return None
            child = self._children.get((handle.pid, handle.start_ticks))
            ended = _exit_of(handle, state, None if child is None else child.returncode)
        except ProcUnreadableError as error:
            _warn_unreadable(error)
            return None  # not known to have ended: asked again at the next poll
        if handle.cgroup is not None:
            containment_module.remove_cgroup(handle.cgroup)
        self._children.pop((handle.pid, handle.start_ticks), None)
        return ended

    def terminate(self, handle: ProcessHandle) -> None:
        """Send SIGTERM to every process of the attempt (the notice); nothing if it is gone."""
        self._signal(handle, signal.SIGTERM)

    def kill(self, handle: ProcessHandle) -> None:
        """Send SIGKILL to every process of the attempt; nothing if it is gone.

        In a cgroup, or a group alone, the runner dies too and the exit is ``killed``. A
        subreaper runner is spared, to reap what it adopted; it records the command's SIGKILL.
        """
        self._signal(handle, signal.SIGKILL)

    def adopt(self, handle: ProcessHandle) -> None:
        """Take back an attempt found running after a restart of the manager: its cgroup is
        thawed, in case the last manager died between freezing it for a signal and thawing it
        (the job would otherwise hang, holding its GPUs, until it is told to go)."""
        if handle.cgroup is not None:
            containment_module.thaw(handle.cgroup)

    def alive(self, handle: ProcessHandle) -> bool:
        """Whether the handle's runner still runs: same pid and start time, not a zombie.

        When ``/proc`` cannot be read (no file descriptor left, say), the answer is yes: a live
        job taken for gone would be killed or run twice.
        """
        try:
            return self._runner_state(handle) is _RunnerState.RUNNING
        except ProcUnreadableError as error:
            _warn_unreadable(error)
            return True

    def _job_env(self, spec: LaunchSpec) -> dict[str, str]:
        user = spec.run_as
        return {
            **(self._base_env if user is None else job_base_environment(self._base_env, user)),
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

    def _signal(self, handle: ProcessHandle, signum: int) -> None:
        try:
            if handle.cgroup is not None:
                # The kernel's list: whatever the job did, and whoever has the pids now.
                containment_module.signal_cgroup(handle.cgroup, signum)
                return
            # A recycled pid means our group is empty: Linux frees a pid number only once no
            # process uses it as pid, process group or session id. The group id is someone else's.
            # Unknown (an unreadable /proc): the group is ours unless it emptied and was reused.
            try:
                state = self._runner_state(handle)
            except ProcUnreadableError as error:
                _warn_unreadable(error)
                state = _RunnerState.RUNNING
            if state is _RunnerState.RECYCLED:
                return
            if handle.subreaper and state is _RunnerState.RUNNING:
                # Every process of the job descends from its runner: orphans are adopted by it.
                for pid in runner.descendants(handle.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)
                return
            os.killpg(handle.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as error:
            raise QueueError(
                f"cannot signal the processes of the job of runner {handle.pid}: {error}; "
                "they run as another user"
            ) from error

    def _kill_leftovers(self, handle: ProcessHandle, state: _RunnerState) -> bool:
        """SIGKILL what is left of an attempt whose runner has ended; whether anything was."""
        left = False
        if handle.cgroup is not None and runner.cgroup_pids(handle.cgroup):
            with contextlib.suppress(OSError):
                containment_module.signal_cgroup(handle.cgroup, signal.SIGKILL)
            left = True
        if state is _RunnerState.ENDED and _live_group_members(handle.pid):
            _signal_group_quietly(handle.pid, signal.SIGKILL)
            left = True
        return left


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
        ProcUnreadableError: the file may exist but could not be read (no descriptor left...).
    """
    try:
        data = path.read_bytes()
    except _ABSENT:
        return None
    except OSError as error:
        raise ProcUnreadableError(f"cannot read {path}: {error}") from error
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


class ProcUnreadableError(QueueError):
    """``/proc`` could not be read for another reason than the process being gone (EMFILE,
    ENFILE, EACCES...): whether it lives is unknown, and it must never be taken for gone."""


_warned_unreadable = 0.0


def _warn_unreadable(error: ProcUnreadableError) -> None:
    """Log an unreadable ``/proc`` at most once a minute (a poll runs five times a second)."""
    global _warned_unreadable
    now = time.monotonic()
    if now - _warned_unreadable >= 60.0:
        _warned_unreadable = now
        log.warning("%s; the job is taken as still running until /proc can be read", error)


def _hand_environment(pipe: IO[bytes], env: Mapping[str, str]) -> None:
    """Write the job's environment to its runner's stdin, as the runner reads it."""
    data = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items())
    # A runner that died before reading it reports its own exit; there is nothing to add.
    with contextlib.suppress(OSError), pipe:
        pipe.write(data)


def _open_job_files(spec: LaunchSpec) -> BinaryIO:
    """Make the attempt's folders and open its log for appending.

    A folder made here is the manager's: 0711 for a job of another user (it passes through to
    its files but neither lists nor writes the folder), else 0700. The log is 0600 and its
    user's. Nothing here follows a link: the manager may be root.
    """
    user = spec.run_as
    for folder in (spec.log_path.parent, spec.status_path.parent):
        _make_folder(folder, PRIVATE_FOLDER if user is None else PASSAGE_FOLDER)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(spec.log_path, flags, PRIVATE_FILE)
    try:
        if user is not None:
            os.fchown(fd, user.uid, user.gid)
        os.fchmod(fd, PRIVATE_FILE)
        if spec.own_dir is not None:
            _make_folder(spec.own_dir, PRIVATE_FOLDER)
            if user is not None:
                os.chown(spec.own_dir, user.uid, user.gid, follow_symlinks=False)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def _make_folder(folder: Path, mode: int) -> None:
    """Create ``folder`` (and its parents) with ``mode`` whatever the umask; one that exists is
    left as it is (`isolation.secure_state_dir` sets the modes of those at start)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=mode)
    except FileExistsError:
        return
    os.chmod(folder, mode)


def _working_directory(spec: LaunchSpec) -> str | None:
    """The job's ``cwd``; without one, a job of another user starts in its home (or in ``/``
    when it has none), never in the manager's folder."""
    if spec.cwd is not None or spec.run_as is None:
        return spec.cwd
    return spec.run_as.home if os.path.isdir(spec.run_as.home) else "/"


def _read_proc_stat(pid: int) -> _ProcStat | None:
    """The process's stat line, or None when no such process exists.

    Raises:
        ProcUnreadableError: the file exists or may exist but could not be read.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            text = stat_file.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as error:
        raise ProcUnreadableError(f"cannot read /proc/{pid}/stat: {error}") from error
    # Field 2 is the command name in parentheses and may itself hold spaces and ")".
    fields = text[text.rindex(b")") + 2 :].split()
    # fields[0] is field 3 of proc(5): state; field 5 is the process group; field 22 starttime.
    return _ProcStat(
        state=fields[0].decode(), process_group=int(fields[2]), start_ticks=int(fields[19])
    )


def _live_group_members(process_group: int) -> list[int]:
    """Pids of the group's processes that are not zombies (a full scan of /proc: ~1 ms)."""
    members = []
    try:
        names = os.listdir("/proc")
    except OSError as error:
        raise ProcUnreadableError(f"cannot list /proc: {error}") from error
    for name in names:
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


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _optional(value: Any, kind: type[_T]) -> _T | None:
    return None if value is None else _exact(value, kind)
