"""Preemption notices: catch the signal, record when, set a flag; nothing else.

A notice (SIGTERM from Kubernetes or the queue manager, SIGUSR1 from SLURM ``--signal``, SIGINT
from a terminal, or `PreemptionGuard.request` from the queue manager's notice poller) means
"save soon and exit". The training loop acts on it at its next step boundary; the handler does not.

Why the handler only records. A Python signal handler runs in the main thread between two
bytecodes of whatever the loop was doing: inside an optimizer step, a ``torch.save``, a logging
call holding the logging lock, a collective. Saving, logging or taking a lock from there can
deadlock or corrupt the very state we want to save. So the handler appends one record (signal,
time, reason) to a list (an atomic operation), wakes waiters and returns. The waiters' event is
built on a re-entrant lock, because a plain ``threading.Event`` takes a lock that the interrupted
main thread may itself hold inside ``Event.wait``.

Why no KeyboardInterrupt. Python's default SIGINT handler raises ``KeyboardInterrupt`` wherever
the main thread happens to be, which can abort a half-written checkpoint or leave the optimizer
half-updated. While a guard is installed, Ctrl-C is a notice like SIGTERM: the loop finishes its
step, saves and exits with 130. SIGQUIT (Ctrl-\\) or SIGKILL remain for an immediate stop.

Chaining. A Python-level handler that was installed before the guard (a framework's or the
user's) is called after the notice is recorded, so installing the guard does not silently disable
it. We never chain to ``signal.default_int_handler`` (it raises KeyboardInterrupt, see above), nor
to ``SIG_DFL``/``SIG_IGN`` (the default action of SIGTERM/SIGUSR1 is to die at once), and never
while inside `PreemptionGuard.final_save`: a second signal (SLURM and torchrun both send
SIGTERM more than once) must not abort the save it is waiting for.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any, NamedTuple

from preemptible.errors import ConfigError, GuardError
from preemptible.runtime.deadline import Grace, discover_grace

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
"""Kubernetes and the queue manager send SIGTERM, SLURM ``--signal`` USR1, a terminal SIGINT."""

UNCATCHABLE_SIGNALS = {signal.SIGKILL, signal.SIGSTOP}

Handler = Callable[[int, FrameType | None], Any] | int | None


class Notice(NamedTuple):
    """One preemption notice as the handler recorded it."""

    signal: signal.Signals | None
    """The signal, or None for a programmatic notice."""
    received_at: float
    """Wall-clock time of arrival, from the guard's clock."""
    reason: str
    """The signal's name, or the reason passed to `PreemptionGuard.request`."""
    deadline: float | None = None
    """When the sender will kill the process, if it said (the queue manager's notice does)."""


