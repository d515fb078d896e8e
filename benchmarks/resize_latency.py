"""How long a resize takes on the real service, against the bound step + save + start + restore.

A real queue manager on 4 virtual GPUs. An elastic job (4 GPUs, at least 2) trains under
torchrun (gloo, CPU) with `@preemptible`, one rank per GPU (`--nproc-per-node {gpus}`). A
high-tier job of another queue arrives and needs 2 GPUs: the core shrinks the elastic job
instead of evicting it; once the high-tier job has ended, it grows back to 4. Timed for each
resize, from the manager's audit log and the job's own clock (rank 0 writes a timeline):

- step_and_save: the notice to the ack (the SDK acks once the step in flight and its save are
  done);
- exit: the ack to the relaunch (the old processes exit, the manager sees it and launches the
  command again at the new size);
- start: the relaunch to the new process group being up (Python, torch, torchrun's rendezvous);
- restore: the group up to the state restored;
- total: the notice to the job restored at its new size.

The bound is what a resize cannot avoid, measured on the same resize: step + save + process
start + restore. What the total has more is the exit and the manager's turn.

    python benchmarks/resize_latency.py --trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

JOB = """
import json, os, sys, time
started = time.time()
import torch, torch.distributed as dist
from preemptible import Context, init_process_group, preemptible
root, timeline, step_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = os.environ.get("PREEMPTIBLE_ATTEMPT", "0")

def note(event, **more):
    if rank == 0:
        with open(timeline, "a") as f:
            f.write(json.dumps({"event": event, "t": time.time(), "world": world,
                                "attempt": attempt, **more}) + "\\n")

note("process", t0=started)

