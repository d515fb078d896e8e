"""The two lines a framework run prints whatever its logging set-up: where it stopped, where
it resumed.

A framework integration's user sees Lightning's, Accelerate's or the Trainer's own output and
nothing of ours unless they configured logging: an INFO record on a logger without handlers goes
nowhere. These two lines are worth one stderr line each, so while the application has configured
no handler, the ``preemptible.run`` logger gets one of its own (as Lightning does for its
logger), and drops it once the application configures logging, so nothing prints twice.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("preemptible.run")

_handler: logging.Handler | None = None


def announce(message: str, *args: Any) -> None:
    """Log ``message % args`` at INFO on ``preemptible.run``, visible on stderr by default."""
    _follow_the_application()
    log.info(message, *args)


def _follow_the_application() -> None:
    global _handler
    configured = any(h is not _handler for h in _handlers_above(log))
    if configured and _handler is not None:
        log.removeHandler(_handler)
        _handler = None
    elif not configured and _handler is None:
        _handler = logging.StreamHandler()  # stderr, looked up at each record
        _handler.setFormatter(logging.Formatter("preemptible: %(message)s"))
        log.addHandler(_handler)
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)


def _handlers_above(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of ``logger`` reaches (its own and its ancestors')."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found.extend(current.handlers)
        if not current.propagate:
            break
        current = current.parent
    return found
