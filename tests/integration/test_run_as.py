"""A job is not the manager: each team's jobs run as the team's Unix user (`run_as`).

A real `preemptible queue serve` as root with two queues, each with `run_as` naming a Unix user
made for the test. Probe jobs try what a hostile job would: read the manager's secret, its
environment (which holds the admin token), its database, the other team's output; signal the
other team's job, the manager and their own runner. The kernel must refuse each, and every
file the manager writes must have the mode it promises. As root, a queue without `run_as`, or
one that names root or a missing user, stops the manager before it starts. A manager that is
not root runs in single-user mode: it says so, and its environment stays closed to its jobs.

These tests need root (they create users, and only root switches to them); CI runs as root.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from preemptible._env_names import (
    ATTEMPT_ENV,
    BEAT_ENV,
    COST_FILE_ENV,
    GPUS_ENV,
    GRACE_ENV,
    JOB_ID_ENV,
    TOKEN_ENV,
    URL_ENV,
)
from tests.unix_users import NEEDS_ROOT, UnixUser, made_users, runs_as

from .queue_server import CLI, Server, ready, submit, wait_for

pytestmark = NEEDS_ROOT

REPO = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "admin-" + secrets.token_hex(8)
TOKENS = {
    "T_ADMIN": ADMIN_TOKEN,
    "T_A": "team-a-" + secrets.token_hex(8),
    "T_B": "team-b-" + secrets.token_hex(8),
}
MARKER = "RUN_AS_TEST_MANAGER_ONLY"
"""A variable in the manager's environment that no job may see."""
JOB_VARIABLES = {URL_ENV, JOB_ID_ENV, TOKEN_ENV, GRACE_ENV, COST_FILE_ENV, ATTEMPT_ENV, GPUS_ENV}
JOB_VARIABLES |= {BEAT_ENV}
ALLOWED_ENV = {"PATH", "LANG", "HOME", "USER", "LOGNAME", "PROBE"}
ALLOWED_ENV |= {"CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "LC_CTYPE"} | JOB_VARIABLES
# LC_CTYPE: Python coerces a C locale by setting it in its own environment (PEP 538).

# What a hostile job tries, each attempt recorded as "done" or the exception's name; the
# paths and pids come in $PROBE. Printed as one line: "PROBE {...}".
PROBE = r"""
import json, os, signal
p = json.loads(os.environ["PROBE"])
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
       "env": sorted(os.environ), "cwd": os.getcwd()}
out.update({k: os.environ.get(k) for k in ("HOME", "USER", "LOGNAME")})
def attempt(what, action):
    try:
        action()
        out[what] = "done"
    except OSError as error:
        out[what] = type(error).__name__
def write_cost():
    path = os.environ["PREEMPTIBLE_COST_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write("{}")
    os.replace(path + ".tmp", path)
own = os.path.join(p["jobs"], os.environ["PREEMPTIBLE_JOB_ID"])
for name, path in p["read"].items():
    attempt("read " + name, lambda path=path: open(path, "rb").read(1))
for name, path in p["list"].items():
    attempt("list " + name, lambda path=path: os.listdir(path))
for name, pid in p["signal"].items():
    attempt("signal " + name, lambda pid=pid: os.kill(pid, signal.SIGKILL))
for name, group in p["signal_group"].items():
    attempt("signal " + name, lambda group=group: os.killpg(group, signal.SIGKILL))
attempt("signal own runner", lambda: os.kill(os.getpgid(0), signal.SIGKILL))
attempt("read own output", lambda: open(os.path.join(own, "attempt-1.log"), "rb").read(1))
attempt("write own folder", lambda: open(os.path.join(own, "planted"), "w").close())
attempt("write cost file", write_cost)
print("PROBE " + json.dumps(out), flush=True)
"""
VICTIM = (
    "import os, time\n"
    "print('team-b-private-output', os.getpid(), flush=True)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[UnixUser, UnixUser]]:
    with made_users(2) as (a, b):
        yield a, b


@pytest.fixture(scope="module")
def job_python(users: tuple[UnixUser, UnixUser]) -> str:
    """An interpreter both users may run (this one may live in root's home)."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if candidate and all(runs_as(u, [candidate, "-c", "import json"]) for u in users):
            return candidate
    pytest.skip("no Python interpreter that the test's users may run")


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder others may enter (pytest's tmp_path is under a 0700 folder of root's: there, a
    job could reach nothing whatever the manager's modes, and the test would prove nothing)."""
    path = Path(tempfile.mkdtemp(prefix="pq-run-as-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def config(run_as_a: str | None, run_as_b: str | None) -> str:
    text = '[cluster]\ngpus = 2\n[service]\nadmin_token = "env:T_ADMIN"\n'
    for name, token, user in (("team-a", "T_A", run_as_a), ("team-b", "T_B", run_as_b)):
        text += f'[[queues]]\nname = "{name}"\nnominal = {{ gpus = 1 }}\ntoken = "env:{token}"\n'
        if user is not None:
            text += f'run_as = "{user}"\n'
    return text


def mode_and_owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid


def probe_result(text: str) -> dict[str, object]:
    line = next(x for x in text.splitlines() if x.startswith("PROBE "))
    return dict(json.loads(line.removeprefix("PROBE ")))


def test_a_job_reaches_nothing_of_the_manager_nor_of_the_other_team(
    users: tuple[UnixUser, UnixUser], job_python: str, open_tmp: Path
) -> None:
    a, b = users
    server = Server(
        open_tmp, config(a.name, b.name), TOKENS, allow_jobs_as_root=False, env={MARKER: "x"}
    )
    server.start()
    state, manager = open_tmp / "state", server.proc.pid if server.proc else 0
    try:
        with server.client(TOKENS["T_B"]) as team_b, server.client(TOKENS["T_A"]) as team_a:
            victim = submit(team_b, "team-b", [job_python, "-c", VICTIM])["id"]
            ready(team_b, victim, timeout=60)
            victim_pid = int(team_b.get(f"/v1/jobs/{victim}/logs").json()["text"].split()[1])
            probe = {
                "jobs": str(state / "jobs"),
                "read": {
                    "secret": str(state / "secret"),
                    "database": str(state / "queue.sqlite3"),
                    "wal": str(state / "queue.sqlite3-wal"),
                    "shm": str(state / "queue.sqlite3-shm"),
                    "manager environ": f"/proc/{manager}/environ",
                    "manager memory": f"/proc/{manager}/mem",
                    "team b output": str(state / "jobs" / victim / "attempt-1.log"),
                },
                "list": {"state": str(state), "manager fds": f"/proc/{manager}/fd"},
                "signal": {"team b job": victim_pid, "manager": manager},
                "signal_group": {"team b group": os.getpgid(victim_pid)},
            }
            job = submit(
                team_a, "team-a", [job_python, "-c", PROBE], env={"PROBE": json.dumps(probe)}
            )
            ended = wait_for(team_a, job["id"], {"completed", "failed"}, timeout=60)
            output = team_a.get(f"/v1/jobs/{job['id']}/logs").json()["text"]
            assert ended["state"] == "completed", output
            seen = probe_result(output)

            # It is team A's user: its ids, its groups, its home, and nothing of the manager's.
            assert (seen["uid"], seen["gid"]) == (a.uid, a.gid)
            assert seen["groups"] == a.groups and len(a.groups) == 2
            assert (seen["HOME"], seen["USER"], seen["LOGNAME"]) == (a.home, a.name, a.name)
            assert seen["cwd"] == (a.home if os.path.isdir(a.home) else "/")  # not the manager's
            assert set(seen["env"]) <= ALLOWED_ENV and set(seen["env"]) >= JOB_VARIABLES
            assert MARKER not in seen["env"] and not set(TOKENS) & set(seen["env"])

            # Nothing of the manager's, nothing of team B's.
            denied = [
                "read secret",
                "read database",
                "read wal",
                "read shm",
                "read manager environ",
                "read manager memory",
                "read team b output",
                "list state",
                "list manager fds",
                "signal team b job",
                "signal team b group",
                "signal manager",
                "signal own runner",
                "write own folder",
            ]
            assert {what: seen[what] for what in denied} == dict.fromkeys(denied, "PermissionError")
            assert ADMIN_TOKEN.encode() in Path(f"/proc/{manager}/environ").read_bytes()
            assert (
                "team-b-private-output" in (state / "jobs" / victim / "attempt-1.log").read_text()
            )
            assert team_b.get(f"/v1/jobs/{victim}").json()["state"] == "running"

            # Its own: its output, and its cost file.
            assert seen["read own output"] == "done" and seen["write cost file"] == "done"

            # The modes promised.
            assert mode_and_owner(state) == (0o711, 0)
            assert mode_and_owner(state / "jobs") == (0o711, 0)
            for name in ("secret", "queue.sqlite3", "queue.sqlite3-wal", "queue.sqlite3-shm"):
                assert mode_and_owner(state / name) == (0o600, 0), name
            for job_id, user in ((job["id"], a), (victim, b)):
                folder = state / "jobs" / job_id
                assert mode_and_owner(folder) == (0o711, 0)
                assert mode_and_owner(folder / "attempt-1.log") == (0o600, user.uid)
                assert mode_and_owner(folder / "cost") == (0o700, user.uid)
            done = state / "jobs" / job["id"]
            assert mode_and_owner(done / "attempt-1.status") == (0o600, 0)
            assert mode_and_owner(done / "cost" / "cost.json")[1] == a.uid

            assert team_b.delete(f"/v1/jobs/{victim}").status_code == 202
            wait_for(team_b, victim, {"cancelled"}, timeout=60)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("a queue without run_as", "queue(s) 'team-b' have no run_as"),
        ("run_as root", "jobs never run as root"),
        ("a user that does not exist", "there is no such Unix user"),
    ],
)
def test_a_root_manager_refuses_a_queue_without_a_user_of_its_own(
    users: tuple[UnixUser, UnixUser], tmp_path: Path, case: str, message: str
) -> None:
    a, _ = users
    run_as_b = {
        "a queue without run_as": None,
        "run_as root": "root",
        "a user that does not exist": f"pq-none-{secrets.token_hex(3)}",
    }[case]
    (tmp_path / "queue.toml").write_text(config(a.name, run_as_b))
    args = ["--config", str(tmp_path / "queue.toml"), "--state", str(tmp_path / "state")]
    done = subprocess.run(
        [*CLI, "queue", "serve", *args, "--port", "9"],
        env={**os.environ, **TOKENS},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "docs/user-guide/security.md" in done.stderr
    assert not (tmp_path / "state").exists()


def test_single_user_mode_says_so_and_keeps_the_managers_environment_from_its_jobs(
    users: tuple[UnixUser, UnixUser], job_python: str, open_tmp: Path
) -> None:
    """The manager runs as team A's user, not root: it cannot switch, warns, and its jobs
    (its own user) still cannot read its environment, thanks to PR_SET_DUMPABLE."""
    a, _ = users
    cli, env = _manager_python_for(a, job_python)
    os.chown(open_tmp, a.uid, a.gid)
    server = Server(
        open_tmp,
        config(None, None),
        TOKENS,
        allow_jobs_as_root=False,
        cli=cli,
        env=env,
        user=a.name,
    )
    server.start()
    manager = server.proc.pid if server.proc else 0
    try:
        probe = {
            "jobs": str(open_tmp / "state" / "jobs"),
            "read": {"manager environ": f"/proc/{manager}/environ"},
            "list": {"manager fds": f"/proc/{manager}/fd"},
            "signal": {},
            "signal_group": {},
        }
        with server.client(TOKENS["T_A"]) as team_a:
            job = submit(
                team_a, "team-a", [job_python, "-c", PROBE], env={"PROBE": json.dumps(probe)}
            )
            wait_for(team_a, job["id"], {"completed", "failed"}, timeout=60)
            seen = probe_result(team_a.get(f"/v1/jobs/{job['id']}/logs").json()["text"])
        assert seen["uid"] == a.uid  # the manager's own user: single-user mode
        assert seen["read manager environ"] == "PermissionError"
        assert seen["list manager fds"] == "PermissionError"
        assert mode_and_owner(open_tmp / "state") == (0o700, a.uid)
        warning = f"single-user mode: jobs run as {a.name} and can read this manager's state"
        assert warning in server.log() and "docs/user-guide/security.md" in server.log()
    finally:
        server.stop()


def _manager_python_for(user: UnixUser, job_python: str) -> tuple[list[str], dict[str, str]]:
    """A command that runs `python -m preemptible` as `user`, with this checkout and its
    dependencies: this interpreter if the user may run it, else `job_python` of the same
    version on this interpreter's site-packages."""
    import site

    path = os.pathsep.join([str(REPO), *site.getsitepackages()])
    check = ["-c", "import preemptible.queue.service.server"]
    for python in (sys.executable, job_python):
        version = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if version != str(sys.version_info[:2]):
            continue
        env = {"PYTHONPATH": path}
        if runs_as(user, [python, *check], env={**os.environ, **env}):
            return [python, "-m", "preemptible"], env
    pytest.skip(f"no interpreter that {user.name} may run imports this checkout's preemptible")
