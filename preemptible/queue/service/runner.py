"""The job's supervisor: run CMD in this process group and leave its exit status in a file.

    python -m preemptible.queue.service.runner --status FILE [--as UID:GID:GROUPS] \
        [--cgroup DIR | --subreaper] -- CMD [ARGS...]

The queue manager starts this runner as the leader of a new session, so the runner's pid is
also the job's process group id, and a signal to the group reaches CMD and everything CMD starts.
The runner exists for one reason: the manager may die (SIGKILL, a crash, an upgrade) while jobs
run, and a process that is not your child gives no exit status to anyone but its parent. The
runner is the parent that stays: it waits for CMD and writes ``{"exit_code", "signal",
"ended_at"}`` to FILE atomically (temp file, fsync, rename), so a restarted manager learns how a
job ended even though it never started it. The alternatives were worse: a shell wrapper
(``sh -c 'CMD; echo $? > FILE'``) is not atomic, quotes badly and dies of the group's SIGTERM
before writing; a double fork loses the status altogether.

A process group does not hold a job: a process that calls ``setsid()`` (any launcher that
daemonises) leaves it. So the runner also keeps every process of the job where the executor
can find it (``containment.py`` chooses how, once per manager):

- ``--cgroup DIR``: the runner moves itself into the attempt's cgroup before it starts CMD, so
  CMD and everything CMD starts are in it, ``setsid`` or not; the executor signals (and
  freezes, and kills) every process listed in ``DIR/cgroup.procs``.
- ``--subreaper``: the runner becomes a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so
  an orphan of the job (a double fork) becomes the runner's child instead of init's, and every
  process of the job stays a descendant of the runner, which the executor finds in ``/proc``.

Either way the job is over only when none of its processes is left: once CMD has ended, the
runner kills what it left behind and writes the status only when nothing is left, so a
status file means that the job's GPUs are free.

The runner ignores SIGTERM, SIGINT and SIGHUP (CMD still gets them, from the executor), so a notice
cannot kill it before it has written the status; only SIGKILL can, and then there is no file and
the executor reports the job as killed. CMD starts with those signals back at their defaults.

With ``--as``, CMD runs as another user (its uid, primary group and comma-separated groups; the
manager is root and the queue has ``run_as``): the runner forks, switches, enters its working
directory again as that user and executes CMD. The runner stays the manager's user, so the job
can neither signal it nor forge the status file, which is the manager's (0600). The job's
environment then comes on stdin (``KEY=VALUE`` items, each ended by a NUL byte), not in the
runner's own: a variable the team chose (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LOCPATH``...)
must never reach a process with the manager's privileges. CMD's stdin is ``/dev/null``.

It runs between a job's admission and its first instruction, so it imports only builtin modules
(no argparse, no json on the normal path, nothing of ``preemptible``): the executor runs this
file as a script with ``python -I -S``, so neither the package's ``__init__`` nor the job's
``PYTHON*`` variables can slow it down or break it.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time

STATUS_SUFFIX_TMP = ".tmp"
"""The status is written to FILE + this suffix first, then renamed over FILE."""

EXIT_NOT_FOUND = 127
"""CMD does not exist (the shell's convention)."""

EXIT_NOT_EXECUTABLE = 126
"""CMD exists but cannot be executed (the shell's convention)."""

_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Python ignores SIGPIPE and SIGXFSZ for itself; CMD must get the defaults back, as subprocess does.
_DEFAULT_IN_CMD = (*_IGNORED, signal.SIGPIPE, signal.SIGXFSZ)

PR_SET_CHILD_SUBREAPER = 36
"""prctl(2): orphaned descendants are re-parented to this process (Linux 3.4 and later)."""

LEFTOVER_POLL_S = 0.005
"""While processes CMD left behind are being killed, how often the runner looks again."""

_USAGE = (
    "usage: python -m preemptible.queue.service.runner --status FILE [--as UID:GID:GROUPS] "
    "[--cgroup DIR | --subreaper] -- CMD [ARGS...]"
)

_NOT_THERE = (errno.ENOENT, errno.ENOTDIR)  # execvp goes on to the next folder of PATH
_Ids = tuple[int, int, list[int]]
"""(uid, gid, groups) of the user CMD runs as."""


def main(argv: list[str]) -> int:
    """Run the command, record how it ended, and return its exit status (shell style)."""
    parsed = parse(argv)
    if parsed is None:
        print(_USAGE, file=sys.stderr)
        return 2
    status_path, command, cgroup, subreaper, ids = parsed
    # Ignore first: a notice that arrives between the spawn and the handler must not kill us.
    for ignored in _IGNORED:
        signal.signal(ignored, signal.SIG_IGN)
    refused = _contain(cgroup, subreaper)  # before any switch: joining takes the manager's rights
    if refused is not None:
        return _report_failure(status_path, EXIT_NOT_EXECUTABLE, refused)
    try:
        if ids is None:
            pid = os.posix_spawnp(command[0], command, os.environ, setsigdef=_DEFAULT_IN_CMD)
        else:
            pid = _spawn_as(command, ids, _environment_from_stdin())
    except OSError as error:
        return _report_spawn_failure(status_path, command[0], error)
    wait_status = _wait(pid, cgroup, subreaper)
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    exit_code = 128 + signum if signum is not None else os.WEXITSTATUS(wait_status)
    _write_status(status_path, _status_json(exit_code, signum))
    return exit_code


def parse(argv: list[str]) -> tuple[str, list[str], str | None, bool, _Ids | None] | None:
    """(status file, command, cgroup or None, subreaper, user ids or None) from the runner's
    arguments (those after the script), or None if they are not the runner's. A restarted
    manager reads the arguments of a runner it finds in ``/proc`` with this too."""
    if len(argv) < 3 or argv[0] != "--status" or not argv[1]:
        return None
    rest, cgroup, subreaper, ids = argv[2:], None, False, None
    while rest and rest[0] in ("--as", "--cgroup", "--subreaper"):
        if rest[0] == "--subreaper":
            subreaper, rest = True, rest[1:]
        elif len(rest) < 2 or not rest[1]:
            return None
        elif rest[0] == "--cgroup":
            cgroup, rest = rest[1], rest[2:]
        else:
            ids = _parse_ids(rest[1])
            if ids is None:
                return None
            rest = rest[2:]
    command = rest[1:] if rest[:1] == ["--"] else rest
    return (argv[1], command, cgroup, subreaper, ids) if command else None


def _parse_ids(text: str) -> _Ids | None:
    try:
        uid, gid, groups = text.split(":")
        return int(uid), int(gid), [int(g) for g in groups.split(",") if g]
    except ValueError:
        return None


def _environment_from_stdin() -> dict[str, str]:
    """The job's environment, read from stdin to its end; stdin is ``/dev/null`` afterwards."""
    data = b""
    while chunk := os.read(0, 65536):
        data += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    env = {}
    for item in data.split(b"\0"):
        key, equals, value = item.partition(b"=")
        if key and equals:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def _spawn_as(command: list[str], ids: _Ids, env: dict[str, str]) -> int:
    """Start CMD as another user; posix_spawn cannot switch users, so fork and exec.

    The child drops to the user (groups, then gid, then uid: each needs the privilege the next
    one removes), enters the working directory again as that user (a folder it may not enter
    fails here, not later) and executes CMD, searching the job's ``PATH`` as ``execvp`` does.
    It imports nothing once it has switched (the user may not read this Python's library): the
    candidates are found first. A failure comes back through a close-on-exec pipe as
    ``STEP:ERRNO``, as subprocess does it; an exec that works closes the pipe empty.
    """
    uid, gid, groups = ids
    program = command[0]
    if "/" in program:
        candidates = [program]
    else:
        search = env.get("PATH", os.defpath).split(os.pathsep)
        candidates = [os.path.join(folder or ".", program) for folder in search]
    read_end, write_end = os.pipe()  # close-on-exec, as every fd Python opens
    pid = os.fork()
    if pid == 0:  # the child: it never returns
        step, code = "switch", 0
        try:
            os.close(read_end)
            for signum in _DEFAULT_IN_CMD:
                signal.signal(signum, signal.SIG_DFL)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            step = "chdir"
            os.chdir(os.getcwd())
            step = "exec"
            for candidate in candidates:
                try:
                    os.execve(candidate, command, env)
                except OSError as error:  # the first telling error wins, as in a shell
                    number = error.errno or 0
                    if number == errno.EACCES and not _visible(candidate):
                        number = errno.ENOENT  # a folder of PATH the user may not search
                    if code == 0 or code in _NOT_THERE:
                        code = number
        except OSError as error:
            code = error.errno or 0
        finally:
            os.write(write_end, f"{step}:{code}".encode())
            os._exit(EXIT_NOT_EXECUTABLE)
    os.close(write_end)
    report = b""
    while chunk := os.read(read_end, 64):
        report += chunk
    os.close(read_end)
    if not report:
        return pid
    os.waitpid(pid, 0)
    failed, _, errno_text = report.decode().partition(":")
    failure = int(errno_text)
    reason = os.strerror(failure)
    if failed == "switch":
        reason = f"cannot switch to uid {uid}: {reason}"
    elif failed == "chdir":
        reason = f"cannot enter {os.getcwd()} as uid {uid}: {reason}"
    raise OSError(failure, reason)  # FileNotFoundError for ENOENT: exit 127, like a shell


def _visible(path: str) -> bool:
    """Whether this process sees a file at ``path`` (it may still be unable to execute it)."""
    try:
        os.stat(path)
    except OSError:
        return False
    return True


def _contain(cgroup: str | None, subreaper: bool) -> str | None:
    """Make every process CMD will start one the executor can find; None, or why not."""
    if cgroup is not None:
        try:
            joined = write_control(cgroup, "cgroup.procs", str(os.getpid()))
        except OSError as error:
            return f"cannot join the job's cgroup {cgroup}: {error.strerror or error}"
        if not joined:
            return f"cannot join the job's cgroup {cgroup}: it does not exist"
    if subreaper:
        import ctypes  # only on this path (~4 ms); ctypes imports nothing heavy

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            reason = os.strerror(ctypes.get_errno())
            return f"cannot become the child subreaper of the job: {reason}"
    return None


def _wait(pid: int, cgroup: str | None, subreaper: bool) -> int:
    """Wait for CMD, then end what it left behind; CMD's wait status."""
    if not subreaper:
        _, wait_status = os.waitpid(pid, 0)
    else:
        while True:  # as a subreaper, the job's orphans are our children too: reap them all
            child, wait_status = os.waitpid(-1, 0)
            if child == pid:
                break
        _end_descendants()
    if cgroup is not None:
        _end_cgroup(cgroup)
    return wait_status


def _end_descendants() -> None:
    """SIGKILL every descendant, and reap until no child is left: as a subreaper, the runner
    adopts the orphans of those it kills, so no child left means no descendant left."""
    me = os.getpid()
    while True:
        # Our children first, from one small file: an orphan is one the moment it is orphaned,
        # so one that forks and exits again and again is caught before it forks once more.
        for pid in _children(me):
            _kill_quietly(pid, signal.SIGKILL)
        for pid in descendants(me):
            _kill_quietly(pid, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(LEFTOVER_POLL_S)


def _end_cgroup(cgroup: str) -> None:
    """SIGKILL every other process of the cgroup until it holds the runner alone (a killed
    process forks no more, so this ends even while a fork bomb runs)."""
    me = os.getpid()
    while [pid for pid in cgroup_pids(cgroup) if pid != me]:
        signal_cgroup(cgroup, signal.SIGKILL, spare=me)
        time.sleep(LEFTOVER_POLL_S)


def cgroup_pids(cgroup: str) -> list[int]:
    """The processes in a cgroup (not its zombies); [] when the cgroup does not exist."""
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "rb") as procs:
            return [int(pid) for pid in procs.read().split()]
    except FileNotFoundError:
        return []


def signal_cgroup(cgroup: str, signum: int, *, spare: int = 0) -> None:
    """Send ``signum`` to every process in the cgroup but ``spare``, reading the list again
    until it shows none not yet signalled: a process forked meanwhile gets it too."""
    signalled: set[int] = set()
    while True:
        members = [pid for pid in cgroup_pids(cgroup) if pid != spare and pid not in signalled]
        if not members:
            return
        for pid in members:
            _kill_quietly(pid, signum)
        signalled.update(members)


def descendants(root: int) -> list[int]:
    """The live descendants of ``root``, from the parent pids in ``/proc`` (about 1 ms)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat_file:
                text = stat_file.read()
        except OSError:
            continue  # gone meanwhile
        # After the command name (in parentheses, may hold anything): state, then parent pid.
        fields = text[text.rindex(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X"):  # a zombie has no live children: they moved on
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _children(pid: int) -> list[int]:
    """The children of a single-threaded process, as the kernel lists them (no scan)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as children:
            return [int(child) for child in children.read().split()]
    except OSError:
        return []  # a kernel without CONFIG_PROC_CHILDREN: the scan finds them


def _kill_quietly(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False  # it ended meanwhile
    return True


def _report_spawn_failure(status_path: str, program: str, error: OSError) -> int:
    exit_code = EXIT_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_NOT_EXECUTABLE
    return _report_failure(
        status_path, exit_code, f"cannot start {program!r}: {error.strerror or error}"
    )


def _report_failure(status_path: str, exit_code: int, message: str) -> int:
    """CMD did not run: say why on stderr (the job's log) and in the status file."""
    import json  # only on this path: it costs milliseconds that every start would pay

    print(f"preemptible runner: {message}", file=sys.stderr, flush=True)
    record = json.loads(_status_json(exit_code, None))
    record["error"] = message
    _write_status(status_path, json.dumps(record))
    return exit_code


def _status_json(exit_code: int, signum: int | None) -> str:
    signal_field = "null" if signum is None else str(signum)
    return f'{{"exit_code": {exit_code}, "signal": {signal_field}, "ended_at": {time.time()!r}}}'


def _write_status(status_path: str, text: str) -> None:
    """Write the status atomically: readers see no file or the whole file, never a torn one."""
    tmp_path = status_path + STATUS_SUFFIX_TMP
    try:
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, status_path)
        _fsync_directory(os.path.dirname(status_path) or ".")
    except OSError as error:
        # The exit code still reaches our parent; a manager that restarted will see "killed".
        print(f"preemptible runner: cannot write {status_path}: {error}", file=sys.stderr)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_control(cgroup: str, name: str, text: str) -> bool:
    """Write to a control file of a cgroup; False when there is no such file (none is made)."""
    try:
        fd = os.open(os.path.join(cgroup, name), os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
