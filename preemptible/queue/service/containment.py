"""Where a job's processes are kept, so that every one of them is reached and waited for.

A process group does not hold a job: any process of it may call ``setsid()`` (a launcher that
daemonises does), leave the group, miss the notice and the SIGKILL, and keep its GPU after the
job has "ended". So each attempt is contained by the strongest mechanism this host offers,
chosen once when the manager starts (:func:`choose`), tried in this order:

1. **cgroup v2** (a ``cgroup2`` file system, e.g. ``/sys/fs/cgroup`` or, on hybrid hosts,
   ``/sys/fs/cgroup/unified``), 2. **cgroup v1 freezer**, 3. **cgroup v1 pids**: each attempt
   gets ``<hierarchy>/preemptible/<job>-<attempt>-<random>``; the runner joins it before it
   starts the command, so every process the job ever starts is in it, and the kernel keeps
   the list (``cgroup.procs``). A signal goes to every process listed, with the cgroup frozen
   meanwhile so that none is forked unseen (``cgroup.kill`` kills at once on v2); the attempt
   has ended when the list is empty, and the cgroup is removed then.
4. **child subreaper** (``prctl(PR_SET_CHILD_SUBREAPER)`` in the runner): an orphan becomes the
   runner's child instead of init's, so every process of the job is a descendant of the runner
   in ``/proc``, where the executor finds it; the runner ends only when none is left. A job
   that kills its own runner escapes (it runs as the same user): a cgroup has no such hole.
5. **process group** alone (the executor's behaviour before all this): a process that calls
   ``setsid`` escapes.

A cgroup needs the manager to be allowed to create one (root, or a delegated hierarchy); the
probe really moves a process into one before trusting it. ``preemptible queue doctor`` prints
what :func:`survey` finds. Why cgroups first and the subreaper second:
``docs/internals/containment.md``.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from preemptible.errors import QueueError
from preemptible.queue.service import runner

CGROUP_DIR = "preemptible"
"""The cgroup, at the top of a hierarchy, under which each attempt gets one of its own."""

FREEZE_WAIT_S = 1.0
"""How long a freeze may take before the signal is sent anyway (the list is then re-read)."""

MOUNTS = "/proc/self/mounts"
"""Where the mounted hierarchies are listed (a test points it at a host without cgroups)."""

PR_GET_CHILD_SUBREAPER = 37
"""prctl(2): whether this process is a child subreaper (only asked, to see that prctl has it)."""


class Mechanism(enum.StrEnum):
    """How the processes of a job are kept together, strongest first."""

    CGROUP_V2 = "cgroup v2"
    CGROUP_V1_FREEZER = "cgroup v1 freezer"
    CGROUP_V1_PIDS = "cgroup v1 pids"
    SUBREAPER = "child subreaper"
    PROCESS_GROUP = "process group"

    @property
    def is_cgroup(self) -> bool:
        """Whether each attempt gets a cgroup of its own."""
        return self in (Mechanism.CGROUP_V2, Mechanism.CGROUP_V1_FREEZER, Mechanism.CGROUP_V1_PIDS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Containment:
    """One mechanism as probed on this host: whether it works here, and what it means."""

    mechanism: Mechanism
    available: bool
    why: str
    """In words: what it tracks on this host, or why it cannot be used here."""
    cgroup_root: str | None = None
    """For a cgroup mechanism: where each attempt's cgroup is made (``<hierarchy>/preemptible``)."""

    def new_cgroup(self, job_id: str, attempt: int) -> str | None:
        """Make the cgroup of one attempt (None when this mechanism uses none).

        Raises:
            QueueError: The cgroup cannot be made (the hierarchy changed since the probe).
        """
        if self.cgroup_root is None:
            return None
        name = f"{_SAFE_NAME.sub('_', job_id)}-{attempt}-{secrets.token_hex(3)}"
        path = os.path.join(self.cgroup_root, name)
        try:
            os.makedirs(self.cgroup_root, exist_ok=True)
            os.mkdir(path)
        except OSError as error:
            raise QueueError(
                f"cannot make the cgroup {path} of job {job_id} attempt {attempt}: "
                f"{error.strerror or error}; `preemptible queue doctor` says what this host "
                "allows"
            ) from error
        return path

    def runner_options(self, cgroup: str | None) -> list[str]:
        """The runner's arguments that put the attempt in this containment."""
        if cgroup is not None:
            return ["--cgroup", cgroup]
        if self.mechanism is Mechanism.SUBREAPER:
            return ["--subreaper"]
        return []


