"""The queue manager's state on disk: one SQLite file in WAL mode.

Every change the manager makes is written here before it is acknowledged: a `201` for a
submission means the job is in the file (`synchronous=FULL`: the WAL is fsynced at each
commit). A job is one row holding its record as JSON, plus the columns the manager looks up by;
the audit log is a table of its own, each event with who asked for it (the kind and name of the
caller's token, none for the manager's own decisions), and so are the samples of the four
signals (one a minute for the last day, `history.py`); a file written before that table or those
columns existed gets them when opened.
The file carries its schema version: a file written by a newer version, or one that is not a
database, is refused with a clear error and never overwritten. One manager at a time: the state
folder is locked (`flock` on `queue.lock`, released when the process ends however it ends), and
a second one is refused with the pid of the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from preemptible.errors import StateStoreError

SCHEMA_VERSION = 1
FILE_NAME = "queue.sqlite3"
LOCK_NAME = "queue.lock"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE INDEX IF NOT EXISTS jobs_token ON jobs (token_hash);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    job_id TEXT,
    queue TEXT,
    reason TEXT NOT NULL,
    data TEXT NOT NULL,
    actor_kind TEXT,
    actor_name TEXT
);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id);
CREATE TABLE IF NOT EXISTS signal_samples (at REAL PRIMARY KEY, doc TEXT NOT NULL);
"""
_ADDED_COLUMNS = (("events", "actor_kind", "TEXT"), ("events", "actor_name", "TEXT"))
"""Columns added since the schema's first version: a file without them gains them (NULL)."""


class EventRow(NamedTuple):
    """One entry of the audit log as stored."""

    id: int
    at: float
    kind: str
    job_id: str | None
    queue: str | None
    reason: str
    data: dict[str, Any]
    by: tuple[str, str] | None
    """(kind, name) of the token that asked for it; None for the manager's own decisions."""


class Store:
    """The SQLite file under the state directory; safe to use from several threads."""

    def __init__(self, state_dir: Path):
        state_dir = Path(state_dir).absolute()
        self.path = state_dir / FILE_NAME
        try:
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StateStoreError(
                f"cannot create the state directory {state_dir}: {exc.strerror or exc}; "
                "choose another with --state"
            ) from None
        self._folder_lock = _lock_folder(state_dir)
        self._lock = threading.Lock()
        try:
            self._db = self._open()
        except BaseException:
            os.close(self._folder_lock)
            raise

    def _open(self) -> sqlite3.Connection:
        existed = self.path.exists()
        try:
            _private(self.path)  # before SQLite: its -wal and -shm take the file's mode
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            for suffix in ("-wal", "-shm"):  # left by an older version with another mode
                _private(self.path.with_name(self.path.name + suffix), create=False)
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=5000")
            version = self._version(db) if existed else None
        except sqlite3.OperationalError as exc:  # cannot open or write, not a wrong file
            raise StateStoreError(
                f"cannot open the state file {self.path} for writing ({exc}): make its folder "
                "writable and give its disk room, or choose another with --state"
            ) from None
        except sqlite3.DatabaseError as exc:
            raise StateStoreError(
                f"{self.path} is not a queue state file this version can read ({exc}); it was "
                "left as it is: move it away to start empty, or point --state elsewhere"
            ) from None
        except OSError as exc:
            raise StateStoreError(f"cannot open {self.path}: {exc}") from None
        if version is not None and version > SCHEMA_VERSION:
            db.close()
            raise StateStoreError(
                f"{self.path} was written by a newer preemptible (schema {version}, this one "
                f"reads up to {SCHEMA_VERSION}); it was left as it is: upgrade preemptible"
            )
        try:
            db.executescript(_SCHEMA)
            for table, column, kind in _ADDED_COLUMNS:
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        except sqlite3.OperationalError as exc:
            db.close()
            raise StateStoreError(
                f"cannot write the state file {self.path} ({exc}): make its folder writable "
                "and give its disk room, or choose another with --state"
            ) from None
        return db

    @staticmethod
    def _version(db: sqlite3.Connection) -> int | None:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" not in tables:
            if tables:
                raise sqlite3.DatabaseError("it has tables but no schema version")
            return None
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else None

    def close(self) -> None:
        """Close the file and release the state folder for another manager."""
        with self._lock:
            self._db.close()
            if self._folder_lock >= 0:
                os.close(self._folder_lock)  # closing the descriptor releases the flock
                self._folder_lock = -1

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic, durable write: all of it is on disk when the block ends, or none.

        Raises:
            StateStoreError: the file cannot be written (a full disk, a read-only folder, an
                I/O error); nothing of the transaction is stored.
        """
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise StateStoreError(
                    f"the state file {self.path} cannot be written ({exc}): free space on its "
                    "disk or make its folder writable; nothing of this change was stored"
                ) from exc

    # --- jobs ---------------------------------------------------------------------------------

    @staticmethod
    def insert_job(
        db: sqlite3.Connection,
        seq: int,
        job_id: str,
        queue: str,
        state: str,
        token_hash: str,
        doc: Any,
    ) -> None:
        """A new job, under the sequence number its id was made from (`next_seq`)."""
        db.execute(
            "INSERT INTO jobs (seq, id, queue, state, token_hash, doc) VALUES (?, ?, ?, ?, ?, ?)",
            (seq, job_id, queue, state, token_hash, json.dumps(doc)),
        )

    @staticmethod
    def update_job(db: sqlite3.Connection, job_id: str, state: str, doc: Any) -> None:
        db.execute(
            "UPDATE jobs SET state = ?, doc = ? WHERE id = ?", (state, json.dumps(doc), job_id)
        )

    def next_seq(self) -> int:
        """The sequence number the next job gets (ids are `j<seq>`)."""
        with self._lock:
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name='jobs'").fetchone()
        return (row[0] if row else 0) + 1

    def load_jobs(self) -> list[tuple[int, str, str, Any]]:
        """(sequence number, id, token hash, record) of every job, in submission order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, id, token_hash, doc FROM jobs ORDER BY seq"
            ).fetchall()
        try:
            return [(r[0], r[1], r[2], json.loads(r[3])) for r in rows]
        except json.JSONDecodeError as exc:
            raise StateStoreError(f"{self.path} holds a damaged job record: {exc}") from None

    # --- events -------------------------------------------------------------------------------

    @staticmethod
    def add_event(
        db: sqlite3.Connection,
        *,
        at: float,
        kind: str,
        job_id: str | None,
        queue: str | None,
        reason: str,
        data: dict[str, Any] | None = None,
        by: tuple[str, str] | None = None,
    ) -> int:
        """Add an event; `by` is the (kind, name) of the token that asked for it."""
        actor_kind, actor_name = by if by is not None else (None, None)
        cur = db.execute(
            "INSERT INTO events (at, kind, job_id, queue, reason, data, actor_kind, actor_name) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (at, kind, job_id, queue, reason, json.dumps(data or {}), actor_kind, actor_name),
        )
        return int(cur.lastrowid or 0)

    def events(
        self,
        *,
        since: int = 0,
        queue: str | None = None,
        job_id: str | None = None,
        limit: int = 1000,
    ) -> list[EventRow]:
        """Events after id `since`, oldest first, optionally of one queue or one job."""
        sql = (
            "SELECT id, at, kind, job_id, queue, reason, data, actor_kind, actor_name "
            "FROM events WHERE id > ?"
        )
        args: list[Any] = [since]
        if queue is not None:
            sql += " AND queue = ?"
            args.append(queue)
        if job_id is not None:
            sql += " AND job_id = ?"
            args.append(job_id)
        sql += " ORDER BY id LIMIT ?"
        args.append(limit)
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [
            EventRow(
                id=r[0],
                at=r[1],
                kind=r[2],
                job_id=r[3],
                queue=r[4],
                reason=r[5],
                data=json.loads(r[6]),
                by=None if r[7] is None else (r[7], r[8] or ""),
            )
            for r in rows
        ]

    # --- samples of the four signals ----------------------------------------------------------

    def add_signal_sample(self, at: float, doc: dict[str, Any], *, keep_after: float) -> None:
        """One sample of the signals at `at`; samples from before `keep_after` are dropped."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO signal_samples (at, doc) VALUES (?, ?)",
                (at, json.dumps(doc)),
            )
            db.execute("DELETE FROM signal_samples WHERE at < ?", (keep_after,))

    def signal_samples(self, *, since: float) -> list[tuple[float, dict[str, Any]]]:
        """(time, sample) of the samples taken after `since`, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT at, doc FROM signal_samples WHERE at > ? ORDER BY at", (since,)
            ).fetchall()
        return [(float(r[0]), json.loads(r[1])) for r in rows]