class _SignalSafeEvent:
    """A ``threading.Event`` whose ``set`` may run in a signal handler on the main thread.

    ``threading.Event`` guards its flag with a plain Lock; if the signal lands while the main
    thread holds it (inside ``wait``), ``set`` in the handler deadlocks. An RLock is re-entered.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._flag, timeout)


class PreemptionGuard:
    """Records preemption notices from signals (and the API) for the loop to act on.

    Install it in the main thread (``with PreemptionGuard() as guard:``); then check
    ``guard.requested`` at each step boundary, save inside ``with guard.final_save():`` and exit
    with ``guard.exit_code()``. Every rank runs its own guard; agreeing on a stop step is the
    caller's job.
    """

    def __init__(
        self,
        signals: Iterable[int | signal.Signals] = DEFAULT_SIGNALS,
        *,
        grace_seconds: float | None = None,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Create a guard; nothing is installed until `install`.

        Args:
            signals: The signals that count as notices.
            grace_seconds: The grace period, if the caller knows it; else it is discovered from
                the environment (see `preemptible.runtime.deadline`) when first needed.
            env: The environment to discover the grace from; ``os.environ`` by default.
            clock: Wall-clock source (epoch seconds); tests pass a fake one.

        Raises:
            ConfigError: A signal cannot be caught (SIGKILL, SIGSTOP) or is not a signal, or
                ``grace_seconds`` is negative or not finite.
        """
        self._signals = _validate_signals(signals)
        if grace_seconds is not None and not (0 <= grace_seconds < float("inf")):
            raise ConfigError(f"grace_seconds must be a finite number >= 0, got {grace_seconds!r}")
        self._explicit_grace = grace_seconds
        self._env = env
        self._clock = clock
        self._grace: Grace | None = None
        self._notices: list[Notice] = []
        self._event = _SignalSafeEvent()
        self._previous: dict[int, Handler] = {}
        self._installed = False
        self._final_save_depth = 0

    # --- installing ---------------------------------------------------------------------------

    def install(self) -> PreemptionGuard:
        """Install the handlers and discover the grace period (so a notice never waits for it).

        Returns:
            The guard itself, for ``guard = PreemptionGuard().install()``.

        Raises:
            GuardError: Not called from the main thread, or already installed.
            ConfigError: A grace variable in the environment is invalid.
        """
        if threading.current_thread() is not threading.main_thread():
            raise GuardError(
                "PreemptionGuard.install() must run in the main thread: Python delivers signals "
                "only there. Install the guard before starting threads, or use guard.request() "
                "from other threads."
            )
        if self._installed:
            raise GuardError("this PreemptionGuard is already installed; uninstall() it first")
        self._ensure_grace()
        previous: dict[int, Handler] = {}
        for sig in self._signals:
            try:
                previous[sig] = signal.signal(sig, self._handle)
            except (OSError, ValueError) as error:
                for installed, handler in previous.items():
                    signal.signal(installed, restorable(handler))
                raise GuardError(f"cannot install a handler for {sig.name}: {error}") from error
        self._previous = previous
        self._installed = True
        return self

    def uninstall(self) -> None:
        """Put back the handlers that were there before `install`; no-op if not installed.

        A handler that was installed from C (``signal.getsignal`` returned None) cannot be put
        back from Python; that signal gets ``SIG_DFL``.

        Raises:
            GuardError: Not called from the main thread.
        """
        if not self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            raise GuardError("PreemptionGuard.uninstall() must run in the main thread")
        for sig, handler in self._previous.items():
            signal.signal(sig, restorable(handler))
        self._previous = {}
        self._installed = False

    def reclaim(self) -> list[signal.Signals]:
        """Handle this guard's signals alone again where other code replaced its handler.

        For frameworks that put their own handler over ours and act on the signal themselves
        in ways that race with a save (Lightning, `preemptible.lightning`). The replacing
        handler is not called by ours; `uninstall` still restores what was there before
        `install`. Returns the signals taken back (none if the guard is not installed).

        Raises:
            GuardError: Not called from the main thread.
        """
        if not self._installed:
            return []
        if threading.current_thread() is not threading.main_thread():
            raise GuardError("PreemptionGuard.reclaim() must run in the main thread")
        taken = [sig for sig in self._signals if signal.getsignal(sig) != self._handle]
        for sig in taken:
            signal.signal(sig, self._handle)
        return taken

    def __enter__(self) -> PreemptionGuard:
        return self.install()

    def __exit__(self, *exc_info: object) -> None:
        self.uninstall()

    @property
    def installed(self) -> bool:
        """Whether the handlers are in place."""
        return self._installed

    @property
    def signals(self) -> tuple[signal.Signals, ...]:
        """The signals this guard treats as notices."""
        return self._signals

    # --- the handler --------------------------------------------------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Record-only: see the module docstring. list.append is atomic; no locks are taken except
        # the event's re-entrant one.
        sig = signal.Signals(signum)
        self._notices.append(Notice(sig, self._clock(), sig.name))
        self._event.set()
        if self._final_save_depth:
            return
        previous = self._previous.get(signum)
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)

    def request(self, reason: str = "api", *, deadline: float | None = None) -> None:
        """Record a programmatic notice (e.g. from the queue manager's notice endpoint), with
        the sender's deadline when it gave one.

        Safe to call from any thread, and works whether or not the guard is installed.
        """
        self._notices.append(Notice(None, self._clock(), reason, deadline))
        self._event.set()

    def set_grace(self, seconds: float, source: str, *, fix: str = "") -> None:
        """A grace better informed than the environment's (the one the queue manager
        negotiated) replaces it; a grace given to the constructor still wins. ``fix`` says
        what would lengthen it (see `preemptible.runtime.deadline.Grace.fix`)."""
        if not (0 <= seconds < float("inf")):
            raise ConfigError(f"grace seconds must be a finite number >= 0, got {seconds!r}")
        if self._explicit_grace is None:
            self._grace = Grace(seconds=seconds, source=source, fix=fix)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a notice arrives or ``timeout`` seconds pass; True if one has arrived."""
        return self._event.wait(timeout)

    # --- what was received --------------------------------------------------------------------

    @property
    def requested(self) -> bool:
        """Whether a notice has arrived."""
        return bool(self._notices)

    @property
    def count(self) -> int:
        """How many notices have arrived (SLURM and torchrun may send several)."""
        return len(self._notices)

    @property
    def notices(self) -> tuple[Notice, ...]:
        """Every notice so far, oldest first."""
        return tuple(self._notices)

    @property
    def signal(self) -> signal.Signals | None:
        """The first notice's signal; None if there is none or it was programmatic."""
        return self._notices[0].signal if self._notices else None

    @property
    def reason(self) -> str | None:
        """The first notice's signal name or request reason; None before any notice."""
        return self._notices[0].reason if self._notices else None

    @property
    def received_at(self) -> float | None:
        """Wall-clock time of the first notice; None before any notice."""
        return self._notices[0].received_at if self._notices else None

    # --- deadline -----------------------------------------------------------------------------

    @property
    def grace(self) -> Grace:
        """The grace period, where it came from and what sets it."""
        return self._ensure_grace()

    @property
    def grace_seconds(self) -> float | None:
        """The grace period: the argument, else discovered from the environment, else None."""
        return self._ensure_grace().seconds

    @property
    def grace_source(self) -> str:
        """Where `grace_seconds` came from (see `preemptible.runtime.deadline.Grace`)."""
        return self._ensure_grace().source

    @property
    def deadline(self) -> float | None:
        """When the process will be killed: the first notice plus the grace period.

        Capped by a known end of the job (SLURM EndTime) and by any deadline a notice named.
        None before a notice or when unknown.
        """
        received_at = self.received_at
        if received_at is None:
            return None
        grace = self._ensure_grace()
        candidates = [received_at + grace.seconds] if grace.seconds is not None else []
        if grace.not_after is not None:
            candidates.append(grace.not_after)
        candidates += [n.deadline for n in self._notices if n.deadline is not None]
        return min(candidates) if candidates else None

    def remaining(self) -> float | None:
        """Seconds left until `deadline` (never negative); None if unknown or no notice."""
        deadline = self.deadline
        return None if deadline is None else max(0.0, deadline - self._clock())

    def _ensure_grace(self) -> Grace:
        if self._grace is None:
            if self._explicit_grace is not None:
                self._grace = Grace(
                    seconds=self._explicit_grace, source="argument", fix="grace_seconds={n}"
                )
            else:
                self._grace = discover_grace(os.environ if self._env is None else self._env)
        return self._grace

    # --- acting on it -------------------------------------------------------------------------

    @contextmanager
    def final_save(self) -> Iterator[PreemptionGuard]:
        """Shield the final save: further notices are recorded but never interrupt it.

        Inside the block no previous handler is chained, so nothing raises or exits under the
        save; SIGINT never raises KeyboardInterrupt while the guard is installed anyway.
        """
        self._final_save_depth += 1
        try:
            yield self
        finally:
            self._final_save_depth -= 1

    def exit_code(self) -> int:
        """``128 + signum`` of the first notice (shell convention); 0 if none or programmatic."""
        sig = self.signal
        return 128 + int(sig) if sig is not None else 0

    def __repr__(self) -> str:
        names = ",".join(s.name for s in self._signals)
        return (
            f"PreemptionGuard(signals={names}, installed={self._installed}, "
            f"requested={self.requested}, count={self.count})"
        )


def _validate_signals(signals: Iterable[int | signal.Signals]) -> tuple[signal.Signals, ...]:
    result: list[signal.Signals] = []
    for value in signals:
        try:
            sig = signal.Signals(value)
        except ValueError:
            raise ConfigError(f"{value!r} is not a signal number") from None
        if sig in UNCATCHABLE_SIGNALS:
            raise ConfigError(f"{sig.name} cannot be caught; choose other signals")
        if sig not in result:
            result.append(sig)
    if not result:
        raise ConfigError("PreemptionGuard needs at least one signal")
    return tuple(result)


def restorable(handler: Handler) -> Callable[[int, FrameType | None], Any] | int:
    """What to pass to `signal.signal` to put back a handler that `signal.signal` returned
    (None means one not installed from Python: the default)."""
    return signal.SIG_DFL if handler is None else handler
