"""The state file's group commit: many writers, one transaction each time, failures alone."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from preemptible.errors import StateStoreError
from preemptible.queue.service.store import FILE_NAME, GroupCommit, Store


def jobs_in(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:  # a second connection: what is really on disk
        return [r[0] for r in db.execute("SELECT id FROM jobs ORDER BY seq")]


def test_concurrent_writes_are_all_durable_in_fewer_commits(tmp_path: Path) -> None:
    store = Store(tmp_path)
    commits = GroupCommit(store)
    transactions = 0
    original = store.transaction

    def counting():  # type: ignore[no-untyped-def]
        nonlocal transactions
        transactions += 1
        return original()

    store.transaction = counting  # type: ignore[method-assign]
    start = threading.Barrier(16)

    def writer(n: int) -> None:
        start.wait()
        for k in range(20):
            seq = n * 100 + k + 1
            commits.write(
                lambda db, seq=seq: Store.insert_job(db, seq, f"j{seq}", "q", "pending", "h", {})
            )

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(jobs_in(store.path)) == 16 * 20
    assert transactions < 16 * 20  # writers that came together shared a commit
    assert store.next_seq() == 15 * 100 + 20 + 1


def test_a_failing_write_fails_alone(tmp_path: Path) -> None:
    store = Store(tmp_path)
    commits = GroupCommit(store)
    commits.write(lambda db: Store.insert_job(db, 1, "j1", "q", "pending", "h", {}))
    with pytest.raises(sqlite3.IntegrityError):  # the same id again
        commits.write(lambda db: Store.insert_job(db, 2, "j1", "q", "pending", "h", {}))
    commits.write(lambda db: Store.insert_job(db, 3, "j3", "q", "pending", "h", {}))
    assert jobs_in(store.path) == ["j1", "j3"]


def test_a_failing_write_in_a_shared_commit_fails_alone(tmp_path: Path) -> None:
    store = Store(tmp_path)
    commits = GroupCommit(store)
    commits.write(lambda db: Store.insert_job(db, 1, "j1", "q", "pending", "h", {}))
    errors: dict[str, BaseException] = {}

    def write(seq: int, job_id: str) -> None:
        try:
            commits.write(lambda db: Store.insert_job(db, seq, job_id, "q", "pending", "h", {}))
        except BaseException as exc:
            errors[job_id] = exc

    with store._lock:  # the disk is busy: the first writer waits inside its commit ...
        first = threading.Thread(target=write, args=(2, "j2"))
        first.start()
        time.sleep(0.1)
        together = [threading.Thread(target=write, args=a) for a in ((3, "j1"), (4, "j4"))]
        for t in together:  # ... and these two queue up for the next commit, as one batch
            t.start()
        time.sleep(0.1)
    for t in [first, *together]:
        t.join()
    assert list(errors) == ["j1"] and isinstance(errors["j1"], sqlite3.IntegrityError)
    assert jobs_in(store.path) == ["j1", "j2", "j4"]


def test_a_second_store_on_one_folder_is_refused_naming_the_first_process(tmp_path: Path) -> None:
    first = Store(tmp_path)
    with pytest.raises(StateStoreError, match=f"in use by process {os.getpid()}"):
        Store(tmp_path)
    first.close()
    Store(tmp_path).close()  # released on close (and by the kernel when a process dies)


def test_the_folder_lock_is_not_inherited_by_a_child_process(tmp_path: Path) -> None:
    store = Store(tmp_path)
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    child = subprocess.Popen(sleep, close_fds=False)  # even a launcher that passes every fd
    try:
        store.close()
        Store(tmp_path).close()  # a job that outlives its manager never holds its folder
    finally:
        child.kill()
        child.wait()


def test_an_audit_log_written_before_it_said_who_gains_the_columns(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        db.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "INSERT INTO meta VALUES ('schema_version', '1');"
            "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, "
            "kind TEXT NOT NULL, job_id TEXT, queue TEXT, reason TEXT NOT NULL, "
            "data TEXT NOT NULL);"
            "INSERT INTO events (at, kind, job_id, queue, reason, data) "
            "VALUES (1.0, 'submitted', 'j1', 'a', 'submitted', '{}');"
        )
    db.close()
    store = Store(tmp_path)
    with store.transaction() as db:
        store.add_event(
            db, at=2.0, kind="cancelled", job_id="j1", queue="a", reason="x", by=("admin", "admin")
        )
    found = [(r.kind, r.by) for r in store.events()]
    assert found == [("submitted", None), ("cancelled", ("admin", "admin"))]
    store.close()
