"""Does one client starve the others? Another team's submissions with and without a load.

A real ``preemptible queue serve`` (its default ``[service]`` limits) on a state file that already
holds ``--history`` finished jobs of team b (the finding: 9.4 MiB in one ``/v1/jobs``); its GPUs
are held by one job, so what team a submits waits, and the loop runs a cycle at every step.
Team a submits ``--jobs`` jobs, ``--rate`` a second (50: a script submitting a sweep, well within
its limit), one at a time on one keep-alive connection, twice:

- ``quiet``: nothing else runs;
- ``load``: at the same time, ``--listers`` clients with team b's token list jobs in a loop (each
  on its own connection; an answer of 429 is asked again at once, as a client that ignores
  ``Retry-After`` would), and a flood keeps ``--flood`` connections open that never send a byte,
  opening new ones as the server closes them.

It prints the submissions' p50 and p99 side by side and their ratio, what the listers and the
flood got, and whether the scheduling loop missed a cycle: read from ``/metrics`` before and
after each phase, a failed step, or a gap of more than 1.25 s between two steps (a cycle is due
every second), is a miss. Goal: p99 under 50 ms under the load, and no cycle missed.

    .venv/bin/python benchmarks/queue_load.py [--jobs 1000] [--rate 50] [--history 20000]
        [--listers 8] [--flood 600] [--repeat 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from preemptible._percentile import nearest_rank
from preemptible.queue.core import ServiceSettings, Tier
from preemptible.queue.service.records import JobRecord
from preemptible.queue.service.store import Store
from preemptible.queue.service.views import JobState

TOKENS = {"LOAD_ADMIN": "load-admin-token", "LOAD_A": "load-team-a", "LOAD_B": "load-team-b"}
ADMIN, TEAM_A, TEAM_B = TOKENS["LOAD_ADMIN"], TOKENS["LOAD_A"], TOKENS["LOAD_B"]
CONFIG = """
[cluster]
gpus = 4

[service]
admin_token = "env:LOAD_ADMIN"

[[queues]]
name = "a"
nominal = { gpus = 2 }
token = "env:LOAD_A"

