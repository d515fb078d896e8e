"""The manager's clock: wall-clock seconds that never jump while it runs.

Grace deadlines, minimum runtimes and waits are times on the wall clock, because they are stored
and outlive a restart. But the wall clock jumps (an NTP step, an operator's `date -s`, a VM
resumed after a pause): a jump of a day forward would pass every notice's deadline at once and
SIGKILL jobs that were saving; a jump back would hold jobs past their deadlines. So the manager
reads the wall clock once, at start, and advances it by the monotonic clock; a jump is logged
(once each) and takes effect at the next restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("preemptible.queue")

JUMP_S = 60.0
"""A difference between the wall clock and the manager's clock this large is a jump: logged."""


class SteadyClock:
    """Epoch seconds that follow the monotonic clock from one reading of the wall clock."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._wall = wall
        self._monotonic = monotonic
        self._offset = wall() - monotonic()
        self._reported = 0.0

    def __call__(self) -> float:
        now = self._offset + self._monotonic()
        jump = self._wall() - now
        if abs(jump - self._reported) >= JUMP_S:
            self._reported = jump
            log.warning(
                "the wall clock jumped %+.0f s; the manager keeps its own time (deadlines and "
                "minimum runtimes hold) until it restarts",
                jump,
            )
        return now
