"""The server's log under a storm: an error said a few times, then counted, not repeated.

A failure that repeats (a scheduling step failing every 0.2 s, an `accept` failing for every
connection of a flood, the same 500 for every request) once wrote a traceback each time: 33 MB
in 30 s. Two remedies, for two kinds of repetition:

- `RepeatFilter`, on the server's log handlers, lets the same warning or error (same logger,
  same message template) through at most `burst` times per `interval_s`; the first one through
  after that says how many were suppressed meanwhile. Anything below WARNING passes.
- `Outage`, for a loop that fails at each turn: the first failure is logged with its traceback,
  the following ones are counted, and the first success says how many steps failed over how long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

BURST = 5
"""The same warning or error is logged at most this many times an interval..."""
INTERVAL_S = 60.0
"""...of this long."""


@dataclass(slots=True)
class _Window:
    started: float
    passed: int = 0
    suppressed: int = 0


class RepeatFilter(logging.Filter):
    """At most `burst` of the same warning or error per `interval_s`, then a count. Thread-safe."""

    def __init__(
        self,
        burst: int = BURST,
        interval_s: float = INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.burst = burst
        self.interval_s = interval_s
        self._clock = clock
        self._windows: dict[tuple[str, str, int], _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg), record.levelno)
        now = self._clock()
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window.started >= self.interval_s:
                suppressed = 0 if window is None else window.suppressed
                window = self._windows[key] = _Window(started=now)
                if len(self._windows) > 10_000:  # messages with their values in the template
                    self._windows = {key: window}
            else:
                suppressed = 0
            if window.passed >= self.burst:
                window.suppressed += 1
                return False
            window.passed += 1
        if suppressed:
            record.msg = (
                f"{record.msg} [{suppressed} more like it suppressed in the last "
                f"{self.interval_s:g} s]"
            )
        return True


def quiet_repeats(logger: logging.Logger | None = None) -> None:
    """Put a `RepeatFilter` of its own on every handler of `logger` (the root's by default)."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(RepeatFilter())


class Outage:
    """Logs a repeating failure once when it starts and once when it ends. Not thread-safe:
    one loop owns it."""

    def __init__(
        self, log: logging.Logger, what: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = log
        self.what = what
        self._clock = clock
        self.failures = 0
        """Failures of the outage going on (0: none)."""
        self._since = 0.0

    def failed(self) -> None:
        """A failure, inside an `except` block (its traceback is logged if it is the first)."""
        if self.failures == 0:
            self._since = self._clock()
            self.log.exception(
                "%s failed; it is retried, and logged again only once it works", self.what
            )
        self.failures += 1

    def succeeded(self) -> None:
        if self.failures:
            self.log.warning(
                "%s works again after %d failures in %.1f s",
                self.what,
                self.failures,
                self._clock() - self._since,
            )
            self.failures = 0
