"""Who may call what: the checks the routes run before they ask the manager anything.

`auth.py` says who is calling (the admin, a queue, a job); this module says what that caller may
reach (docs/maintainers/design.md, "Service"): the admin everything; a queue token its own queue's
jobs, listings limited to them, and the machine's queues and signals; a job's own token only
that job's cost, notice, checkpointed and progress endpoints (no listing, no queue, no signal).
Each check raises `AccessDeniedError` (HTTP 403) with words that say which token would do, and
returns nothing else but the queue a listing is limited to. The API's routes (`api.py`) and the
dashboard's (`dashboard_api.py`) call the same checks, so a rule cannot differ between them.
Rejected alternative: one FastAPI dependency per rule, which would have to re-read the job id from
the path and hides from a route's body which rule it runs.
"""

from __future__ import annotations

from typing import Protocol

from preemptible.errors import AccessDeniedError
from preemptible.queue.service.views import Principal, PrincipalKind

__all__ = [
    "JobQueues",
    "check_job_access",
    "check_may_submit",
    "check_own_job",
    "check_team_or_admin",
    "queue_scope",
]


class JobQueues(Protocol):
    """What a check needs of the manager: the queue a job belongs to (`QueueManagerProtocol`
    has it), raising `JobNotFoundError` for an unknown job."""

    def job_queue(self, job_id: str) -> str: ...


def queue_scope(principal: Principal, queue: str | None) -> str | None:
    """The queue a listing is limited to: `queue` for the admin (None: every queue), the
    token's own for a queue token.

    Raises:
        AccessDeniedError: a job's token, or a queue token asking for another queue.
    """
    if principal.kind is PrincipalKind.ADMIN:
        return queue
    if principal.kind is PrincipalKind.JOB:
        raise _job_token_refused(principal)
    if queue not in (None, principal.name):
        raise AccessDeniedError(f"{principal.describe()} sees only its own queue, not {queue!r}")
    return principal.name


def check_team_or_admin(principal: Principal) -> None:
    """The queues and the signals of the whole machine: any queue's token or the admin's.

    Raises:
        AccessDeniedError: a job's token, which acts on its own job only.
    """
    if principal.kind is PrincipalKind.JOB:
        raise _job_token_refused(principal)


def check_job_access(manager: JobQueues, principal: Principal, job_id: str) -> None:
    """The admin, or the token of the job's queue, may read and cancel a job.

    Raises:
        AccessDeniedError: a job's token (even the job's own), or another queue's token.
        JobNotFoundError: no such job (asked only once the token is not a job's).
    """
    if principal.kind is PrincipalKind.JOB:
        raise _job_token_refused(principal)
    queue = manager.job_queue(job_id)
    if not principal.may_act_for_queue(queue):
        raise AccessDeniedError(
            f"job {job_id!r} belongs to queue {queue!r}; {principal.describe()} cannot reach it "
            "(use that queue's token or the admin token)"
        )


def check_own_job(principal: Principal, job_id: str) -> None:
    """Only the job's own token may report its cost, wait for its notice and say it saved.

    Raises:
        AccessDeniedError: any other token, the admin's included.
    """
    if principal.kind is not PrincipalKind.JOB or principal.name != job_id:
        raise AccessDeniedError(
            f"only job {job_id!r}'s own token (its PREEMPTIBLE_TOKEN) may call this; "
            f"this is {principal.describe()}"
        )


def check_may_submit(principal: Principal, queue: str) -> None:
    """The admin submits to any queue, a queue token to its own.

    Raises:
        AccessDeniedError: a job's token, or another queue's token.
    """
    if principal.may_act_for_queue(queue):
        return
    if principal.kind is PrincipalKind.JOB:
        raise _job_token_refused(principal)
    raise AccessDeniedError(
        f"{principal.describe()} may submit only to its own queue, not {queue!r}"
    )


def _job_token_refused(principal: Principal) -> AccessDeniedError:
    """The error for a job's token on a route that is not one of its job's own (returned, for
    the caller to raise)."""
    return AccessDeniedError(
        f"{principal.describe()} acts on its own job only (its cost, notice, checkpointed "
        "and progress endpoints); use a queue token or the admin token"
    )
