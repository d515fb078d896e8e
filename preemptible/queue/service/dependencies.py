"""Dependencies between jobs: "start B after A", as `--after A[:ok|:any|:started]` says.

A job with dependencies waits in no queue until each is met; a dependency that can no longer be
met (A failed or was cancelled, for `ok`; A was cancelled before it ever started, for
`started`) cancels it, with that reason. Conditions, as SLURM's `afterok`, `afterany` and
`after`: `ok` A completed (exit 0), `any` A finished however it ended, `started` A has started
(its first attempt was launched).
"""

from __future__ import annotations

from enum import StrEnum

from preemptible.queue.service.records import JobRecord
from preemptible.queue.service.views import JobState

CONDITIONS = ("ok", "any", "started")


class Dependency(StrEnum):
    MET = "met"
    WAITING = "waiting"
    NEVER = "never"


def parse(spec: str) -> tuple[str, str]:
    """("j3", "ok") from "j3" or "j3:ok"."""
    job_id, _, condition = spec.partition(":")
    return job_id, condition or "ok"


def spec(job_id: str, condition: str) -> str:
    return f"{job_id}:{condition}"


def state_of(dependency: JobRecord, condition: str) -> Dependency:
    """Whether `condition` on `dependency` is met, may still be, or never will be."""
    state = dependency.state
    if condition == "started":
        if dependency.attempts > 0:
            return Dependency.MET
        return Dependency.NEVER if state.finished else Dependency.WAITING
    if condition == "any":
        return Dependency.MET if state.finished else Dependency.WAITING
    if state == JobState.COMPLETED:
        return Dependency.MET
    return Dependency.NEVER if state.finished else Dependency.WAITING


def words(job_id: str, condition: str) -> str:
    """ "j3 to succeed", "j3 to finish", "j3 to start"."""
    return {"ok": f"{job_id} to succeed", "any": f"{job_id} to finish"}.get(
        condition, f"{job_id} to start"
    )
