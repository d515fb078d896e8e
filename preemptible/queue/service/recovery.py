"""A restarted manager takes up where the last one stopped: nothing acknowledged is lost.

Pending jobs wait again; running ones are adopted again (by pid and process start time, so a
recycled pid is not taken for the job); a notice stored but never sent is sent now with its
whole grace; and jobs whose processes vanished while nobody watched are requeued with the
reason, or finished when their status file says they had ended. A job whose runner is gone but
some of whose processes are not (its cgroup still lists them) keeps its GPUs until they are
killed and gone, as any run.
"""

from __future__ import annotations

from pathlib import Path

from preemptible.queue.core import RunningJob
from preemptible.queue.service import runner
from preemptible.queue.service.book import JobBook
from preemptible.queue.service.executor import Exit, ExitKind, ProcessHandle, recorded_exit
from preemptible.queue.service.records import JobRecord, SentNotice
from preemptible.queue.service.runs import JobRuns
from preemptible.queue.service.views import JobState


def recover(book: JobBook, runs: JobRuns, now: float) -> None:
    """Load every record from the state file and put each job back where it was."""
    for seq, _, token_hash, doc in book.store.load_jobs():
        book.add(seq, JobRecord.from_doc(doc), token_hash)
    lost_at = sorted((t, r.queue) for r in book.jobs.values() for t, _ in r.losses)
    for at, queue in lost_at:
        runs.preempted_at[queue].append(at)
    runs.shell.restore_usage(
        (
            (record.core_job(), run[0], None if run[1] < 0 else run[1])
            for record in book.jobs.values()
            for run in record.runs
        ),
        now,
    )
    for record in book.jobs.values():
        if record.state == JobState.PENDING:
            runs.line_up(record)  # its queue, its back-off, its dependencies, or its hold
        elif record.state.has_process:
            _readopt(book, runs, record, now)


def _readopt(book: JobBook, runs: JobRuns, record: JobRecord, now: float) -> None:
    status_path = runs.attempt_path(record.id, record.attempts, "status")
    handle = record.handle
    if handle is None:
        handle = _find_runner(status_path)
        if handle is not None:
            record.handle = handle
    if handle is not None and runs.executor.alive(handle):
        runs.executor.adopt(handle)
        _hold(runs, record, now, terminating=record.state == JobState.PREEMPTING)
        why = "still running: adopted again"
        notice = record.notice
        if notice is not None and notice.signalled_at is None and notice.killed_at is None:
            # The manager died between storing the notice and sending it: without this the
            # job would get SIGKILL at the deadline, never having been told to save.
            runs.executor.terminate(handle)
            notice.signalled_at = now
            notice.deadline = max(notice.deadline, now + notice.grace_s)
            why += "; its notice, never sent, sent now with its whole grace"
        with book.store.transaction() as db:
            book.store.update_job(db, record.id, record.state, record.to_doc())
            book.event(db, now, "recovered", record, why)
        return
    # Without a handle and with no runner left, the launch was never made, or the manager
    # died before saving its handle and the attempt has ended since: then its status file
    # says how (else a job that had completed would run again).
    ended = runs.executor.poll(handle) if handle is not None else recorded_exit(status_path)
    if handle is not None and ended is None:
        _adopt_leftovers(book, runs, record, status_path, now)
        return
    _hold(runs, record, now, terminating=False)
    if ended is None or ended.how is not ExitKind.EXITED:
        # Gone without an exit status while nobody watched: it must run again.
        ended = Exit(exit_code=None, signal=None, ended_at=now, how=ExitKind.LOST)
        if record.notice is None:
            record.notice = SentNotice(
                reason="its process was gone when the manager restarted",
                grace_s=0.0,
                sent_at=now,
                deadline=now,
            )
    runs.exited(record, ended, now)


def _adopt_leftovers(
    book: JobBook, runs: JobRuns, record: JobRecord, status_path: Path, now: float
) -> None:
    """The runner is gone but processes of the attempt are not: `poll` has sent them SIGKILL,
    and the job keeps its GPUs until they are gone, when the loop's poll reports its exit."""
    why = "its runner was gone but not all its processes: they are killed, then it ends"
    if record.notice is None and recorded_exit(status_path) is None:
        # Gone without an exit status while nobody watched: once its processes are gone too,
        # it runs again (as a vanished job does).
        record.notice = SentNotice(
            reason="its process was gone when the manager restarted",
            grace_s=0.0,
            sent_at=now,
            deadline=now,
            signalled_at=now,
            killed_at=now,
        )
    if record.notice is not None and record.notice.kind != "resize":
        record.state = JobState.PREEMPTING
    _hold(runs, record, now, terminating=True)
    with book.store.transaction() as db:
        book.store.update_job(db, record.id, record.state, record.to_doc())
        book.event(db, now, "recovered", record, why)


def _hold(runs: JobRuns, record: JobRecord, now: float, *, terminating: bool) -> None:
    """The job holds its GPUs again, at its current size: with those a grow took for its
    restart, and a shrink under way still under way."""
    notice = record.notice
    resize = notice.resize_kind if notice is not None and notice.kind == "resize" else None
    held = list(record.gpu_ids)
    if resize == "grow" and notice is not None and notice.gpu_ids:
        held = sorted(set(held) | set(notice.gpu_ids))
    runs.free_gpus.difference_update(held)
    size = len(held) or record.gpus
    running = RunningJob(
        job=record.core_job(),
        started_at=record.started_at or now,
        last_checkpoint_at=record.last_checkpoint_at,
        terminating=terminating,
        gpus=None if size == record.gpus else size,
    )
    runs.shell.adopt(running, now)
    if resize == "shrink" and notice is not None and not terminating:
        runs.shell.state.begin_shrink(record.id, len(notice.gpu_ids or ()), at=notice.sent_at)


def _find_runner(status_path: Path) -> ProcessHandle | None:
    """The runner of an attempt whose launch the manager did not live to record: found by
    the status path on its command line (only at recovery, so a scan of /proc is fine), with
    the cgroup or subreaper its command line gives it."""
    wanted = str(status_path)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if "--status" not in argv:
            continue
        parsed = runner.parse(argv[argv.index("--status") :])
        if parsed is not None and parsed[0] == wanted:
            ticks = int(stat.rsplit(")", 1)[1].split()[19])
            return ProcessHandle(
                pid=int(entry.name),
                start_ticks=ticks,
                status_path=wanted,
                cgroup=parsed[2],
                subreaper=parsed[3],
            )
    return None
