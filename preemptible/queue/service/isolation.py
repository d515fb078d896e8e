"""A job is not the manager: whom each queue's jobs run as, and what the manager keeps private.

The manager holds secrets no job may read: the admin token and every queue's token (in its
environment), and the secret every job token is derived from (in its state folder). A job
that runs as the manager's own Unix user reads them all through ``/proc/<pid>/environ`` and the
state folder. So, when the manager runs as root, every queue names the Unix user its jobs run as
(``run_as = "alice"``), and the runner switches to that user (uid, gid, supplementary groups)
just before it starts the job; the runner itself stays the manager's, so it can still write the
job's status and the job cannot kill it. A manager that is not root cannot switch users: it runs
in single-user mode and says so when it starts. The trust model: docs/user-guide/security.md.

What stays private whatever the mode:

- the manager is not dumpable (``prctl(PR_SET_DUMPABLE, 0)``): its ``/proc/<pid>/environ``,
  ``mem`` and ``fd`` are closed to other processes of its own user;
- the state folder is the manager's (0700; 0711 when jobs run as other users, so that a job may
  pass through to its own files but not list the folder), and every file in it is 0600: the
  SQLite file with its ``-wal`` and ``-shm``, and the secret;
- a job's folder lets it pass (0711) but neither list nor write it; its logs are its user's
  alone (0600), and its ``cost/`` folder, where its cost file goes, is its user's to write.
  Nothing the manager opens there can be replaced by the job: the manager may be root, and a
  link planted in a folder it writes must never point it at another file.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from preemptible.errors import ConfigError, StateStoreError
from preemptible.queue.core import QueueConfig

SECURITY_DOC = "docs/user-guide/security.md"
"""Where the trust model is explained; named in every warning and refusal."""

JOBS_FOLDER = "jobs"
"""The state folder's sub-folder with one folder per job: its logs, status files and cost."""

PRIVATE_FOLDER = 0o700
"""A folder of the manager's that nobody else enters."""
PASSAGE_FOLDER = 0o711
"""A folder of the manager's that jobs of other users may pass through but not list."""
PRIVATE_FILE = 0o600
"""A file of one user alone: the manager's state, or a job's log (then owned by its user)."""