@preemptible(root, every_steps=20, async_save=False)
def train(ctx: Context) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ctx.register(model=model, optimizer=opt)
    note("restored", step=ctx.step)
    for step in ctx.steps(10**9):
        began = time.time()
        loss = model(torch.randn(64, 512)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        time.sleep(step_s)
        note("step", step=step, took=time.time() - began)

train()
"""
ADMIN = "bench-admin-token"
CONFIG = """
[cluster]
gpus = 4
[policy]
resize_interval = "1s"
[preemption]
grace_min = "30s"
grace_max = "30s"
min_runtime = "0s"
cooldown = "0s"
[service]
admin_token = "env:BENCH_ADMIN"
[[queues]]
name = "research"
nominal = { gpus = 2 }
borrowing_limit = { gpus = 2 }
token = "env:BENCH_RESEARCH"
[[queues]]
name = "prod"
nominal = { gpus = 2 }
token = "env:BENCH_PROD"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_trial(step_s: float, high_s: float) -> list[dict[str, float]]:
    """One shrink and one grow; for each, the phases in seconds."""
    tmp = Path(tempfile.mkdtemp(prefix="pbench-resize-"))
    port = free_port()
    (tmp / "queue.toml").write_text(CONFIG)
    where = ["--config", str(tmp / "queue.toml"), "--state", str(tmp / "state")]
    where.append("--allow-jobs-as-root")  # no-op unless root: then the jobs are ours
    server = subprocess.Popen(
        [sys.executable, "-m", "preemptible", "queue", "serve", *where, "--port", str(port)],
        env={**os.environ, "BENCH_ADMIN": ADMIN, "BENCH_RESEARCH": "r", "BENCH_PROD": "p"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    timeline = tmp / "timeline.jsonl"
    try:
        _wait(lambda: _healthy(client), 30, "the server to answer")
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "{gpus}"]
        torchrun.append("--standalone")  # a rendezvous on a free port of its own
        job = [*torchrun, str(tmp / "job.py"), str(tmp / "ckpt"), str(timeline), str(step_s)]
        (tmp / "job.py").write_text(JOB)
        body = {"queue": "research", "gpus": 4, "min_gpus": 2, "command": job, "cwd": str(tmp)}
        body["estimate_s"] = 3600.0
        elastic = client.post("/v1/jobs", json=body).raise_for_status().json()["id"]
        _wait(lambda: len(_steps(timeline, world=4)) >= 5, 120, "the job to train on 4")
        # Its first save measured its cost, and the SDK reported it: a shrink is priced.
        _wait(lambda: _kinds(client, elastic) & {"negotiated"}, 120, "a cost report")
        high = {"queue": "prod", "gpus": 2, "tier": "high", "command": ["sleep", str(high_s)]}
        client.post("/v1/jobs", json=high).raise_for_status()
        _wait(lambda: len(_steps(timeline, world=2)) >= 3, 180, "the job to train on 2")
        _wait(lambda: len(_steps(timeline, world=4, attempt="3")) >= 1, 180 + high_s, "a grow")
        events = list(client.get("/v1/events", params={"job_id": elastic}).json())
        if os.environ.get("RESIZE_BENCH_DEBUG"):
            for e in events:
                print(e["kind"], e["at"], e["reason"][:150], e["data"], file=sys.stderr)
        client.delete(f"/v1/jobs/{elastic}")
        return [_phases(events, _read(timeline), resize) for resize in ("shrink", "grow")]
    finally:
        client.close()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        subprocess.run(["pkill", "-KILL", "-f", str(tmp)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def _phases(
    events: list[dict[str, Any]], lines: list[dict[str, Any]], kind: str
) -> dict[str, float]:
    """The phases of one resize, in seconds, and the bound they are held against."""
    notice = next(e for e in events if e["kind"] == "notice" and e["data"].get("resize") == kind)
    after = [e for e in events if e["at"] >= notice["at"]]
    ack = next(e for e in after if e["kind"] == "checkpointed")
    relaunch = next(e for e in after if e["kind"] == "resized")
    attempt = _attempt_after(lines, relaunch["at"])
    mine = [x for x in lines if x["attempt"] == attempt]
    process = next(x for x in mine if x["event"] == "process")
    restored = next(x for x in mine if x["event"] == "restored")
    step_and_save = ack["at"] - notice["at"]  # the step in flight, then the save
    start = process["t"] - relaunch["at"]  # Python, torch, torchrun's rendezvous, the group
    restore = restored["t"] - process["t"]
    return {
        "total": restored["t"] - notice["at"],
        "step_and_save": step_and_save,
        "exit": relaunch["at"] - ack["at"],
        "start": start,
        "restore": restore,
        "bound": step_and_save + start + restore,
    }


def _attempt_after(lines: list[dict[str, Any]], at: float) -> str:
    later = [x for x in lines if x["event"] == "process" and x["t0"] >= at]
    return str(later[0]["attempt"])


def _read(timeline: Path) -> list[dict[str, Any]]:
    if not timeline.exists():
        return []
    return [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]


def _steps(timeline: Path, *, world: int, attempt: str | None = None) -> list[dict[str, Any]]:
    return [
        x
        for x in _read(timeline)
        if x["event"] == "step" and x["world"] == world and attempt in (None, x["attempt"])
    ]


def _kinds(client: httpx.Client, job_id: str) -> set[str]:
    return {e["kind"] for e in client.get("/v1/events", params={"job_id": job_id}).json()}


def _healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def _wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--step", type=float, default=0.2, help="seconds a step sleeps")
    parser.add_argument("--high", type=float, default=20.0, help="the high-tier job's seconds")
    parser.add_argument("--json", type=Path, help="write every trial's phases here")
    args = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"shrink": [], "grow": []}
    for trial in range(args.trials):
        shrink, grow = one_trial(args.step, args.high)
        rows["shrink"].append(shrink)
        rows["grow"].append(grow)
        print(
            f"  trial {trial}: shrink {shrink['total']:.2f} s, grow {grow['total']:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print("median of trials, seconds; total: the notice to the job restored at its new size")
    keys = ("step_and_save", "exit", "start", "restore", "total", "bound")
    print(f"{'resize':<7}" + "".join(f"{k:>14}" for k in keys) + f"{'total/bound':>13}")
    for kind, trials in rows.items():
        med = {k: statistics.median(t[k] for t in trials) for k in trials[0]}
        cells = "".join(f"{med[k]:>14.2f}" for k in keys)
        print(f"{kind:<7}{cells}{med['total'] / med['bound']:>12.2f}x")
    print("bound = step + save + process start + restore; total - bound = the exit of the old")
    print("processes and the manager's turn (what a resize adds to what it cannot avoid)")


if __name__ == "__main__":
    main()
