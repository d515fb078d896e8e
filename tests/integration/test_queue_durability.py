"""The durability soak: SIGKILL `preemptible queue serve` at random moments, start it again.

A client thread keeps submitting short jobs to a lending queue (high tier) and a borrowing one
(low tier) on three virtual GPUs, so that the server is killed during submissions, admissions,
notices and requeues. Between a kill and the restart, the test now and then SIGKILLs a running
job's process group, as an OOM killer would: a job gone while nobody watched. After each
restart, and once everything has drained at the end, it checks:

- every job acknowledged with a `201` exists;
- no job runs twice at once: each attempt holds an exclusive `flock` on its job's lock file
  while it lives, and one that finds it taken writes `overlap`; the attempts' start and end
  lines (appended with `O_APPEND` to one file per job) must not overlap either;
- no job stays `running` or `preempting` for long once its process is gone;
- a job that finished is never run again (unless killed before its process exited: then its
  exit status is the kill), and every job ends `completed` (`cancelled` when the client
  cancelled it, now and then: nothing starts after a cancel is acknowledged);
- every attempt killed while the server was down was requeued, with a reason, in the events.

The server is killed `PREEMPTIBLE_SOAK_KILLS` times (default 20, about half a minute on two
cores; set 1000 for the long soak). `PREEMPTIBLE_SOAK_SEED` replays a seed (printed at the
start and in every failure); timing still differs from run to run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.polling import wait_until

from .queue_server import CLI, free_port

KILLS = int(os.environ.get("PREEMPTIBLE_SOAK_KILLS", "20"))
# About a second per kill on two cores; the long soak outlives the suite's 600 s per test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(max(600, 300 + 3 * KILLS))]
CONFIG = """
[cluster]
gpus = 3

[preemption]
grace_min = "1s"
grace_max = "1s"
min_runtime = "0s"
cooldown = "0s"
queue_budget_per_hour = 1000000

[service]
admin_token = "env:TEST_ADMIN_TOKEN"

[[queues]]
name = "a"
nominal = { gpus = 2 }
token = "env:TEST_A_TOKEN"

[[queues]]
name = "b"
nominal = { gpus = 1 }
borrowing_limit = { gpus = 2 }
token = "env:TEST_B_TOKEN"
"""
ADMIN = "admin-secret"
TOKENS = {"TEST_ADMIN_TOKEN": ADMIN, "TEST_A_TOKEN": "a-secret", "TEST_B_TOKEN": "b-secret"}
# One attempt of a job: `saver` saves and exits 143 on SIGTERM, `stubborn` notes it and goes on
# (it is killed at the deadline, or finishes first). It holds an exclusive flock on its job's lock
# file and on one per GPU it was given while it lives (the kernel drops them when it dies), and
# appends one line per event to its job's file: WORD ATTEMPT PID PGID START_TICKS TIME.
JOB = """\
import fcntl, os, signal, sys, time
mode, secs, gpus, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
job, attempt = os.environ["PREEMPTIBLE_JOB_ID"], os.environ["PREEMPTIBLE_ATTEMPT"]
with open("/proc/self/stat", "rb") as f:
    ticks = f.read().rsplit(b")", 1)[1].split()[19].decode()