_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.]")


def choose(only: Mechanism | None = None) -> Containment:
    """The strongest mechanism that works on this host (or `only` that one, for tests).

    Raises:
        QueueError: `only` was given and does not work here.
    """
    for mechanism in [only] if only is not None else list(Mechanism):
        found = probe(mechanism)
        if found.available:
            return found
    raise QueueError(f"{only} cannot contain jobs on this host: {found.why}")


def survey() -> list[Containment]:
    """Every mechanism, probed, strongest first (what ``preemptible queue doctor`` shows)."""
    return [probe(mechanism) for mechanism in Mechanism]


def probe(mechanism: Mechanism) -> Containment:
    """Whether `mechanism` works here; a cgroup one is tried for real (a process moved in)."""
    if mechanism is Mechanism.PROCESS_GROUP:
        return Containment(
            mechanism=mechanism,
            available=True,
            why="no writable cgroup and no child subreaper: process group only; a process "
            "that calls setsid leaves the group, escapes the notice and the kill, and may keep "
            "its GPU after the job has ended",
        )
    if mechanism is Mechanism.SUBREAPER:
        problem = _subreaper_problem()
        return Containment(
            mechanism=mechanism,
            available=problem is None,
            why=problem
            or "no writable cgroup: child subreaper; a process that escapes by double-fork and "
            "setsid is still adopted by the job's runner and reached by notice, preemption and "
            "cancel (only a process that kills the runner itself gets away)",
        )
    hierarchies = _hierarchies(mechanism)
    if not hierarchies:
        return Containment(
            mechanism=mechanism, available=False, why=f"no {_FILE_SYSTEM[mechanism]} is mounted"
        )
    problems = []
    for hierarchy in hierarchies:
        root = os.path.join(hierarchy, CGROUP_DIR)
        problem = _cgroup_problem(mechanism, root)
        if problem is None:
            return Containment(
                mechanism=mechanism,
                available=True,
                cgroup_root=root,
                why=f"{mechanism} at {hierarchy}: every process of a job is tracked, in a "
                f"cgroup of its own under {root}, setsid or not; notice, preemption and cancel "
                "reach each one, and its GPUs go to another job only once none is left",
            )
        problems.append(problem)
    return Containment(mechanism=mechanism, available=False, why="; ".join(problems))


_FILE_SYSTEM = {
    Mechanism.CGROUP_V2: "cgroup2 file system",
    Mechanism.CGROUP_V1_FREEZER: "cgroup v1 hierarchy with the freezer controller",
    Mechanism.CGROUP_V1_PIDS: "cgroup v1 hierarchy with the pids controller",
}
_CONTROLLER = {Mechanism.CGROUP_V1_FREEZER: "freezer", Mechanism.CGROUP_V1_PIDS: "pids"}
# The control file without which a cgroup of this kind cannot stop a fork race.
_NEEDS = {
    Mechanism.CGROUP_V2: ("cgroup.kill", "cgroup.freeze"),
    Mechanism.CGROUP_V1_FREEZER: ("freezer.state",),
    Mechanism.CGROUP_V1_PIDS: ("pids.max",),
}


def _hierarchies(mechanism: Mechanism) -> list[str]:
    """The mount points of the hierarchies of this kind, from ``/proc/self/mounts``."""
    try:
        with open(MOUNTS) as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        # Spaces and such in a mount point are written as octal escapes (\040).
        where = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[1])
        kind, options = fields[2], fields[3].split(",")
        v2 = mechanism is Mechanism.CGROUP_V2 and kind == "cgroup2"
        if v2 or (kind == "cgroup" and _CONTROLLER.get(mechanism) in options):
            found.append(where)
    return found


