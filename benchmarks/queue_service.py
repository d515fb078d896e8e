"""The queue manager service beside SLURM: submissions, the scheduling loop, the hand-on.

Four parts, each selectable with ``--parts``:

- ``submit``: N jobs through ``POST /v1/jobs`` of a real ``preemptible queue serve``, from one
  client (keep-alive) and from 16 at once; then the same number of ``sbatch --wrap true`` to a
  one-node SLURM (``integrations/slurm/local/start.sh``), one process at a time and 16 at once.
  Both clusters are full: one ``sleep`` job holds every GPU and the submitted 1-GPU jobs wait
  behind it (ours at a lower tier, which never preempts), so nothing is launched and both
  schedulers see their queue grow.
  After each run the server (or ``slurmctld``) is SIGKILLed at once, started again on its state
  (for ours: the SQLite file is opened), and every acknowledged job id is looked up.
- ``fsync``: how many ``fsync``/``fdatasync`` calls each side makes per acknowledged submission
  (``strace -c`` on the server and on ``slurmctld``; a SIGKILL test shows that a job left the
  process, not that it reached the disk).
- ``cycle``: ``QueueManager.step()`` (poll the runs, run the core's cycle, store what changed),
  in-process, on ``examples/queue.toml`` with 10,000 pending jobs and a full machine: steps
  where nothing changed, and steps right after a running job ended (exit, cycle, admission and
  launch of the next job).
- ``handoff``: a low-tier job borrowing the lending queue's GPU is preempted by a high-tier job;
  on SIGTERM it "saves", calls ``POST /v1/jobs/{id}/checkpointed`` with its own token and exits.
  Timed from that call to the preemptor's process start, against the grace the victim had.

    .venv/bin/python benchmarks/queue_service.py [--parts submit,fsync,cycle,handoff] [--jobs 2000]

SLURM needs root and ``apt-get install slurmctld slurmd slurm-client munge``; without them the
SLURM rows say why they are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import resource
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))

import slurm_cluster  # a sibling script (benchmarks/slurm/), not a package
from ratios import record

from preemptible._percentile import nearest_rank
from preemptible.queue.core import parse_config_text
from preemptible.queue.service.executor import LaunchSpec, ProcessExecutor, ProcessHandle
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.store import FILE_NAME, Store
from preemptible.queue.service.views import JobState, SubmitRequest

HERE = Path(__file__).resolve().parent
EXAMPLE_CONFIG = HERE.parent / "examples" / "queue.toml"
TOKENS = {
    "BENCH_ADMIN_TOKEN": "bench-admin",
    "BENCH_A_TOKEN": "bench-a",
    "BENCH_B_TOKEN": "bench-b",
}
ADMIN, TEAM_A = TOKENS["BENCH_ADMIN_TOKEN"], TOKENS["BENCH_A_TOKEN"]
GOAL_RATE, GOAL_P99_MS, GOAL_CYCLE_MS = 500.0, 50.0, 20.0
HEALTH = "ours: GET /healthz"
"""The reference row: no token, no manager, no disk (what the HTTP stack alone costs)."""

# One queue owns the 4 GPUs; a normal-tier `sleep` holds them all and the low-tier submissions
# wait behind it (a lower tier never preempts a higher one). The server's throughput is what is
# measured, from one token: its per-caller limits (100 requests a second, 2 at once by default;
# benchmarks/queue_load.py measures what they are for) are lifted.
SUBMIT_CONFIG = """
[cluster]
gpus = 4

[service]
admin_token = "env:BENCH_ADMIN_TOKEN"
rate = 1000000
burst = 1000000
in_flight = 64

[[queues]]
name = "a"
nominal = { gpus = 4 }
token = "env:BENCH_A_TOKEN"
"""
# Queue b borrows a's second GPU; a high-tier job of a reclaims it. 30 s of grace, as the
# example configuration gives a job that reported no cost.
HANDOFF_CONFIG = """
[cluster]
gpus = 2

[preemption]
grace_min = "30s"
grace_max = "30s"
# The reclaim goes at once: by default it first waits for capacity to free on its own (up to
# three graces less the victim's), which is not what this part measures.
reclaim_within = "30s"
min_runtime = "0s"
cooldown = "0s"

