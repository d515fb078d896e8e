"""The manager's job records and where they are kept: what its parts share under its lock.

The manager (submissions, reports, reading), its runs (`runs.py`) and its recovery
(`recovery.py`) all read and change the same records and write them to the same store; this is
that shared part, and nothing else: no clock, no lock, no decisions.
"""

from __future__ import annotations

from typing import Any

from preemptible.errors import JobNotFoundError
from preemptible.queue.service.records import JobRecord
from preemptible.queue.service.store import Store
from preemptible.queue.service.views import Principal


class JobBook:
    """Every job's record by id, the job behind each token's hash, and their state file."""

    def __init__(self, store: Store):
        self.store = store
        self.jobs: dict[str, JobRecord] = {}
        self.by_token: dict[str, str] = {}
        """The id of the job whose own token has this SHA-256 (tokens are never stored)."""

    def get(self, job_id: str) -> JobRecord:
        """The record of `job_id`.

        Raises:
            JobNotFoundError: no job has this id.
        """
        record = self.jobs.get(job_id)
        if record is None:
            raise JobNotFoundError(f"no job {job_id!r}")
        return record

    def save(self, record: JobRecord) -> None:
        """Write `record` to the state file in a transaction of its own."""
        with self.store.transaction() as db:
            self.store.update_job(db, record.id, record.state, record.to_doc())

    def event(
        self,
        db: Any,
        now: float,
        kind: str,
        record: JobRecord,
        reason: str,
        data: dict[str, Any] | None = None,
        *,
        by: Principal | None = None,
    ) -> None:
        """Add an audit event about `record` to the transaction `db`; `by` asked for it (None:
        the manager's own decision)."""
        self.store.add_event(
            db,
            at=now,
            kind=kind,
            job_id=record.id,
            queue=record.queue,
            reason=reason,
            data=data,
            by=None if by is None else (by.kind.value, by.name),
        )
