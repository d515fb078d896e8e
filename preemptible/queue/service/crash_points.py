"""Named moments at which the fault-injection tests kill the manager, for real (SIGKILL).

The manager's promises (nothing acknowledged lost, nothing run twice, no torn checkpoint) are
about what a crash at any line leaves behind. The random kills of the durability soak reach
most lines; these names reach the few that matter most, every time: right after a decision is
on disk and before it is acted on. `PREEMPTIBLE_CRASH_AT` names one of `POINTS` in the
manager's own environment (jobs never see a `PREEMPTIBLE_*` variable of the manager's); unset,
as in production, a crash point costs one comparison.
"""

from __future__ import annotations

import os
import signal

from preemptible._env_names import CRASH_AT_ENV
from preemptible.errors import ConfigError

POINTS = {
    "submitted": "a submission is committed; its 201 is not sent",
    "admitted": "an admission is committed; the job is not launched",
    "launched": "the job is launched; its handle is not stored",
    "noticed": "a notice is committed; SIGTERM is not sent",
    "acked": "a job's ack of its notice is committed; its exit is not awaited",
    "finishing": "a job's exit is seen; its final state is not committed",
}

_armed = os.environ.get(CRASH_AT_ENV) or None
if _armed is not None and _armed not in POINTS:
    raise ConfigError(f"{CRASH_AT_ENV}={_armed!r} names no crash point; known: {sorted(POINTS)}")


def crash_point(name: str) -> None:
    """Die here, as by `kill -9`, when the environment names this point."""
    if name == _armed:
        os.kill(os.getpid(), signal.SIGKILL)
