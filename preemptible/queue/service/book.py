"""The manager's job records and where they are kept: what its parts share under its lock.

The manager (submissions, reports, reading), its runs (`runs.py`) and its recovery
(`recovery.py`) all read and change the same records and write them to the same store; this is
that shared part, and nothing else: no clock, no lock, no decisions.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any

from preemptible.errors import JobNotFoundError, RequestError
from preemptible.queue.service.decision_log import log_decision
from preemptible.queue.service.records import JobRecord
from preemptible.queue.service.store import Store
from preemptible.queue.service.views import Principal


class JobBook:
    """Every job's record by id and in submission order, the job behind each token's hash,
    and their state file."""

    def __init__(self, store: Store):
        self.store = store
        self.jobs: dict[str, JobRecord] = {}
        self.by_token: dict[str, str] = {}
        """The id of the job whose own token has this SHA-256 (tokens are never stored)."""
        self._seqs: list[int] = []
        """Every job's sequence number, ascending: submission order, for pages."""
        self._seq_of: dict[str, int] = {}
        self._id_of: dict[int, str] = {}
        self.arrays: dict[str, list[str]] = {}
        """Array id -> the ids of its jobs, in submission order (`queue/arrays.py`)."""

    def add(self, seq: int, record: JobRecord, token_hash: str) -> None:
        """A job, under the sequence number its id was made from (`Store.next_seq`)."""
        self.jobs[record.id] = record
        self.by_token[token_hash] = record.id
        self._seq_of[record.id] = seq
        self._id_of[seq] = record.id
        if record.array_id is not None:
            self.arrays.setdefault(record.array_id, []).append(record.id)
        if not self._seqs or seq > self._seqs[-1]:
            self._seqs.append(seq)
        else:  # submissions committed together may arrive out of order
            bisect.insort(self._seqs, seq)

    def page(
        self, keep: Callable[[JobRecord], bool], *, after: str | None, limit: int | None
    ) -> list[JobRecord]:
        """Up to `limit` records that `keep` keeps, in submission order, from the first job
        submitted after `after` (None: from the first job).

        Raises:
            RequestError: `after` is not a job's id.
        """
        found: list[JobRecord] = []
        for record in self._from(after):
            if keep(record):
                found.append(record)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def _from(self, after: str | None) -> Iterator[JobRecord]:
        start = 0
        if after is not None:
            seq = self._seq_of.get(after)
            if seq is None:
                raise RequestError(f"after: no job {after!r} to list after; give a job's id")
            start = bisect.bisect_right(self._seqs, seq)
        for i in range(start, len(self._seqs)):
            yield self.jobs[self._id_of[self._seqs[i]]]

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
        who = None if by is None else (by.kind.value, by.name)
        self.store.add_event(
            db,
            at=now,
            kind=kind,
            job_id=record.id,
            queue=record.queue,
            reason=reason,
            data=data,
            by=who,
        )
        log_decision(kind, record.id, record.queue, reason, data, who)