[service]
admin_token = "env:BENCH_ADMIN_TOKEN"

[[queues]]
name = "a"
nominal = { gpus = 1 }
token = "env:BENCH_A_TOKEN"

[[queues]]
name = "b"
nominal = { gpus = 1 }
borrowing_limit = { gpus = 1 }
token = "env:BENCH_B_TOKEN"
"""
# The victim: on SIGTERM it saves (sleeps), says so with its own token, and exits. The
# attempt after the requeue just ends, so that each round leaves nothing behind.
VICTIM = """
import json, os, signal, sys, time, urllib.request
if os.environ["PREEMPTIBLE_ATTEMPT"] != "1":
    sys.exit(0)
out, save_s = sys.argv[1], float(sys.argv[2])
def stop(*_):
    term = time.time()
    time.sleep(save_s)
    url = os.environ["PREEMPTIBLE_QUEUE_URL"] + "/v1/jobs/" + os.environ["PREEMPTIBLE_JOB_ID"]
    req = urllib.request.Request(
        url + "/checkpointed", data=json.dumps({"step": 1}).encode(), method="POST",
        headers={"Authorization": "Bearer " + os.environ["PREEMPTIBLE_TOKEN"],
                 "Content-Type": "application/json"})
    ack = time.time()
    urllib.request.urlopen(req, timeout=10).read()
    acked = time.time()
    with open(out, "w") as f:
        json.dump({"term": term, "ack": ack, "acked": acked}, f)
    os._exit(143)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(600)
"""


# --- measurements -------------------------------------------------------------------------------


@dataclass
class Run:
    """One batch of submissions: who, how many clients, each call's latency, what was acked."""

    system: str
    clients: int
    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    durable: int | None = None
    durable_how: str = ""
    server_cpu_s: float = math.nan
    """CPU time of the server (or slurmctld) during the run."""
    client_cpu_s: float = math.nan
    """CPU time of the clients (our threads, or the sbatch processes) during the run."""

    @property
    def rate(self) -> float:
        return len(self.acked) / self.wall_s if self.wall_s else 0.0

    def pct_ms(self, q: float) -> float:
        return 1000 * percentile(self.latencies_s, q)

    def summary(self) -> dict[str, object]:
        return {
            "system": self.system,
            "clients": self.clients,
            "acked": len(self.acked),
            "errors": len(self.errors),
            "first_errors": self.errors[:3],
            "wall_s": round(self.wall_s, 3),
            "per_s": round(self.rate, 1),
            "p50_ms": round(self.pct_ms(0.50), 2),
            "p99_ms": round(self.pct_ms(0.99), 2),
            "max_ms": round(self.pct_ms(1.0), 2),
            "durable": self.durable,
            "durable_how": self.durable_how,
            "server_cpu_ms_per_call": round(1000 * self.server_cpu_s / self.calls, 3),
            "client_cpu_ms_per_call": round(1000 * self.client_cpu_s / self.calls, 3),
        }

    @property
    def calls(self) -> int:
        return max(1, len(self.acked) + len(self.errors))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); nan for no values."""
    return nearest_rank(values, q, empty=math.nan)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_seconds() -> float:
    """CPU time of this process and of its reaped children (the sbatch processes)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def drive(
    run: Run, n: int, make_submit: Callable[[], Callable[[int], str]], server_pid: int
) -> Run:
    """Submit `n` jobs from `run.clients` threads, each with its own `make_submit()`; the
    CPU time of `server_pid` and of the clients is recorded too."""
    counter = itertools.count()
    lock = threading.Lock()

    def work(submit: Callable[[int], str]) -> None:
        while (i := next(counter)) < n:
            started = time.perf_counter()
            try:
                job_id = submit(i)
            except Exception as exc:  # an error is a result here, counted and shown
                with lock:
                    run.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            took = time.perf_counter() - started
            with lock:
                run.latencies_s.append(took)
                run.acked.append(job_id)

    # The clients (an httpx.Client each) are made before the clock starts.
    threads = [threading.Thread(target=work, args=(make_submit(),)) for _ in range(run.clients)]
    server_cpu, client_cpu = cpu_seconds(server_pid), client_cpu_seconds()
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.wall_s = time.perf_counter() - started
    run.server_cpu_s = cpu_seconds(server_pid) - server_cpu
    run.client_cpu_s = client_cpu_seconds() - client_cpu
    return run


