"""What a reporter is: the protocol a sink implements and the two ways it says "not now".

Apart from the fan-out in `__init__`, so that each sink (`kubernetes`, `slurm`, `prometheus`)
imports only this and the package imports the sinks without a circle.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from preemptible.checkpoint import CheckpointCost

__all__ = ["Deferred", "Reporter", "ReporterDisabled"]


@runtime_checkable
class Reporter(Protocol):
    """A sink for the measured cost.

    Two methods, because that is all a sink needs: ``report`` is called from the reporters'
    thread (never the training thread) with the newest cost and may block briefly (it should
    use a timeout of a few seconds); it raises to say "failed, retry later", `Deferred` to say
    "not now, rate limit" and `ReporterDisabled` to say "never again". ``close`` releases what
    the reporter holds.
    """

    name: str

    def report(self, cost: CheckpointCost) -> None: ...

    def close(self) -> None: ...


class Deferred(Exception):
    """A reporter's rate limit: send the newest cost again in ``retry_in_s`` (not a failure)."""

    def __init__(self, retry_in_s: float):
        super().__init__(f"rate-limited for {retry_in_s:.1f} s")
        self.retry_in_s = retry_in_s


class ReporterDisabled(Exception):
    """A reporter can never succeed (no permission): it is logged once and dropped."""