def _cgroup_problem(mechanism: Mechanism, root: str) -> str | None:
    """None when a process can be moved into a new cgroup under `root`; else why not."""
    try:
        os.makedirs(root, exist_ok=True)
        probe_dir = os.path.join(root, f".probe-{os.getpid()}-{secrets.token_hex(3)}")
        os.mkdir(probe_dir)
    except OSError as error:
        return (
            f"cannot make a cgroup under {root} ({error.strerror or error}): run the manager "
            "as root, or give its user that folder"
        )
    try:
        if not any(os.path.exists(os.path.join(probe_dir, f)) for f in _NEEDS[mechanism]):
            needs = " or ".join(_NEEDS[mechanism])
            return f"{root}: a cgroup has no {needs} here (cgroup v2 needs Linux 5.2 or later)"
        return _move_problem(probe_dir)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe_dir)


def _move_problem(cgroup: str) -> str | None:
    """Move a short-lived process into `cgroup` and see it listed there; None when it works."""
    child = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", "import os; os.read(0, 1)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        runner.write_control(cgroup, "cgroup.procs", str(child.pid))
        if child.pid not in runner.cgroup_pids(cgroup):
            return f"{cgroup}: a process moved into it is not listed in its cgroup.procs"
        return None
    except OSError as error:
        return f"cannot move a process into {cgroup} ({error.strerror or error})"
    finally:
        child.kill()
        child.wait()


def _subreaper_problem() -> str | None:
    """None when prctl knows child subreapers (Linux 3.4 and later); else why not."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return f"prctl(PR_GET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError, ImportError) as error:
        return f"no prctl to make a child subreaper with ({error}): Linux is required"
    return None


# --- reaching every process of a cgroup ---------------------------------------------------------


def signal_cgroup(cgroup: str, signum: int) -> None:
    """Send `signum` to every process of the attempt's cgroup, including those forked meanwhile.

    SIGKILL is one write where the kernel has ``cgroup.kill`` (v2, Linux 5.14+). Otherwise the
    cgroup is frozen while its list is read and signalled, so that no process is forked unseen,
    then thawed (a frozen process acts on its signal once thawed); v1 pids cannot freeze, so a
    SIGKILL first sets ``pids.max`` to 0, and every fork fails from then on. Nothing happens when
    the cgroup no longer exists.
    """
    if signum == signal.SIGKILL:
        if runner.write_control(cgroup, "cgroup.kill", "1"):
            return
        runner.write_control(cgroup, "pids.max", "0")
    thaw = _freeze(cgroup)
    try:
        runner.signal_cgroup(cgroup, signum)
    finally:
        if thaw is not None:
            runner.write_control(cgroup, *thaw)


def thaw(cgroup: str) -> None:
    """Thaw the cgroup if it is frozen (a manager that died between a freeze and its thaw)."""
    with contextlib.suppress(OSError):
        runner.write_control(cgroup, "cgroup.freeze", "0")
        runner.write_control(cgroup, "freezer.state", "THAWED")


def remove_cgroup(cgroup: str) -> None:
    """Remove an attempt's cgroup once empty; a cgroup already gone is fine."""
    with contextlib.suppress(OSError):
        os.rmdir(cgroup)


def _freeze(cgroup: str) -> tuple[str, str] | None:
    """Freeze the cgroup (v2 or v1 freezer), waiting for it up to FREEZE_WAIT_S; returns the
    write that thaws it, or None when this cgroup cannot freeze."""
    if runner.write_control(cgroup, "cgroup.freeze", "1"):
        _wait_for(lambda: "frozen 1" in _read(cgroup, "cgroup.events"))
        return ("cgroup.freeze", "0")
    if runner.write_control(cgroup, "freezer.state", "FROZEN"):
        _wait_for(lambda: _read(cgroup, "freezer.state").strip() == "FROZEN")
        return ("freezer.state", "THAWED")
    return None


def _read(cgroup: str, name: str) -> str:
    try:
        with open(os.path.join(cgroup, name)) as control:
            return control.read()
    except FileNotFoundError:
        return ""


def _wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + FREEZE_WAIT_S
    while not done() and time.monotonic() < deadline:
        time.sleep(0.001)