_PR_SET_DUMPABLE = 4  # <linux/prctl.h>
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, kw_only=True, slots=True)
class JobUser:
    """The Unix user a queue's jobs run as, from its passwd entry."""

    name: str
    """The user's name, as ``run_as`` gives it."""
    uid: int
    """Its user id."""
    gid: int
    """Its primary group."""
    groups: tuple[int, ...]
    """Every group it belongs to (the primary one included), as ``initgroups`` would set."""
    home: str
    """Its home folder (``HOME``; the job's working directory when the job names none)."""

    @classmethod
    def lookup(cls, name: str) -> JobUser:
        """The user called ``name`` on this machine.

        Raises:
            KeyError: There is no such user.
        """
        entry = pwd.getpwnam(name)
        groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
        return cls(name=name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=entry.pw_dir)

    def runner_ids(self) -> str:
        """The ids as the runner's ``--as`` option takes them: ``UID:GID:G1,G2,...``."""
        return f"{self.uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"

    def environment(self) -> dict[str, str]:
        """The variables that say who the job is: ``HOME``, ``USER``, ``LOGNAME``."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def job_users(config: QueueConfig, *, euid: int | None = None) -> dict[str, JobUser]:
    """Queue name -> the user its jobs switch to, for the queues whose ``run_as`` needs a switch.

    A manager that is not root switches nobody: a ``run_as`` that names its own user is
    fulfilled without a switch, and any other is refused.

    Args:
        config: The configuration; its ``run_as`` names the users.
        euid: The manager's effective user id (default: this process's).

    Raises:
        ConfigError: A user does not exist, is root, or cannot be switched to without root.
    """
    euid = os.geteuid() if euid is None else euid
    users: dict[str, JobUser] = {}
    for queue, name in config.run_as.items():
        where = f"queue {queue!r}: run_as = {name!r}"
        try:
            user = JobUser.lookup(name)
        except KeyError:
            if euid != 0 and name == manager_user_name(euid):
                continue
            raise ConfigError(
                f"{where}: there is no such Unix user on this machine; create it (useradd "
                f"--system {name}) or name an existing user of the team (see {SECURITY_DOC})"
            ) from None
        if user.uid == euid:
            if euid == 0:
                raise ConfigError(
                    f"{where}: jobs never run as root, the manager's own user; name a user of "
                    f"the team's own (see {SECURITY_DOC})"
                )
            continue  # single-user mode, and the queue asks for this very user
        if euid != 0:
            raise ConfigError(
                f"{where}: switching to another user needs root, and this manager runs as "
                f"{manager_user_name(euid)}; start it as root, or remove run_as to run every "
                f"job as {manager_user_name(euid)} (see {SECURITY_DOC})"
            )
        users[queue] = user
    return users


def check_job_users(
    config: QueueConfig,
    users: dict[str, JobUser],
    *,
    allow_jobs_as_root: bool = False,
    euid: int | None = None,
) -> str | None:
    """Refuse to run a job as root; the warning to log when jobs can read the manager's state.

    Returns:
        None when every queue's jobs run as a user of their own; else the warning: single-user
        mode (the manager is not root), or jobs that run as root by ``--allow-jobs-as-root``.

    Raises:
        ConfigError: The manager is root, a queue has no ``run_as`` and jobs as root are not
            allowed.
    """
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return (
            f"single-user mode: jobs run as {manager_user_name(euid)} and can read this "
            f"manager's state; see {SECURITY_DOC}"
        )
    bare = [q.name for q in config.queues if q.name not in users]
    if not bare:
        return None
    names = ", ".join(repr(name) for name in bare)
    if not allow_jobs_as_root:
        raise ConfigError(
            f"the queue manager runs as root and queue(s) {names} have no run_as: their jobs "
            "would run as root and could read every token and forge any job's; give each queue "
            f'the Unix user of its team (run_as = "alice", see {SECURITY_DOC}), or start with '
            "--allow-jobs-as-root on a machine nobody else uses"
        )
    return (
        f"--allow-jobs-as-root: jobs of queue(s) {names} run as root and can read this manager's "
        f"state and every token; see {SECURITY_DOC}"
    )


def manager_user_name(euid: int | None = None) -> str:
    """The name of the manager's user (its uid when it has no passwd entry)."""
    euid = os.geteuid() if euid is None else euid
    try:
        return pwd.getpwuid(euid).pw_name
    except KeyError:
        return str(euid)


def job_base_environment(manager_env: dict[str, str], user: JobUser) -> dict[str, str]:
    """What a job of ``user`` starts from: ``PATH`` and ``LANG`` (the manager's, or a default
    ``PATH``) and who it is; nothing else of the manager's."""
    env = {"PATH": manager_env.get("PATH", _DEFAULT_PATH)}
    if "LANG" in manager_env:
        env["LANG"] = manager_env["LANG"]
    return {**env, **user.environment()}


def make_not_dumpable() -> bool:
    """Close this process's ``/proc/<pid>/environ``, ``mem`` and ``fd`` to the other processes
    of its user, and to debuggers and core dumps. Returns False where prctl(2) is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def secure_state_dir(state_dir: Path, *, shared: bool) -> None:
    """Create the state folder and its jobs folder, or tighten those an older version left
    readable: the folders the manager's (0711 when ``shared``, jobs of other users reaching
    their own files through them; else 0700), its files 0600, and the files of every job's
    folder readable by their owner alone.

    Raises:
        StateStoreError: The folder cannot be created or its modes cannot be set.
    """
    folder_mode = PASSAGE_FOLDER if shared else PRIVATE_FOLDER
    jobs = state_dir / JOBS_FOLDER
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
        jobs.mkdir(exist_ok=True, mode=PRIVATE_FOLDER)
        os.chmod(state_dir, folder_mode)
        os.chmod(jobs, folder_mode)
        _private_files(state_dir)
        for entry in os.scandir(jobs):
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, folder_mode)
                _private_files(Path(entry.path))
    except OSError as exc:
        raise StateStoreError(
            f"cannot create the state directory {state_dir} or set its modes: "
            f"{exc.strerror or exc}; make it writable, or choose another with --state"
        ) from None


def _private_files(folder: Path) -> None:
    """Take the group's and others' bits off the regular files directly in ``folder``."""
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
            if mode & 0o077:
                os.chmod(entry.path, mode & 0o700)