[[queues]]
name = "b"
nominal = { gpus = 2 }
borrowing_limit = { gpus = 2 }
token = "env:LOAD_B"
"""
GOAL_P99_MS = 50.0
LATE_GAP_S = 1.25
"""A gap between two steps of the loop longer than this is a cycle missed (one is due each
second, and the loop steps every 0.2 s)."""


# --- the server ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fill_history(state: Path, n: int) -> None:
    """`n` finished jobs of team b, written straight into a new state file (one transaction)."""
    store = Store(state)
    now = time.time()
    with store.transaction() as db:
        for seq in range(1, n + 1):
            record = JobRecord(
                id=f"j{seq}",
                name=f"history-{seq}",
                queue="b",
                tier=Tier.NORMAL,
                gpus=1,
                cpus=0.0,
                memory_gb=0.0,
                gang=None,
                estimate_s=None,
                command=["python", "train.py", "--config", f"runs/{seq}.yaml"],
                env={},
                cwd="/home/b/project",
                submitted_at=now - 86400 + seq,
                state=JobState.COMPLETED,
                reason="completed: exited with 0",
                finished_at=now - 86400 + seq + 60,
                attempts=1,
                exit_code=0,
            )
            token_hash = hashlib.sha256(f"history-{seq}".encode()).hexdigest()
            store.insert_job(db, seq, record.id, "b", record.state, token_hash, record.to_doc())
    store.close()


class Server:
    """One `preemptible queue serve` process, its output in `root/server.log`."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        config = self.root / "queue.toml"
        config.write_text(CONFIG)
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - closed with the process
        argv = [sys.executable, "-m", "preemptible", "queue", "serve", "--config", str(config)]
        argv.append("--allow-jobs-as-root")  # no-op unless root: then the jobs are ours
        self.proc = subprocess.Popen(
            [*argv, "--state", str(self.root / "state"), "--port", str(self.port)],
            env={**os.environ, **TOKENS, "PREEMPTIBLE_LOG_LEVEL": "WARNING"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(self.log()[-2000:])
            time.sleep(0.1)
        raise RuntimeError("the queue server did not answer within 60 s")

    def log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cpu_s(self) -> float:
        """User + system CPU time of the server process so far (all its threads)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> dict[str, float]:
        """The loop's counters and step-gap buckets from `/metrics` (asked again while refused)."""
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"{self.url}/metrics", timeout=10)
                if answer.status_code == 200:
                    return parse_metrics(answer.text)
            if time.monotonic() > deadline:
                raise RuntimeError("/metrics did not answer within 30 s")
            time.sleep(0.2)


def parse_metrics(text: str) -> dict[str, float]:
    wanted = re.compile(
        r"^(preemptible_queue_(?:cycles_total|loop_steps_total|loop_step_failures_total|"
        r"loop_step_gap_seconds_bucket\{le=\"[^\"]+\"\}|loop_step_gap_seconds_count)|"
        r"preemptible_api_connections_refused_total|preemptible_api_connections_max) (\S+)$"
    )
    found = {}
    for line in text.splitlines():
        match = wanted.match(line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def hold_the_gpus(server: Server) -> str:
    """A job of team a holds every GPU: what is submitted after it waits (and a cycle runs)."""
    with server.client(ADMIN) as admin:
        body = {"queue": "a", "command": ["sleep", "3600"], "gpus": 4, "tier": "critical"}
        job = str(admin.post("/v1/jobs", json=body).raise_for_status().json()["id"])
        deadline = time.monotonic() + 30
        while admin.get(f"/v1/jobs/{job}").json()["state"] != "running":
            if time.monotonic() > deadline:
                raise RuntimeError("the job holding the GPUs never started")
            time.sleep(0.05)
    return job


def let_go(server: Server, holder: str) -> None:
    """Cancel the job that holds the GPUs (its `sleep` dies of the notice's SIGTERM), so that
    nothing outlives the run: a stopped server leaves its jobs running."""
    with server.client(ADMIN) as admin, contextlib.suppress(httpx.HTTPError):
        admin.delete(f"/v1/jobs/{holder}")
        deadline = time.monotonic() + 30
        while admin.get(f"/v1/jobs/{holder}").json()["state"] != "cancelled":
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)


# --- the load -----------------------------------------------------------------------------------


@dataclass
class Listers:
    """Clients listing jobs in a loop with one token (team b's)."""

    url: str
    clients: int
    stop: threading.Event = field(default_factory=threading.Event)
    ok: int = 0
    refused: int = 0
    other: int = 0
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for _ in range(self.clients):
            thread = threading.Thread(target=self._list, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _list(self) -> None:
        headers = {"Authorization": f"Bearer {TEAM_B}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as client:
            while not self.stop.is_set():
                try:
                    answer = client.get("/v1/jobs")
                except httpx.HTTPError:
                    with self.lock:
                        self.other += 1
                    continue
                with self.lock:
                    if answer.status_code == 200:
                        self.ok += 1
                        self.bytes += len(answer.content)
                    elif answer.status_code == 429:
                        self.refused += 1
                    else:
                        self.other += 1

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


@dataclass
class Flood:
    """`size` connections that never send a byte, re-opened as the server closes them."""

    port: int
    size: int
    stop: threading.Event = field(default_factory=threading.Event)
    opened: int = 0
    closed_by_server: int = 0
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._flood, daemon=True)
        self.thread.start()

    def _flood(self) -> None:
        socks: list[socket.socket] = []
        try:
            while not self.stop.is_set():
                alive = []
                for sock in socks:  # the ones the server closed are replaced
                    if closed(sock):
                        sock.close()
                        self.closed_by_server += 1
                    else:
                        alive.append(sock)
                socks = alive
                while len(socks) < self.size:
                    sock = socket.socket()
                    sock.setblocking(False)
                    code = sock.connect_ex(("127.0.0.1", self.port))
                    if code not in (0, errno.EINPROGRESS):
                        sock.close()
                        break
                    socks.append(sock)
                    self.opened += 1
                self.stop.wait(0.25)
        finally:
            for sock in socks:
                sock.close()

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def run_load(url: str, port: int, listers: int, flood: int, stop: Any, out: Any) -> None:
    """The load, in a process of its own (its threads must not slow the submitting client's
    interpreter down): until `stop` is set; then what it did goes to `out`."""
    running = Listers(url, listers)
    flooding = Flood(port, flood)
    running.start()
    flooding.start()
    stop.wait()
    running.finish()
    flooding.finish()
    out.put(
        {
            "pages": running.ok,
            "refused_429": running.refused,
            "other": running.other,
            "bytes": running.bytes,
            "opened": flooding.opened,
            "closed_by_server": flooding.closed_by_server,
        }
    )


@contextlib.contextmanager
def load(server: Server, listers: int, flood: int) -> Iterator[dict[str, int]]:
    """The listers and the flood running in another process; yields what they did, filled in
    once they have stopped."""
    context = multiprocessing.get_context("fork")
    stop, out = context.Event(), context.Queue()
    process = context.Process(
        target=run_load, args=(server.url, server.port, listers, flood, stop, out), daemon=True
    )
    process.start()
    done: dict[str, int] = {}
    try:
        time.sleep(2.0)  # the load is on before the first submission
        yield done
    finally:
        stop.set()
        done.update(out.get(timeout=120))
        process.join(timeout=30)


# --- a phase ------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    loop: dict[str, float] = field(default_factory=dict)
    listers: dict[str, float] = field(default_factory=dict)
    flood: dict[str, float] = field(default_factory=dict)
    asked: int = 0
    """Submissions sent and answered (fewer than asked for when the phase ran out of time)."""
    server_cpu: float = math.nan
    """The server's CPU seconds per second of the phase (1.0: one core all the time)."""

    def ms(self, q: float) -> float:
        return 1000 * nearest_rank(self.latencies_s, q, empty=math.nan)


def submit_all(server: Server, n: int, rate: float, budget_s: float, phase: Phase) -> None:
    """`n` submissions of team a, `rate` a second, one at a time on one keep-alive connection
    (a script submitting a sweep: well within its limit); those not done within `budget_s`
    are left out (the phase says how many were done)."""
    with server.client(TEAM_A) as client:
        client.get("/v1/queues")  # the connection is open before the clock starts
        started = time.perf_counter()
        for i in range(n):
            if time.perf_counter() - started > budget_s:
                break
            body = {"queue": "a", "command": ["true"], "gpus": 1, "tier": "low", "name": f"s{i}"}
            pause = started + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            t = time.perf_counter()
            try:
                answer = client.post("/v1/jobs", json=body)
            except httpx.HTTPError as exc:
                phase.errors.append(f"{type(exc).__name__}: {exc}"[:160])
                continue
            took = time.perf_counter() - t
            phase.asked += 1
            if answer.status_code == 201:
                phase.latencies_s.append(took)
            else:
                phase.errors.append(f"{answer.status_code} {answer.text[:120]}")
        phase.wall_s = time.perf_counter() - started


def loop_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    def d(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    gaps = {
        float(m.group(1)): d(key)
        for key in after
        if (m := re.search(r'le="([^"+]+)"', key)) and "gap" in key
    }
    within = gaps.get(LATE_GAP_S, 0.0)
    return {
        "steps": d("preemptible_queue_loop_steps_total"),
        "failed_steps": d("preemptible_queue_loop_step_failures_total"),
        "cycles": d("preemptible_queue_cycles_total"),
        "late_gaps": d("preemptible_queue_loop_step_gap_seconds_count") - within,
        "refused_connections": d("preemptible_api_connections_refused_total"),
    }


def run_phase(server: Server, name: str, args: argparse.Namespace) -> Phase:
    phase = Phase(name)
    before = server.metrics()
    cpu, clock = server.cpu_s(), time.perf_counter()
    if name == "quiet":
        submit_all(server, args.jobs, args.rate, args.phase_seconds, phase)
    else:
        with load(server, args.listers, args.flood) as done:
            started = time.perf_counter()
            submit_all(server, args.jobs, args.rate, args.phase_seconds, phase)
        seconds = time.perf_counter() - started + 2.0  # the load ran 2 s before too
        phase.listers = {
            "pages": done["pages"],
            "pages_per_s": round(done["pages"] / seconds, 1),
            "refused_429": done["refused_429"],
            "other": done["other"],
            "mib_per_s": round(done["bytes"] / seconds / 2**20, 2),
        }
        phase.flood = {"opened": done["opened"], "closed_by_server": done["closed_by_server"]}
    phase.server_cpu = (server.cpu_s() - cpu) / (time.perf_counter() - clock)
    phase.loop = loop_delta(before, server.metrics())
    return phase


# --- report -------------------------------------------------------------------------------------


def print_report(phases: list[Phase], args: argparse.Namespace, max_connections: float) -> bool:
    limits = ServiceSettings()
    print(
        f"\n{args.jobs} submissions of team a per phase, {args.rate:g} a second, one at a time; "
        f"{args.history} finished "
        f"jobs of team b on file; default limits: {limits.rate_per_s:g} requests/s per token "
        f"(burst {limits.burst}), {max_connections:g} connections"
    )
    head = f"{'phase':<8}{'done':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'errors':>8}"
    print(f"{head}{'srv CPU':>8}{'steps':>7}{'cycles':>8}{'failed':>8}{'late':>6}  load")
    for p in phases:
        load_words = "-"
        if p.listers:
            load_words = (
                f"{args.listers} listers: {p.listers['pages']} pages "
                f"({p.listers['pages_per_s']}/s, {p.listers['mib_per_s']} MiB/s), "
                f"{p.listers['refused_429']} x 429; flood of {args.flood}: "
                f"{p.flood['opened']} opened, {p.loop['refused_connections']:g} refused"
            )
        print(
            f"{p.name:<8}{p.asked:>6}{p.ms(0.5):>9.1f}{p.ms(0.99):>9.1f}{p.ms(1.0):>9.1f}{len(p.errors):>8}"
            f"{100 * p.server_cpu:>7.0f}%{p.loop['steps']:>7g}{p.loop['cycles']:>8g}{p.loop['failed_steps']:>8g}"
            f"{p.loop['late_gaps']:>6g}  {load_words}"
        )
        for error in p.errors[:3]:
            print(f"    error: {error}")
    quiet = [p for p in phases if p.name == "quiet"]
    loaded = [p for p in phases if p.name == "load"]
    q50 = min(p.ms(0.5) for p in quiet)
    q99 = min(p.ms(0.99) for p in quiet)
    l50 = max(p.ms(0.5) for p in loaded)
    l99 = max(p.ms(0.99) for p in loaded)
    print(
        f"with the load / without (worst run with / best without): p50 {l50 / q50:.2f}x "
        f"({l50:.1f} / {q50:.1f} ms), p99 {l99 / q99:.2f}x ({l99:.1f} / {q99:.1f} ms)"
    )
    missed = sum(p.loop["failed_steps"] + p.loop["late_gaps"] for p in phases)
    errors = sum(len(p.errors) for p in phases)
    met = l99 < GOAL_P99_MS and missed == 0 and errors == 0
    print(
        f"goal (p99 under load < {GOAL_P99_MS:.0f} ms, no cycle missed, no error): "
        f"{'met' if met else 'NOT met'} (p99 {l99:.1f} ms; {missed:g} missed; {errors} errors)"
    )
    return met


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--jobs", type=int, default=1000, help="submissions per phase (%(default)s)")
    add("--rate", type=float, default=50.0, help="team a's submissions a second (%(default)s)")
    add(
        "--phase-seconds",
        type=float,
        default=300.0,
        help="a phase stops submitting after this long (%(default)s)",
    )
    add("--history", type=int, default=20_000, help="finished jobs on file (%(default)s)")
    add("--listers", type=int, default=8, help="clients listing jobs in a loop (%(default)s)")
    add("--flood", type=int, default=600, help="idle connections kept open (%(default)s)")
    add("--repeat", type=int, default=2, help="quiet and load phases, alternated (%(default)s)")
    add("--json", type=Path, help="also write every result here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # SIGTERM (a `timeout`) stops the run through its `finally`: the server and its job go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="pbench-load-"))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    server = Server(root)
    phases: list[Phase] = []
    met, holder = False, None
    try:
        started = time.perf_counter()
        fill_history(root / "state", args.history)
        print(f"{args.history} finished jobs written in {time.perf_counter() - started:.1f} s")
        server.start()
        holder = hold_the_gpus(server)
        for k in range(args.repeat):
            for name in ("quiet", "load"):
                print(f"[{k + 1}] {name}: {args.jobs} submissions", flush=True)
                phases.append(run_phase(server, name, args))
                p = phases[-1]
                print(f"    p50 {p.ms(0.5):.1f} ms, p99 {p.ms(0.99):.1f} ms, loop {p.loop}")
        max_connections = server.metrics().get("preemptible_api_connections_max", math.nan)
        met = print_report(phases, args, max_connections)
    finally:
        if holder is not None:
            let_go(server, holder)
        server.stop()
        log = server.log() if (root / "server.log").exists() else ""
        print(f"server log: {len(log)} characters")
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        results = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "goal_met": met,
            "phases": [
                {
                    "name": p.name,
                    "done": p.asked,
                    "p50_ms": p.ms(0.5),
                    "p99_ms": p.ms(0.99),
                    "max_ms": p.ms(1.0),
                    "errors": p.errors[:10],
                    "wall_s": p.wall_s,
                    "server_cpu": p.server_cpu,
                    "loop": p.loop,
                    "listers": p.listers,
                    "flood": p.flood,
                }
                for p in phases
            ],
        }
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