# --- our server ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One `preemptible queue serve` process on a fresh state directory."""

    def __init__(self, root: Path, config: str):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.state = root / "state"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "queue.toml").write_text(config)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - closed with the process
        argv = [sys.executable, "-m", "preemptible", "queue", "serve"]
        argv += ["--config", str(self.root / "queue.toml"), "--state", str(self.state)]
        argv.append("--allow-jobs-as-root")  # no-op unless root: then the jobs are ours
        self.proc = subprocess.Popen(
            [*argv, "--port", str(self.port)],
            env={**os.environ, **TOKENS, "PREEMPTIBLE_LOG_LEVEL": "WARNING"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError((self.root / "server.log").read_text()[-2000:])
            time.sleep(0.1)
        raise RuntimeError("the queue server did not answer within 30 s")

    def client(self, token: str = ADMIN) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown at all."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stored(self) -> dict[str, dict]:
        """Every job in the state file, by id (the server must be down or idle)."""
        with sqlite3.connect(self.state / FILE_NAME) as db:
            rows = db.execute("SELECT id, doc FROM jobs").fetchall()
        return {job_id: json.loads(doc) for job_id, doc in rows}

    def kill_jobs(self) -> None:
        """SIGKILL the process group of every job the state file says is running."""
        for doc in self.stored().values():
            if doc.get("handle"):
                ProcessExecutor().kill(ProcessHandle(**doc["handle"]))


def wait_for(client: httpx.Client, job_id: str, states: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        time.sleep(0.05)
    raise RuntimeError(f"{job_id} never reached {states}: {job}")


def blocked_server(root: Path) -> Server:
    """A server whose 4 GPUs are held by a `sleep` job (its submissions wait)."""
    server = Server(root, SUBMIT_CONFIG)
    server.start()
    with server.client() as admin:
        r = admin.post("/v1/jobs", json={"queue": "a", "command": ["sleep", "3600"], "gpus": 4})
        r.raise_for_status()
        wait_for(admin, r.json()["id"], {"running"})
    return server


def http_submit(server: Server) -> Callable[[int], str]:
    client = server.client(TEAM_A)  # one keep-alive connection per client thread

    def submit(i: int) -> str:
        body = {"queue": "a", "command": ["true"], "gpus": 1, "tier": "low", "name": f"b{i}"}
        r = client.post("/v1/jobs", json=body)
        if r.status_code != 201:
            raise RuntimeError(f"{r.status_code} {r.text[:150]}")
        return str(r.json()["id"])

    return submit


def http_health(server: Server) -> Callable[[int], str]:
    client = server.client(TEAM_A)
    return lambda i: str(client.get("/healthz").raise_for_status().status_code)


def ours_submit(root: Path, n: int, clients: int) -> tuple[Run, Run]:
    """`n` calls of GET /healthz (the HTTP stack alone, for reference), then `n` submissions."""
    health, run = Run(HEALTH, clients), Run("ours: POST /v1/jobs", clients)
    server = blocked_server(root)
    try:
        assert server.proc is not None
        drive(health, n, lambda: http_health(server), server.proc.pid)
        drive(run, n, lambda: http_submit(server), server.proc.pid)
        server.kill()
        stored = server.stored()
        run.durable = sum(1 for job_id in run.acked if job_id in stored)
        run.durable_how = f"SIGKILL, then read the SQLite file: {len(stored)} jobs"
    finally:
        server.kill()
        server.kill_jobs()
    return health, run


# --- SLURM --------------------------------------------------------------------------------------


def slurm_submit(root: Path, n: int, clients: int) -> Run:
    run = Run("SLURM: sbatch", clients)
    root.mkdir(parents=True, exist_ok=True)
    slurm_cluster.blocked()
    drive(run, n, lambda: slurm_cluster.sbatch_submit(root), slurm_cluster.controller_pid())
    known = slurm_cluster.crash_and_recover()
    run.durable = sum(1 for job_id in run.acked if job_id in known)
    run.durable_how = f"SIGKILL slurmctld, restart on its state: it knew {len(known)} jobs"
    return run


# --- fsync count --------------------------------------------------------------------------------


def count_syncs(
    pid: int, n: int, submit: Callable[[int], str], trace: Path
) -> tuple[int, list[str]]:
    """fsync + fdatasync calls by `pid`'s threads for `n` submissions, and the acked ids.

    Returns 6 s after the last submission (SLURM saves its state at most every 5 s).
    """
    tracer = subprocess.Popen(
        ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-p", str(pid), "-o", str(trace)],
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # strace attaches to every thread
    acked = []
    for i in range(n):
        with contextlib.suppress(Exception):  # an error is a submission not acked
            acked.append(submit(i))
    time.sleep(6.0)
    tracer.send_signal(signal.SIGINT)
    tracer.wait(30)
    calls = 0
    for line in trace.read_text().splitlines():
        parts = line.split()
        if parts and parts[-1] in ("fsync", "fdatasync"):
            calls += int(parts[3])
    return calls, acked


def fsync_part(root: Path, n: int, slurm_ok: bool) -> dict[str, object]:
    """Sync calls per submission; then SIGKILL 6 s after the last one, and what was kept."""
    result: dict[str, object] = {"jobs": n}
    server = blocked_server(root / "fsync")
    try:
        assert server.proc is not None
        calls, acked = count_syncs(server.proc.pid, n, http_submit(server), root / "ours.strace")
        server.kill()
        kept = sum(1 for job_id in acked if job_id in server.stored())
        result["ours"] = {"syncs": calls, "acked": len(acked), "kept_after_6s": kept}
    finally:
        server.kill()
        server.kill_jobs()
    if slurm_ok:
        slurm_cluster.blocked()
        pid, submit = slurm_cluster.controller_pid(), slurm_cluster.sbatch_submit(root)
        calls, acked = count_syncs(pid, n, submit, root / "slurm.strace")
        known = slurm_cluster.crash_and_recover()
        kept = sum(1 for job_id in acked if job_id in known)
        result["slurm"] = {"syncs": calls, "acked": len(acked), "kept_after_6s": kept}
    return result


# --- the scheduling loop ------------------------------------------------------------------------


class TimedExecutor(ProcessExecutor):
    """The real executor, timing each launch (a step that admits also starts processes)."""

    def __init__(self) -> None:
        super().__init__()
        self.launch_s: list[float] = []

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        started = time.perf_counter()
        try:
            return super().launch(spec)
        finally:
            self.launch_s.append(time.perf_counter() - started)


class TimedStore(Store):
    """The real store, timing each transaction (its body, the commit and the commit's fsync)."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.transaction_s: list[float] = []

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        started = time.perf_counter()
        with super().transaction() as db:
            yield db
        self.transaction_s.append(time.perf_counter() - started)


def cycle_part(root: Path, pending: int, steps: int) -> dict[str, object]:
    """`QueueManager.step()` on the example configuration with `pending` jobs waiting.

    Two kinds of step: `steady`, where nothing has changed since the last cycle, and `churn`,
    where a running job has just ended, so the step records its exit, frees its GPUs and the
    cycle admits and launches what comes next (the live loop runs a cycle on every change).
    """
    config = parse_config_text(EXAMPLE_CONFIG.read_text(), path=EXAMPLE_CONFIG)
    executor, store = TimedExecutor(), TimedStore(root / "cycle")
    m = QueueManager(
        config,
        store,
        executor,
        state_dir=root / "cycle",
        url="http://127.0.0.1:9",
        cycle_every_s=0.0,  # every step runs a cycle (the live loop: on a change, or each second)
    )
    rng = random.Random(0)
    queues = [q.name for q in config.queues]
    started = time.perf_counter()
    for i in range(pending):
        m.submit(
            SubmitRequest(
                queue=rng.choice(queues),
                command=["sleep", "3600"],
                gpus=rng.choice([1, 1, 1, 2, 4, 8]),
                tier=rng.choice(["low", "normal", "normal", "high"]),
                estimate_s=rng.choice([None, 1800.0, 7200.0]),
                name=f"c{i}",
            )
        )
    submit_s = time.perf_counter() - started
    result: dict[str, object] = {"submit_in_process_per_s": round(pending / submit_s, 1)}
    try:
        t = time.perf_counter()
        m.step()  # the first cycle admits what fits
        result["first_step_ms"] = round(1000 * (time.perf_counter() - t), 1)
        for _ in range(5):
            m.step()
        result["steady"] = timed_steps(m, executor, store, steps, end_one=None)
        result["churn"] = timed_steps(m, executor, store, steps, end_one=rng)
        running = [r for r in m.jobs.values() if r.state == JobState.RUNNING]
        result["pending"] = sum(1 for r in m.jobs.values() if r.state == JobState.PENDING)
        result["running"] = len(running)
        result["gpus_used"] = sum(r.gpus for r in running)
        result["gpus"] = config.cluster.gpus
    finally:
        for record in m.jobs.values():
            if record.handle:
                executor.kill(record.handle)
        m.store.close()
    return result


def timed_steps(
    m: QueueManager,
    executor: TimedExecutor,
    store: TimedStore,
    steps: int,
    end_one: random.Random | None,
) -> dict[str, float]:
    """Median and p99 of `steps` steps; medians of the parts of a step: the shell's cycles (the
    core's decisions applied, launches included), the launches, the SQLite transactions."""
    m.cycle_seconds.clear()
    times, launches, writes, commits = [], [], [], []
    for _ in range(steps):
        if end_one is not None:  # SIGKILL one running job, and wait until its runner is gone
            running = [r for r in m.jobs.values() if r.state == JobState.RUNNING]
            handle = end_one.choice(running).handle
            assert handle is not None, "a running job has a handle"
            executor.kill(handle)
            while executor.poll(handle) is None:
                time.sleep(0.005)
        executor.launch_s.clear()
        store.transaction_s.clear()
        t = time.perf_counter()
        m.step()
        times.append(time.perf_counter() - t)
        launches.append(sum(executor.launch_s))
        writes.append(sum(store.transaction_s))
        commits.append(len(store.transaction_s))
    core = list(m.cycle_seconds)
    return {
        "steps": steps,
        "step_median_ms": round(1000 * statistics.median(times), 2),
        "step_p99_ms": round(1000 * percentile(times, 0.99), 2),
        "cycle_median_ms": round(1000 * statistics.median(core), 2),
        "cycle_p99_ms": round(1000 * percentile(core, 0.99), 2),
        "launch_median_ms": round(1000 * statistics.median(launches), 2),
        "sqlite_median_ms": round(1000 * statistics.median(writes), 2),
        "sqlite_transactions_median": statistics.median(commits),
    }


# --- notice, checkpointed, hand-on --------------------------------------------------------------


def handoff_part(root: Path, rounds: int, save_s: float) -> dict[str, object]:
    server = Server(root / "handoff", HANDOFF_CONFIG)
    server.start()
    rows = []
    try:
        with server.client() as admin:
            for k in range(rounds):
                rows.append(handoff_round(admin, root / "handoff", k, save_s))
                r = rows[-1]
                print(
                    f"  round {k + 1}: checkpointed -> preemptor started "
                    f"{1000 * r['ack_to_process_s']:.0f} ms; notice -> started "
                    f"{r['notice_to_process_s']:.2f} s of {r['grace_s']:.0f} s grace",
                    flush=True,
                )
    finally:
        server.kill()
        server.kill_jobs()

    def stat(key: str) -> dict[str, float]:
        values = [float(r[key]) for r in rows]
        return {"median": statistics.median(values), "max": max(values), "min": min(values)}

    keys = (
        "ack_call_s",
        "ack_to_admitted_s",
        "ack_to_process_s",
        "notice_to_process_s",
        "grace_s",
        "grace_used",
    )
    return {"rounds": rows, "save_s": save_s, **{key: stat(key) for key in keys}}


def handoff_round(admin: httpx.Client, work: Path, k: int, save_s: float) -> dict[str, float]:
    """One preemption: the victim runs, the preemptor comes, both end; the times of each step."""
    victim_out, started_file = work / f"victim-{k}.json", work / f"preemptor-{k}.t"
    code = [sys.executable, "-c", VICTIM, str(victim_out), str(save_s)]
    body = {"queue": "b", "command": code, "gpus": 2, "tier": "low", "cwd": str(work)}
    victim = admin.post("/v1/jobs", json=body).json()["id"]
    deadline = time.monotonic() + 30
    while "ready" not in admin.get(f"/v1/jobs/{victim}/logs").json()["text"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"victim {victim} never said it was ready")
        time.sleep(0.05)
    stamp = ["sh", "-c", f"date +%s.%N > {started_file}"]
    body = {"queue": "a", "command": stamp, "gpus": 1, "tier": "high"}
    preemptor = admin.post("/v1/jobs", json=body).json()["id"]
    started_at = wait_for(admin, preemptor, {"completed"})["started_at"]
    wait_for(admin, victim, {"completed"})
    history = admin.get(f"/v1/jobs/{victim}/why").json()["history"]
    notice = next(e for e in history if e["kind"] == "notice")
    requeued = next(e for e in history if e["kind"] == "requeued")
    if not requeued["data"]["acked"] or requeued["data"]["killed"]:
        raise RuntimeError(f"the victim did not leave as it should: {requeued}")
    times = json.loads(victim_out.read_text())
    process = float(started_file.read_text())
    grace = float(notice["data"]["grace_s"])
    return {
        "grace_s": grace,
        "notice_to_term_s": times["term"] - notice["at"],
        "ack_call_s": times["acked"] - times["ack"],
        "ack_to_admitted_s": started_at - times["ack"],
        "ack_to_process_s": process - times["ack"],
        "notice_to_process_s": process - notice["at"],
        "grace_used": (process - notice["at"]) / grace,
    }


# --- report -------------------------------------------------------------------------------------


def submit_part(root: Path, args: argparse.Namespace, slurm_ok: bool) -> list[list[Run]]:
    """Every (system, clients) row `args.repeat` times, in rotation; a list of runs per row."""
    rows: dict[tuple[str, int], list[Run]] = {}
    for k in range(args.repeat):
        for clients in (1, args.clients):
            print(f"[{k + 1}] ours, {clients} client(s): {args.jobs} submissions", flush=True)
            for run in ours_submit(root / f"ours-{k}-{clients}", args.jobs, clients):
                rows.setdefault((run.system, clients), []).append(run)
                print(f"    {run.system}: {run.rate:.0f}/s, p99 {run.pct_ms(0.99):.1f} ms")
        for clients in (1, args.clients) if slurm_ok else ():
            print(f"[{k + 1}] SLURM, {clients} sbatch at a time: {args.jobs}", flush=True)
            run = slurm_submit(root / f"slurm-{k}-{clients}", args.jobs, clients)
            rows.setdefault((run.system, clients), []).append(run)
            print(f"    {run.rate:.0f}/s, p99 {run.pct_ms(0.99):.1f} ms", flush=True)
    return list(rows.values())


def row_summary(runs: list[Run]) -> dict[str, object]:
    """Medians over the repeats (and the range of the rate); durable summed over them."""
    rates = [r.rate for r in runs]
    return {
        "system": runs[0].system,
        "clients": runs[0].clients,
        "per_s": statistics.median(rates),
        "per_s_range": (min(rates), max(rates)),
        "p50_ms": statistics.median(r.pct_ms(0.5) for r in runs),
        "p99_ms": statistics.median(r.pct_ms(0.99) for r in runs),
        "max_ms": max(r.pct_ms(1.0) for r in runs),
        "acked": sum(len(r.acked) for r in runs),
        "durable": None if runs[0].durable is None else sum(r.durable or 0 for r in runs),
        "errors": sum(len(r.errors) for r in runs),
        "server_cpu_ms": statistics.median(1000 * r.server_cpu_s / r.calls for r in runs),
        "client_cpu_ms": statistics.median(1000 * r.client_cpu_s / r.calls for r in runs),
        "runs": [r.summary() for r in runs],
    }


def print_submit(rows: list[dict], n: int, slurm_skipped: str | None) -> None:
    print(f"\nsubmissions: {n} jobs a run, each 1 GPU, waiting behind a job that holds every GPU")
    print(
        "(median of the runs; durable: acknowledged ids found after SIGKILL and restart; "
        "CPU: ms per call, of the server or slurmctld, and of the clients)"
    )
    head = f"{'':<20}{'clients':>8}{'per s':>7}{'range':>10}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
    print(f"{head}{'durable':>11}{'srv CPU':>9}{'cli CPU':>9}{'rate/SLURM':>11}{'p99/SLURM':>10}")
    slurm = {r["clients"]: r for r in rows if str(r["system"]).startswith("SLURM")}
    for r in rows:
        peer = None if r["system"] == HEALTH else slurm.get(r["clients"])
        rate = f"{r['per_s'] / peer['per_s']:.2f}x" if peer else "-"
        p99 = f"{r['p99_ms'] / peer['p99_ms']:.2f}x" if peer else "-"
        lo, hi = r["per_s_range"]
        durable = "-" if r["durable"] is None else f"{r['durable']}/{r['acked']}"
        print(
            f"{r['system']:<20}{r['clients']:>8}{r['per_s']:>7.0f}{f'{lo:.0f}-{hi:.0f}':>10}"
            f"{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}{r['max_ms']:>8.1f}{durable:>11}"
            f"{r['server_cpu_ms']:>9.2f}{r['client_cpu_ms']:>9.2f}{rate:>11}{p99:>10}"
        )
        if r["errors"]:
            print(f"  {r['errors']} errors, first: {r['runs'][0]['first_errors']}")
    if slurm_skipped:
        print(f"SLURM: skipped: {slurm_skipped}")
    for r in rows:
        if r["system"] != "ours: POST /v1/jobs":
            continue
        met = r["per_s"] >= GOAL_RATE and r["p99_ms"] < GOAL_P99_MS and r["durable"] == r["acked"]
        peer = slurm.get(r["clients"])
        ahead = "" if peer is None else (" ahead of" if r["per_s"] > peer["per_s"] else " behind")
        print(
            f"goal (>= {GOAL_RATE:.0f}/s durable, p99 < {GOAL_P99_MS:.0f} ms), {r['clients']} "
            f"client(s): {'met' if met else 'NOT met'}{ahead + ' sbatch' if peer else ''}"
        )


def print_fsync(f: dict) -> None:
    for side in ("ours", "slurm"):
        if side in f:
            s = f[side]
            print(
                f"{side:<6}{s['syncs']:>6} fsync/fdatasync for {s['acked']} acknowledged: "
                f"{s['syncs'] / max(1, s['acked']):.2f} per submission; SIGKILL 6 s after the "
                f"last: {s['kept_after_6s']}/{s['acked']} kept"
            )


def print_cycle(c: dict) -> None:
    print(
        f"{c['pending']} pending, {c['running']} running on {c['gpus_used']}/{c['gpus']} GPUs; "
        f"the first step {c['first_step_ms']} ms"
    )
    head = f"{'step':<46}{'median':>9}{'p99':>9}{'vs goal':>9}"
    print(f"{head}{'| cycles':>10}{'launches':>10}{'SQLite':>9}{'commits':>9}  (medians)")
    for key, words in (
        ("steady", "nothing changed since the last cycle"),
        ("churn", "a job has ended: exit, cycle, admit, launch"),
    ):
        s = c[key]
        print(
            f"{words:<46}{s['step_median_ms']:>7.2f}ms{s['step_p99_ms']:>7.2f}ms"
            f"{s['step_median_ms'] / GOAL_CYCLE_MS:>8.2f}x{s['cycle_median_ms']:>8.2f}ms"
            f"{s['launch_median_ms']:>8.2f}ms{s['sqlite_median_ms']:>7.2f}ms"
            f"{s['sqlite_transactions_median']:>9g}"
        )
        what = f"manager step median, {key}"
        record("queue", what, s["step_median_ms"], GOAL_CYCLE_MS, "goal", unit="ms", goal=1.0)
    print(
        f"goal: median step < {GOAL_CYCLE_MS:.0f} ms (ratio < 1.00x); the cycles include the "
        "launches and the admissions' SQLite writes"
    )


def print_handoff(h: dict) -> None:
    for key, words in (
        ("ack_call_s", "POST checkpointed answered"),
        ("ack_to_admitted_s", "checkpointed -> preemptor admitted"),
        ("ack_to_process_s", "checkpointed -> preemptor's process started"),
        ("notice_to_process_s", "notice -> preemptor's process started"),
    ):
        s = h[key]
        print(f"{words:<46} median {1000 * s['median']:6.0f} ms, max {1000 * s['max']:6.0f} ms")
    g = h["grace_used"]
    print(
        f"of its {h['grace_s']['median']:.0f} s grace, the victim's GPUs were in use again after "
        f"{100 * g['median']:.1f}% (max {100 * g['max']:.1f}%)"
    )
    notice, grace = h["notice_to_process_s"]["median"], h["grace_s"]["median"]
    record("queue", "notice -> preemptor started", notice, grace, "the victim's grace", goal=1.0)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--parts", default="submit,fsync,cycle,handoff", help="comma-separated (%(default)s)")
    add("--jobs", type=int, default=2000, help="submissions per run (%(default)s)")
    add("--clients", type=int, default=16, help="concurrent clients (%(default)s)")
    add("--repeat", type=int, default=3, help="runs of each submit row, rotated (%(default)s)")
    add("--no-slurm", action="store_true", help="leave SLURM out")
    add("--fsync-jobs", type=int, default=200, help="submissions traced by `fsync` (%(default)s)")
    add("--pending", type=int, default=10_000, help="pending jobs of `cycle` (%(default)s)")
    add("--steps", type=int, default=50, help="timed steps of `cycle`, each kind (%(default)s)")
    add("--rounds", type=int, default=10, help="preemptions of `handoff` (%(default)s)")
    add("--save-seconds", type=float, default=1.0, help="the victim's save (%(default)s)")
    add("--json", type=Path, help="also write every result here")
    args = parser.parse_args()
    args.parts = set(args.parts.split(","))
    unknown = args.parts - {"submit", "fsync", "cycle", "handoff"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    return args


def main() -> None:
    args = parse_args()
    root = Path(tempfile.mkdtemp(prefix="pbench-queue-"))
    results: dict[str, object] = {"loadavg_before": os.getloadavg()}
    skipped = "--no-slurm" if args.no_slurm else slurm_cluster.missing()
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; SLURM: {skipped or 'yes'}"
    )
    try:
        if "submit" in args.parts:
            rows = [row_summary(runs) for runs in submit_part(root, args, not skipped)]
            print_submit(rows, args.jobs, skipped)
            results["submit"] = rows
        if "fsync" in args.parts and shutil.which("strace") is None:
            print("\nfsync: skipped: strace is not installed")
        elif "fsync" in args.parts:
            print(f"\nfsync calls: {args.fsync_jobs} submissions one at a time, under strace")
            results["fsync"] = fsync_part(root, args.fsync_jobs, not skipped)
            print_fsync(results["fsync"])  # type: ignore[arg-type]
        if "cycle" in args.parts:
            print(f"\nscheduling loop: {args.pending} pending, examples/queue.toml", flush=True)
            results["cycle"] = cycle_part(root, args.pending, args.steps)
            print_cycle(results["cycle"])  # type: ignore[arg-type]
        if "handoff" in args.parts:
            print(f"\nhand-on: {args.rounds} preemptions, the victim saves {args.save_seconds} s")
            results["handoff"] = handoff_part(root, args.rounds, args.save_seconds)
            print_handoff(results["handoff"])  # type: ignore[arg-type]
    finally:
        if not skipped and args.parts & {"submit", "fsync"}:
            slurm_cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    results["loadavg_after"] = os.getloadavg()
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
