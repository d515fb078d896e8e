"""Whom jobs run as, and what the manager keeps to itself: real passwd entries, real files,
real processes. The switch to another user needs root and is tested where it runs
(`test_executor.py`, `tests/integration/test_run_as.py`); the decisions are tested here for
any user, by naming the manager's uid.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from preemptible.errors import ConfigError
from preemptible.queue.core import parse_config
from preemptible.queue.service.isolation import (
    JobUser,
    check_job_users,
    job_users,
    secure_state_dir,
)
from preemptible.queue.service.manager import _secret
from preemptible.queue.service.server import build_manager
from preemptible.queue.service.store import FILE_NAME

NOBODY = 65534
"""The uid of `nobody` (Debian and most distributions): a manager that is not root."""


def config(**run_as: str):
    """Queues `a` and `b`, each with the `run_as` given for it."""
    queues = [{"name": q} | ({"run_as": run_as[q]} if q in run_as else {}) for q in "ab"]
    return parse_config({"cluster": {"gpus": 2}, "queues": queues})


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(autouse=True)
def _nobody_exists() -> None:
    try:
        JobUser.lookup("nobody")
    except KeyError:
        pytest.skip("this machine has no user `nobody`")


# --- whom jobs run as ----------------------------------------------------------------------------


def test_a_user_is_read_from_its_passwd_entry() -> None:
    user = JobUser.lookup("nobody")
    assert (user.uid, user.name) == (NOBODY, "nobody") and user.gid in user.groups
    assert user.environment() == {"HOME": user.home, "USER": "nobody", "LOGNAME": "nobody"}
    assert user.runner_ids() == f"{NOBODY}:{user.gid}:{','.join(map(str, user.groups))}"


def test_a_root_manager_switches_to_each_queues_user() -> None:
    users = job_users(config(a="nobody", b="nobody"), euid=0)
    assert users == {"a": JobUser.lookup("nobody"), "b": JobUser.lookup("nobody")}
    assert check_job_users(config(a="nobody", b="nobody"), users, euid=0) is None


def test_a_root_manager_refuses_a_missing_user_and_root_itself() -> None:
    with pytest.raises(ConfigError, match="'a': run_as = 'pq-no-such-user': there is no such"):
        job_users(config(a="pq-no-such-user"), euid=0)
    with pytest.raises(ConfigError, match="jobs never run as root"):
        job_users(config(a="root"), euid=0)


def test_a_root_manager_refuses_a_queue_without_run_as_unless_told() -> None:
    cfg = config(a="nobody")
    users = job_users(cfg, euid=0)
    with pytest.raises(ConfigError, match=r"queue\(s\) 'b' have no run_as.*security.md"):
        check_job_users(cfg, users, euid=0)
    warning = check_job_users(cfg, users, allow_jobs_as_root=True, euid=0)
    assert warning is not None and "jobs of queue(s) 'b' run as root" in warning


def test_a_manager_that_is_not_root_runs_every_job_as_itself_and_says_so() -> None:
    # run_as naming the manager's own user needs no switch; any other user needs root.
    assert job_users(config(a="nobody"), euid=NOBODY) == {}
    with pytest.raises(ConfigError, match=r"switching to another user needs root.*as nobody"):
        job_users(config(a="root"), euid=NOBODY)
    warning = check_job_users(config(), {}, euid=NOBODY)
    assert warning == (
        "single-user mode: jobs run as nobody and can read this manager's state; "
        "see docs/user-guide/security.md"
    )


# --- what the manager keeps to itself ------------------------------------------------------------


def test_the_state_folder_and_its_files_are_the_managers_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    old_umask = os.umask(0o022)
    try:
        m = build_manager(config(), state, url="http://127.0.0.1:9")
    finally:
        os.umask(old_umask)
    try:
        assert mode(state) == mode(state / "jobs") == 0o700
        for name in ("secret", FILE_NAME, FILE_NAME + "-wal", FILE_NAME + "-shm"):
            assert mode(state / name) == 0o600, name
    finally:
        m.store.close()


def test_an_older_state_folder_is_tightened_and_no_link_is_followed(tmp_path: Path) -> None:
    state, outside = tmp_path / "state", tmp_path / "outside"
    (state / "jobs" / "j1").mkdir(parents=True, mode=0o755)
    for path in (state / FILE_NAME, state / "secret", state / "jobs" / "j1" / "attempt-1.log"):
        path.write_text("x")
        path.chmod(0o644)
    outside.write_text("not the manager's")
    outside.chmod(0o644)
    (state / "a-link").symlink_to(outside)
    (state / "jobs" / "j1" / "a-link").symlink_to(outside)

    secure_state_dir(state, shared=True)  # jobs of other users pass through the folders

    assert mode(state) == mode(state / "jobs") == mode(state / "jobs" / "j1") == 0o711
    assert mode(state / FILE_NAME) == mode(state / "secret") == 0o600
    assert mode(state / "jobs" / "j1" / "attempt-1.log") == 0o600
    assert mode(outside) == 0o644


def test_a_leftover_temporary_secret_does_not_lend_the_secret_its_mode(tmp_path: Path) -> None:
    (tmp_path / "secret.tmp").write_bytes(b"")
    (tmp_path / "secret.tmp").chmod(0o644)  # O_CREAT keeps an existing file's mode
    secret = _secret(tmp_path / "secret")
    assert mode(tmp_path / "secret") == 0o600 and (tmp_path / "secret").read_bytes() == secret


def test_a_process_made_undumpable_is_so_for_the_kernel() -> None:
    code = (
        "import ctypes\n"
        "from preemptible.queue.service.isolation import make_not_dumpable\n"
        "libc = ctypes.CDLL(None)\n"
        "before = libc.prctl(3, 0, 0, 0, 0)\n"  # PR_GET_DUMPABLE
        "assert make_not_dumpable()\n"
        "print(before, libc.prctl(3, 0, 0, 0, 0))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1", "0"]
