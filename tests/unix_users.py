"""Unix users made for a test (root only): the queue manager's `run_as` switches jobs to them."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd: the test creates Unix users and switches jobs to them "
    "(CI runs as root)",
)


class UnixUser:
    """A user made for the test, from its passwd entry."""

    def __init__(self, name: str):
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.home = name, entry.pw_uid, entry.pw_gid, entry.pw_dir
        self.groups = sorted(set(os.getgrouplist(name, entry.pw_gid)))


@contextlib.contextmanager
def made_users(count: int) -> Iterator[list[UnixUser]]:
    """`count` system users with names unique to this run, the first also in an extra group.

    Removed at the end, after any process of theirs is killed: the users are new, so every
    such process was started by the test (its managers' jobs).
    """
    tag = secrets.token_hex(3)
    group = f"pq-g-{tag}"
    names = [f"pq-{chr(ord('a') + i)}-{tag}" for i in range(count)]
    made: list[str] = []
    try:
        subprocess.run(["groupadd", "--system", group], check=True)
        for i, name in enumerate(names):
            extra = ["-G", group] if i == 0 else []
            subprocess.run(["useradd", "--system", *extra, name], check=True)
            made.append(name)
        yield [UnixUser(name) for name in names]
    finally:
        uids = {pwd.getpwnam(name).pw_uid for name in made}
        for pid in _processes_of(uids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name in made:
            subprocess.run(["userdel", name], check=False)
        subprocess.run(["groupdel", group], check=False)


def runs_as(user: UnixUser, argv: list[str], env: dict[str, str] | None = None) -> bool:
    """Whether `argv` runs and succeeds as `user` (an interpreter in root's home does not)."""
    try:
        done = subprocess.run(argv, user=user.name, env=env, capture_output=True, cwd="/")
    except OSError:  # the user may not even execute it
        return False
    return done.returncode == 0


def _processes_of(uids: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    found.append(int(entry))
    return found