@dataclass(slots=True)
class _Write:
    fn: Callable[[sqlite3.Connection], None]
    done: bool = False
    error: BaseException | None = None


class GroupCommit:
    """Writes from many threads, committed together: one transaction and one fsync for all
    that arrive while the previous commit is on its way to the disk.

    The first writer to find no commit in flight commits the batch for everyone (no thread of
    its own); each write has its own savepoint, so one that fails fails alone.
    """

    def __init__(self, store: Store):
        self._store = store
        self._cv = threading.Condition()
        self._waiting: list[_Write] = []
        self._committing = False

    def write(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        """Run `fn` in a transaction; return once it is on disk, or raise what it raised."""
        mine = _Write(fn)
        with self._cv:
            self._waiting.append(mine)
            while not mine.done:
                if self._committing:
                    self._cv.wait()
                    continue
                self._committing = True
                batch, self._waiting = self._waiting, []
                self._cv.release()
                try:
                    self._commit(batch)
                finally:
                    self._cv.acquire()
                    self._committing = False
                    for write in batch:
                        write.done = True
                    self._cv.notify_all()
        if mine.error is not None:
            raise mine.error

    def _commit(self, batch: list[_Write]) -> None:
        try:
            with self._store.transaction() as db:
                for write in batch:
                    db.execute("SAVEPOINT one_write")
                    try:
                        write.fn(db)
                    except Exception as exc:  # this write fails; the others go on
                        db.execute("ROLLBACK TO one_write")
                        write.error = exc
                    db.execute("RELEASE one_write")
        except BaseException as exc:  # the commit itself failed: nothing of it is on disk
            for write in batch:
                write.error = write.error or exc


def _lock_folder(state_dir: Path) -> int:
    """Hold the state folder for this process: a descriptor with an exclusive `flock` on
    `queue.lock`, which holds this process's pid. The descriptor is not inherited by jobs
    (Python opens it close-on-exec), so no job can keep a dead manager's folder locked.

    Raises:
        StateStoreError: another process holds the folder (its pid is named).
    """
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StateStoreError(
            f"cannot write in the state folder {state_dir} ({exc.strerror or exc}): make it "
            "writable, or choose another with --state"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateStoreError(
            f"the state folder {state_dir} is in use by process {holder} (another "
            "`preemptible queue serve`); stop that one, or give this one another --state"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _private(path: Path, *, create: bool = True) -> None:
    """Make ``path`` readable and writable by the manager alone (0600): the file holds every
    job's environment. Created empty when missing and ``create`` (SQLite takes an empty file
    for an empty database)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        if create:
            raise
        return
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode) and stat.S_IMODE(mode) != 0o600:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