def note(word):
    fd = os.open(os.path.join(out, job), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = f"{word} {attempt} {os.getpid()} {os.getpgrp()} {ticks} {time.time():.6f}\\n"
    os.write(fd, line.encode())
    os.close(fd)
def save(*_):
    note("saved")
    os._exit(143)
signal.signal(signal.SIGTERM, save if mode == "saver" else lambda *_: note("term"))
def hold(name, problem):
    fd = os.open(os.path.join(out, name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        note(problem)
hold(job, "overlap")
given = [g for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g]
if len(given) != gpus:
    note("gpu-count")
for gpu in given:
    hold("gpu-" + gpu, "gpu-taken")
note("start")
time.sleep(secs)
note("end")
"""
PROBLEMS = {
    "overlap": "started while another attempt of the job ran",
    "gpu-count": "was given another number of GPUs than it asked for",
    "gpu-taken": "was given a GPU that another job still held",
}
SETTLE_S = 4.0
"""How long a job may stay running or preempting once its process is gone (poll + cycle)."""


@dataclass
class Attempt:
    number: int
    pid: int
    pgid: int
    ticks: int
    started_at: float
    ended_at: float | None = None
    end: str | None = None
    """`end` (it finished its work), `saved` (it left on SIGTERM), None (killed)."""
    noticed: bool = False
    """It got SIGTERM."""


@dataclass
class Soak:
    """The server process, the acknowledged jobs and what the test did to them."""

    tmp: Path
    seed: int
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    startups: list[float] = field(default_factory=lambda: [1.0])
    """How long each start took until the server answered."""
    acked: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    """Submissions answered otherwise than 201 (none should be)."""
    cancelled: dict[str, int] = field(default_factory=dict)
    """Jobs whose cancel was acknowledged (202), with their attempts then: none may follow."""
    maybe_cancelled: set[str] = field(default_factory=set)
    """Jobs whose cancel got no answer (the server died): cancelled or completed."""
    killed_jobs: list[tuple[str, int, float]] = field(default_factory=list)
    """(job, attempt, when) of every attempt the test SIGKILLed while the server was down."""
    rng: random.Random = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)
    submitted: threading.Event = field(default_factory=threading.Event)
    stop_client: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- the server ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server and wait until it answers; a port found in use gets a new one."""
        for _ in range(5):
            spawned = time.monotonic()
            self._spawn()
            if self._answers():
                self.startups.append(time.monotonic() - spawned)
                return
            self.port = 0  # it exited 2: the port is in use (by someone else, or not yet free)
        raise AssertionError(f"the server would not start: {self._log_tail()}")

    def _spawn(self) -> None:
        self.port = self.port or free_port()
        config, state = self.tmp / "queue.toml", self.tmp / "state"
        argv = [*CLI, "queue", "serve", "--config", str(config), "--state", str(state)]
        argv.append("--allow-jobs-as-root")  # CI runs as root; its jobs are the test's own
        log = open(self.tmp / "server.log", "ab")  # noqa: SIM115 - closed with the process
        with log:
            self.proc = subprocess.Popen(
                [*argv, "--port", str(self.port)],
                env={**os.environ, **TOKENS, "PREEMPTIBLE_LOG_LEVEL": "WARNING"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _answers(self) -> bool:
        """Wait until the server answers (True) or exits with status 2 (False)."""
        proc = self.proc
        assert proc is not None

        def up(client: httpx.Client) -> str | None:
            with contextlib.suppress(httpx.HTTPError):
                if client.get("/healthz").status_code == 200:
                    return "answers"
            if proc.poll() is not None:
                assert proc.returncode == 2, self._log_tail()
                return "exited 2"
            return None

        with httpx.Client(base_url=self.url, timeout=1) as client:
            how = wait_until(
                lambda: up(client),
                "the server to answer",
                timeout=30,
                every=0.02,
                describe=self._log_tail,
            )
        return how == "answers"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def _log_tail(self) -> str:
        return (self.tmp / "server.log").read_text()[-3000:]

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        )

    # --- the client ---------------------------------------------------------------------------

    def client_loop(self, seed: int) -> None:
        """Keep about four jobs pending; remember every job acknowledged with a 201."""
        rng = random.Random(seed)
        script = self.tmp / "job.py"
        admin, url = self.admin(), self.url
        while not self.stop_client.is_set():
            if url != self.url:  # the server moved to another port
                admin.close()
                admin, url = self.admin(), self.url
            try:
                pending = admin.get("/v1/jobs", params={"state": "pending"}).json()
                if len(pending) >= 4:
                    time.sleep(0.1)
                    continue
                r = admin.post("/v1/jobs", json=self._job_body(rng, script))
            except httpx.HTTPError:
                time.sleep(0.05)  # the server is down (or died mid-answer: not acknowledged)
                continue
            with self.lock:
                if r.status_code == 201:
                    self.acked.append(r.json()["id"])
                else:
                    self.refusals.append(f"{r.status_code} {r.text}")
            self.submitted.set()
            if rng.random() < 0.1:
                self._cancel(admin, rng.choice(self.acked[-8:]))
        admin.close()

    def _cancel(self, admin: httpx.Client, job_id: str) -> None:
        try:
            r = admin.delete(f"/v1/jobs/{job_id}")
        except httpx.HTTPError:
            with self.lock:
                self.maybe_cancelled.add(job_id)
            return
        with self.lock:
            if r.status_code == 202:
                self.cancelled.setdefault(job_id, r.json()["attempts"])
            elif r.status_code != 409:  # 409: it had finished already
                self.refusals.append(f"cancel: {r.status_code} {r.text}")

    def _job_body(self, rng: random.Random, script: Path) -> dict[str, Any]:
        mode = rng.choice(["saver", "stubborn"])
        if rng.random() < 0.5:  # the lender, high tier: reclaims what b borrowed
            queue, tier, gpus, secs = "a", "high", 1, rng.uniform(0.2, 1.0)
        else:
            queue, tier, gpus, secs = "b", "low", rng.choice([1, 2]), rng.uniform(0.5, 2.5)
        argv = [sys.executable, "-I", "-S", str(script), mode, f"{secs:.2f}", str(gpus)]
        argv.append(str(self.out))
        return {"queue": queue, "tier": tier, "gpus": gpus, "command": argv}

    # --- the jobs' own records ----------------------------------------------------------------

    def attempts(self, job_id: str) -> tuple[dict[int, Attempt], list[str]]:
        """The attempts that started, by number, and every line that breaks a rule."""
        found: dict[int, Attempt] = {}
        problems, noticed = [], set()
        path = self.out / job_id
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            word, n, pid, pgid, ticks, at = line.split()
            number = int(n)
            if word in PROBLEMS:
                problems.append(f"{job_id} attempt {n} {PROBLEMS[word]}")
            elif word == "start":
                if number in found:
                    problems.append(f"{job_id} attempt {n} started twice")
                found[number] = Attempt(number, int(pid), int(pgid), int(ticks), float(at))
            elif word in ("term", "saved"):  # SIGTERM may come before the start line
                noticed.add(number)
            if word in ("end", "saved") and number in found:
                found[number].end, found[number].ended_at = word, float(at)
        for number in noticed & found.keys():
            found[number].noticed = True
        return found, problems

    def kill_a_job(self) -> None:
        """SIGKILL one running job's process group while the server is down."""
        live = []
        for path in self.out.iterdir():
            if path.suffix != ".lock":
                for a in self.attempts(path.name)[0].values():
                    if a.end is None and _alive(a.pid, a.ticks, a.pgid):
                        live.append((path.name, a))
        if live:
            job_id, a = self.rng.choice(sorted(live, key=lambda x: (x[0], x[1].number)))
            if _alive(a.pid, a.ticks, a.pgid):  # the group is ours while its member lives
                os.killpg(a.pgid, signal.SIGKILL)
                self.killed_jobs.append((job_id, a.number, time.time()))

    def kill_every_job(self) -> None:
        """SIGKILL what is left of the jobs: their runners are found by their status paths."""
        jobs_dir = str(self.tmp / "state" / "jobs").encode()
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"--status" in argv and argv[argv.index(b"--status") + 1].startswith(jobs_dir):
                    os.killpg(int(entry.name), signal.SIGKILL)  # a runner leads its job's group

    # --- the checks ---------------------------------------------------------------------------

    def check_after_restart(self, acked: list[str]) -> None:
        with self.admin() as admin:
            jobs = {j["id"]: j for j in _all_jobs(admin)}
            lost = [j for j in acked if j not in jobs]
            assert not lost, f"acknowledged jobs lost by a restart: {lost}"
            for job in jobs.values():
                if job["state"] in ("running", "preempting"):
                    self.check_not_stuck(admin, job)
            for job_id in jobs:
                assert not self.attempts(job_id)[1], self.attempts(job_id)[1]

    def check_not_stuck(self, admin: httpx.Client, job: dict[str, Any]) -> None:
        """A job whose current attempt's process is gone leaves running/preempting soon."""
        a = self.attempts(job["id"])[0].get(job["attempts"])
        if a is None or _alive(a.pid, a.ticks, a.pgid) or _group_alive(a.pgid):
            return  # still starting, or still running

        def moved_on() -> bool:
            now = admin.get(f"/v1/jobs/{job['id']}").json()
            return now["state"] != job["state"] or now["attempts"] != job["attempts"]

        wait_until(
            moved_on,
            f"{job['id']} to leave {job['state']} once its process was gone",
            timeout=SETTLE_S,
            every=0.1,
            describe=lambda: admin.get(f"/v1/jobs/{job['id']}").json(),
        )

    def check_at_the_end(self) -> dict[str, int]:
        with self.admin() as admin:
            jobs = {j["id"]: j for j in _all_jobs(admin)}
            events = _all_events(admin)
        by_job = defaultdict(list)
        for e in events:
            by_job[e["job_id"]].append(e)
        lost = [j for j in self.acked if j not in jobs]
        assert not lost, f"acknowledged jobs lost: {lost}"
        wrong = {j: v["state"] for j, v in jobs.items() if v["state"] not in self._ends(j)}
        assert not wrong, f"jobs that did not end as they should: {wrong}"
        killed = {(j, n) for j, n, _ in self.killed_jobs}
        killed |= {(j, n) for j in jobs for n in _killed_at_deadline(by_job[j])}
        for job_id, job in jobs.items():
            attempts, problems = self.attempts(job_id)
            assert not problems, problems
            if job["state"] == "completed":
                self._check_completed(job_id, job, attempts)
            if job_id in self.cancelled:  # nothing started after the cancel was acknowledged
                assert max(attempts, default=0) <= self.cancelled[job_id], attempts
            self._check_attempts(job_id, attempts, killed, by_job[job_id])
            self._check_notices(job_id, attempts, by_job[job_id])
        for job_id, n, at in self.killed_jobs:
            next_start = self.attempts(job_id)[0].get(n + 1)
            until = next_start.started_at if next_start else float("inf")
            notices = {e["reason"] for e in by_job[job_id] if e["kind"] == "notice"}
            requeued = [
                e
                for e in by_job[job_id]
                if e["kind"] in ("requeued", "cancelled")
                and at <= e["at"] <= until
                # vanished, or was leaving (a notice), or its cancel was asked for: then it ends
                # "stopped on request" whatever ended its process
                and (e["kind"] == "cancelled" or "gone" in e["reason"] or e["reason"] in notices)
            ]
            assert requeued, (
                f"{job_id} attempt {n} was killed but neither requeued nor cancelled: "
                f"{by_job[job_id]}"
            )
        kinds: dict[str, int] = defaultdict(int)
        for e in events:
            kinds[e["kind"]] += 1
        return dict(kinds)

    @staticmethod
    def _check_notices(
        job_id: str, attempts: dict[int, Attempt], events: list[dict[str, Any]]
    ) -> None:
        """An attempt killed at its notice's deadline got the notice (SIGTERM) first: it lived
        through the grace, so a SIGTERM would have left a line (or ended it)."""
        for attempt, e in _by_attempt(events):
            a = attempts.get(attempt)
            killed = e["kind"] in ("requeued", "cancelled") and e["data"].get("killed")
            if killed and a and not a.noticed:
                raise AssertionError(f"{job_id} attempt {attempt} was killed without its SIGTERM")

    def _ends(self, job_id: str) -> set[str]:
        """The states the job may end in."""
        if job_id in self.cancelled:
            return {"cancelled"}
        return {"completed", "cancelled"} if job_id in self.maybe_cancelled else {"completed"}

    @staticmethod
    def _check_completed(job_id: str, job: dict[str, Any], attempts: dict[int, Attempt]) -> None:
        assert attempts, f"{job_id} completed but never started: {job}"
        assert max(attempts) <= job["attempts"], f"{job_id}: more attempts than recorded"
        last = attempts[max(attempts)]
        assert last.end == "end", f"{job_id} completed but its last attempt did not finish"

    @staticmethod
    def _check_attempts(
        job_id: str,
        attempts: dict[int, Attempt],
        killed: set[tuple[str, int]],
        events: list[dict[str, Any]],
    ) -> None:
        ordered = sorted(attempts.values(), key=lambda a: a.started_at)
        assert [a.number for a in ordered] == sorted(attempts), f"{job_id}: attempts out of order"
        for before, after in itertools.pairwise(ordered):
            if before.ended_at is not None:
                assert before.ended_at <= after.started_at, f"{job_id}: attempts overlap"
        for a in ordered[:-1]:
            if a.end == "end" and (job_id, a.number) not in killed:
                raise AssertionError(
                    f"{job_id} finished in attempt {a.number} and ran again: {a}, {events}"
                )


def _killed_at_deadline(events: list[dict[str, Any]]) -> set[int]:
    """The attempts the manager SIGKILLed at their notice's deadline. One may have written its
    `end` line just before: its work was done, but its process had not exited, so it ran again
    (its exit status was the SIGKILL)."""
    by_the_manager = (
        n for n, e in _by_attempt(events) if e["kind"] == "requeued" and e["data"].get("killed")
    )
    return set(by_the_manager)


def _by_attempt(events: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each of a job's events with the attempt it belongs to: the k-th admission starts
    attempt k."""
    attempt = 0
    for e in events:
        attempt += e["kind"] == "admitted"
        yield attempt, e


def _alive(pid: int, ticks: int, pgid: int) -> bool:
    """Whether this very process (pid and start time) still runs in group `pgid`."""
    try:
        text = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    fields = text.rsplit(b")", 1)[1].split()
    return fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid and int(fields[19]) == ticks


def _group_alive(pgid: int) -> bool:
    """Whether the attempt's runner (the group leader, pid = pgid) still runs."""
    try:
        text = Path(f"/proc/{pgid}/stat").read_bytes()
    except OSError:
        return False
    fields = text.rsplit(b")", 1)[1].split()
    return fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid


def _all_jobs(admin: httpx.Client) -> list[dict[str, Any]]:
    """Every job: the pages of /v1/jobs, following each answer's Link to the next."""
    jobs: list[dict[str, Any]] = []
    response = admin.get("/v1/jobs")
    while True:
        jobs.extend(response.raise_for_status().json())
        if "next" not in response.links:
            return jobs
        response = admin.get(response.links["next"]["url"])


def _all_events(admin: httpx.Client) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        page = admin.get("/v1/events", params={"since": events[-1]["id"] if events else 0}).json()
        if not page:
            return events
        events.extend(page)


@pytest.fixture
def soak(tmp_path):
    seed = int(os.environ.get("PREEMPTIBLE_SOAK_SEED") or random.randrange(1 << 32))
    print(f"durability soak: seed {seed}, {KILLS} kills (PREEMPTIBLE_SOAK_SEED={seed})")
    s = Soak(tmp_path, seed)
    s.out.mkdir()
    (tmp_path / "queue.toml").write_text(CONFIG)
    (tmp_path / "job.py").write_text(JOB)
    yield s
    s.stop_client.set()
    s.stop()
    s.kill_every_job()


def test_killed_servers_lose_no_job_run_none_twice_and_forget_none(soak):
    seed = soak.seed
    try:
        _run(soak, seed)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n(seed {seed}: PREEMPTIBLE_SOAK_SEED={seed})") from exc


def _run(soak: Soak, seed: int) -> None:
    started = time.monotonic()
    soak.start()
    client = threading.Thread(target=soak.client_loop, args=(seed + 1,), daemon=True)
    client.start()
    rng = soak.rng
    for kill in range(1, KILLS + 1):
        if rng.random() < 0.5:
            time.sleep(rng.uniform(0.0, 0.5))  # any moment
        else:  # just after a submission: its cycle admits, and may notice a borrower
            soak.submitted.clear()
            soak.submitted.wait(timeout=0.5)
            time.sleep(rng.uniform(0.0, 0.03))
        soak.kill()
        with soak.lock:
            acked = list(soak.acked)
            assert not soak.refusals, f"submissions refused: {soak.refusals}"
        if rng.random() < 0.15:
            soak.kill_a_job()
        soak.start()
        soak.check_after_restart(acked)
        if kill % 25 == 0:
            took, start_s = time.monotonic() - started, sum(soak.startups[-25:]) / 25
            print(f"  {kill} kills, {len(acked)} jobs, {took:.0f} s (a start: {start_s:.2f} s)")
    soak.stop_client.set()
    client.join(timeout=30)
    with soak.admin() as admin:

        def unfinished() -> dict[str, str]:
            ended = ("completed", "failed", "cancelled")
            return {j["id"]: j["state"] for j in _all_jobs(admin) if j["state"] not in ended}

        wait_until(
            lambda: not unfinished(),
            "every job to end",
            timeout=120,
            every=0.2,
            describe=lambda: f"not ended: {unfinished()}",
        )
    kinds = soak.check_at_the_end()
    print(
        f"  drained after {time.monotonic() - started:.0f} s: {len(soak.acked)} jobs, "
        f"{len(soak.killed_jobs)} jobs killed while the server was down; "
        f"events {json.dumps(kinds, sort_keys=True)}"
    )
    # The soak means something only if it killed the server while jobs ran and were noticed.
    assert kinds.get("notice", 0) >= KILLS // 10, f"too few preemptions: {kinds}"
    assert kinds.get("recovered", 0) >= KILLS // 10, f"too few adoptions: {kinds}"
