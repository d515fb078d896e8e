"""The job's supervisor: run CMD in this process group and leave its exit status in a file.

    python -m preemptible.queue.service.runner --status FILE -- CMD [ARGS...]

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

It runs between a job's admission and its first instruction, so it imports only builtin modules
(no argparse, no json on the normal path, nothing of ``preemptible``): the executor runs this
file as a script with ``python -I -S``, so neither the package's ``__init__`` nor the job's
``PYTHON*`` variables can slow it down or break it.
"""

from __future__ import annotations

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

_USAGE = "usage: python -m preemptible.queue.service.runner --status FILE -- CMD [ARGS...]"


def main(argv: list[str]) -> int:
    """Run the command, record how it ended, and return its exit status (shell style)."""
    parsed = _parse(argv)
    if parsed is None:
        print(_USAGE, file=sys.stderr)
        return 2
    status_path, command = parsed
    # Ignore first: a notice that arrives between the spawn and the handler must not kill us.
    for ignored in _IGNORED:
        signal.signal(ignored, signal.SIG_IGN)
    try:
        pid = os.posix_spawnp(command[0], command, os.environ, setsigdef=_DEFAULT_IN_CMD)
    except OSError as error:
        return _report_spawn_failure(status_path, command[0], error)
    _, wait_status = os.waitpid(pid, 0)
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    exit_code = 128 + signum if signum is not None else os.WEXITSTATUS(wait_status)
    _write_status(status_path, _status_json(exit_code, signum))
    return exit_code


def _parse(argv: list[str]) -> tuple[str, list[str]] | None:
    if len(argv) < 3 or argv[0] != "--status" or not argv[1]:
        return None
    command = argv[3:] if argv[2] == "--" else argv[2:]
    return (argv[1], command) if command else None


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
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
