"""``preemptible launch``: run a command in its own process group and pass notices on as SIGTERM.

Why it exists. SLURM announces the end of a job with the signal of ``--signal=B:USR1@N`` (to the
batch shell only), but torchrun handles SIGTERM/SIGINT/SIGHUP/SIGQUIT and *dies* of SIGUSR1 without
telling its workers, which then run on as orphans and never save (`docs/user-guide/preemption.md`).
The launcher sits between the two: it forwards SIGTERM, SIGINT and SIGHUP to the child's process
group unchanged and translates SIGUSR1 (optionally SIGUSR2) into SIGTERM, which torchrun forwards to
every worker. ``--kill-after`` bounds the wait with a SIGKILL to the group. The launcher exits with
the child's exit status (``128 + signum`` when the child was killed by a signal), so SLURM's
``RequeueExit`` and shell conventions keep working.

The launcher is also a *child subreaper* (Linux): a process that outlives its parent is adopted
by the launcher rather than by init. torchrun starts its workers in sessions of their own and,
on a third SIGTERM (SLURM sends several), exits without killing them; under SLURM's
``proctrack/linuxproc``, which finds a job's processes by their parents, such orphans escaped the
job and ran on beside its requeued successor. Adopted, they stay in the job's process tree, and
when the command has exited the launcher sends them SIGTERM, then SIGKILL after
``ORPHAN_GRACE_SECS`` (or at the ``--kill-after`` deadline, if sooner), and exits only when they
are gone.

The handlers only call ``os.killpg`` (a system call) and record the time; the main thread polls
the child, so a signal can never interrupt a half-done bookkeeping step.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any

from preemptible._env_names import LAUNCH_ENV, LAUNCH_TRANSLATES_ENV
from preemptible.errors import ConfigError, GuardError
from preemptible.runtime.signals import UNCATCHABLE_SIGNALS, restorable

FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Passed on to the child's process group unchanged."""

DEFAULT_TRANSLATED: tuple[signal.Signals, ...] = (signal.SIGUSR1,)
"""Turned into SIGTERM for the child: SLURM's ``--signal`` sends it, and torchrun dies of it."""

POLL_INTERVAL_SECS = 0.05
"""How often the launcher checks the child and the kill-after deadline."""

ORPHAN_GRACE_SECS = 5.0
"""How long processes that outlive the command get between SIGTERM and SIGKILL."""

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def launch(
    command: Sequence[str],
    *,
    translate: Iterable[signal.Signals] = DEFAULT_TRANSLATED,
    kill_after: float | None = None,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run ``command`` in a new process group, relaying notices, and return its exit status.

    Must run in the main thread (it installs signal handlers); they are restored on return.

    Args:
        command: The program and its arguments.
        translate: Signals sent on to the child as SIGTERM instead of themselves.
        kill_after: SIGKILL the child's group if it is still running this many seconds after
            the first signal; None waits forever.
        env: The child's environment (``os.environ`` by default), to which the launcher adds
            ``PREEMPTIBLE_LAUNCH_PID`` and ``PREEMPTIBLE_LAUNCH_TRANSLATES``.
        clock: Monotonic clock; tests may replace it.

    Returns:
        The child's exit code, or ``128 + signum`` if a signal ended it.

    Raises:
        ConfigError: Empty command, negative ``kill_after``, or a translated signal that is also
            forwarded as itself or cannot be caught.
        GuardError: Not called from the main thread.
        FileNotFoundError: The program does not exist.
    """
    if not command:
        raise ConfigError("preemptible launch needs a command: preemptible launch -- CMD ...")
    if kill_after is not None and not kill_after >= 0:
        raise ConfigError(f"--kill-after must be >= 0 seconds, got {kill_after!r}")
    translated = tuple(dict.fromkeys(signal.Signals(s) for s in translate))
    bad = [s.name for s in translated if s in FORWARDED_SIGNALS or s in UNCATCHABLE_SIGNALS]
    if bad:
        raise ConfigError(f"cannot translate {', '.join(bad)} into SIGTERM")
    if threading.current_thread() is not threading.main_thread():
        raise GuardError("launch() must run in the main thread: it installs signal handlers")

    relay = _Relay(translated, clock)
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in (*FORWARDED_SIGNALS, *translated):
            previous[sig] = signal.signal(sig, relay.handle)
        child_env = dict(os.environ if env is None else env)
        child_env[LAUNCH_ENV] = str(os.getpid())
        child_env[LAUNCH_TRANSLATES_ENV] = ",".join(s.name for s in translated)
        adopting = become_subreaper()
        relay.child = subprocess.Popen(list(command), env=child_env, process_group=0)
        relay.deliver_pending()
        code = _wait(relay, kill_after, clock)
        if adopting:
            deadline = clock() + ORPHAN_GRACE_SECS
            if kill_after is not None and relay.first_notice_at is not None:
                deadline = min(deadline, relay.first_notice_at + kill_after)
            end_orphans(deadline, clock)
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, restorable(handler))


def become_subreaper() -> bool:
    """Adopt the descendants that outlive their parents (Linux only); True if it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def adopted() -> list[int]:
    """This process's children that are still running (zombies are reaped on the way)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    me, children = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            children.append(int(entry.name))
    return children


def end_orphans(kill_at: float, clock: Callable[[], float]) -> None:
    """SIGTERM the adopted processes, SIGKILL those left at ``kill_at``, and reap them all."""
    warned: set[int] = set()
    while pids := adopted():
        late = clock() >= kill_at
        for pid in pids:
            if pid in warned and not late:
                continue
            if pid not in warned:
                warned.add(pid)
                print(
                    f"preemptible launch: process {pid} outlived the command; SIGTERM, then "
                    f"SIGKILL in {max(0.0, kill_at - clock()):.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
        time.sleep(POLL_INTERVAL_SECS)


class _Relay:
    """Signal handler state: the child, the first notice's time, signals seen before the start."""

    def __init__(self, translated: tuple[signal.Signals, ...], clock: Callable[[], float]):
        self.translated = translated
        self.clock = clock
        self.child: subprocess.Popen[bytes] | None = None
        self.first_notice_at: float | None = None
        self.pending: list[int] = []

    def handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.first_notice_at is None:
            self.first_notice_at = self.clock()
        target = signal.SIGTERM if signum in self.translated else signum
        if self.child is None:
            self.pending.append(target)
        else:
            self._send(target)

    def deliver_pending(self) -> None:
        for sig in self.pending:
            self._send(sig)
        self.pending.clear()

    def _send(self, sig: int) -> None:
        assert self.child is not None
        if self.child.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # the group is gone: nobody to notify
            os.killpg(self.child.pid, sig)


def _wait(relay: _Relay, kill_after: float | None, clock: Callable[[], float]) -> int:
    assert relay.child is not None
    killed = False
    while True:
        try:
            returncode = relay.child.wait(timeout=POLL_INTERVAL_SECS)
            break
        except subprocess.TimeoutExpired:
            pass
        noticed = relay.first_notice_at
        overdue = noticed is not None and kill_after is not None and clock() - noticed >= kill_after
        if overdue and not killed:
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(relay.child.pid, signal.SIGKILL)
    return 128 - returncode if returncode < 0 else returncode
