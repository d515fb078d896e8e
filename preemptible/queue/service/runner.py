"""The job's supervisor: run CMD in this process group and leave its exit status in a file.

    python -m preemptible.queue.service.runner --status FILE [--as UID:GID:GROUPS] -- CMD [ARGS...]

The queue manager starts this runner as the leader of a new session, so the runner's pid is
also the job's process group id, and a signal to the group reaches CMD and everything CMD starts.
The runner exists for one reason: the manager may die (SIGKILL, a crash, an upgrade) while jobs
run, and a process that is not your child gives no exit status to anyone but its parent. The
runner is the parent that stays: it waits for CMD and writes ``{"exit_code", "signal",
"ended_at"}`` to FILE atomically (temp file, fsync, rename), so a restarted manager learns how a
job ended even though it never started it. The alternatives were worse: a shell wrapper
(``sh -c 'CMD; echo $? > FILE'``) is not atomic, quotes badly and dies of the group's SIGTERM
before writing; a double fork loses the status altogether.

The runner ignores SIGTERM, SIGINT and SIGHUP (CMD still gets them, from the group), so a notice
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

_USAGE = (
    "usage: python -m preemptible.queue.service.runner --status FILE [--as UID:GID:GROUPS] "
    "-- CMD [ARGS...]"
)

_NOT_THERE = (errno.ENOENT, errno.ENOTDIR)  # execvp goes on to the next folder of PATH
_Ids = tuple[int, int, list[int]]
"""(uid, gid, groups) of the user CMD runs as."""


def main(argv: list[str]) -> int:
    """Run the command, record how it ended, and return its exit status (shell style)."""
    parsed = _parse(argv)
    if parsed is None:
        print(_USAGE, file=sys.stderr)
        return 2
    status_path, ids, command = parsed
    # Ignore first: a notice that arrives between the spawn and the handler must not kill us.
    for ignored in _IGNORED:
        signal.signal(ignored, signal.SIG_IGN)
    try:
        if ids is None:
            pid = os.posix_spawnp(command[0], command, os.environ, setsigdef=_DEFAULT_IN_CMD)
        else:
            pid = _spawn_as(command, ids, _environment_from_stdin())
    except OSError as error:
        return _report_spawn_failure(status_path, command[0], error)
    _, wait_status = os.waitpid(pid, 0)
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    exit_code = 128 + signum if signum is not None else os.WEXITSTATUS(wait_status)
    _write_status(status_path, _status_json(exit_code, signum))
    return exit_code


def _parse(argv: list[str]) -> tuple[str, _Ids | None, list[str]] | None:
    if len(argv) < 3 or argv[0] != "--status" or not argv[1]:
        return None
    status_path, rest = argv[1], argv[2:]
    ids = None
    if rest[:1] == ["--as"]:
        ids = _parse_ids(rest[1] if len(rest) > 1 else "")
        if ids is None:
            return None
        rest = rest[2:]
    command = rest[1:] if rest[:1] == ["--"] else rest
    return (status_path, ids, command) if command else None


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


def _report_spawn_failure(status_path: str, program: str, error: OSError) -> int:
    import json  # only on this path: it costs milliseconds that every start would pay

    exit_code = EXIT_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_NOT_EXECUTABLE
    message = f"cannot start {program!r}: {error.strerror or error}"
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
