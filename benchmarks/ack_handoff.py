"""What the ack buys: preemptor start minus notice, with and without it, against the grace.

A real queue manager on 4 virtual GPUs. A borrower trains under `@preemptible` on all four; a
job of the lending queue arrives and needs two, so the borrower gets a notice (the endpoint and
SIGTERM), saves at its next step boundary and exits. Its exit then takes `--teardown` seconds
(what a stuck DataLoader worker, a slow NCCL teardown or a flushing logger cost). Timed: the
preemptor's start minus the notice, in two modes side by side:

- `signals`: the job only hears SIGTERM (no `PREEMPTIBLE_QUEUE_URL`): the manager waits for the
  process to be gone, or for the end of the grace;
- `ack`: the job talks to the manager (the SDK's default under it): after its save has
  committed it posts `checkpointed`, and the manager gives it 5 s more, then hands on.

    python benchmarks/ack_handoff.py --grace 30 --teardown 0,60 --trials 3
"""

from __future__ import annotations

import argparse
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
import atexit, os, sys, time, torch
from preemptible import Context, preemptible
root, teardown, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
if mode == "signals":
    del os.environ["PREEMPTIBLE_QUEUE_URL"]  # no link to the manager: SIGTERM only
atexit.register(time.sleep, teardown)  # a teardown that takes its time

@preemptible(root, every_steps=20, async_save=False)
def train(ctx: Context) -> None:
    model = torch.nn.Linear(256, 256)
    ctx.register(model=model)
    print("ready", flush=True)
    for _ in ctx.steps(10**9):
        time.sleep(0.05)

train()
"""
ADMIN = "bench-admin-token"


def config(grace_s: float) -> str:
    return f"""
[cluster]
gpus = 4
[preemption]
grace_min = "{grace_s}s"
grace_max = "{grace_s}s"
reclaim_within = "{grace_s}s"
min_runtime = "0s"
cooldown = "0s"
[service]
admin_token = "env:BENCH_ADMIN"
[[queues]]
name = "lender"
nominal = {{ gpus = 2 }}
token = "env:BENCH_LENDER"
[[queues]]
name = "borrower"
nominal = {{ gpus = 2 }}
borrowing_limit = {{ gpus = 2 }}
token = "env:BENCH_BORROWER"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_trial(grace_s: float, teardown_s: float, mode: str) -> dict[str, float]:
    """One preemption; the seconds from the notice to the preemptor's start, and more."""
    tmp = Path(tempfile.mkdtemp(prefix="pbench-ack-"))
    port = free_port()
    (tmp / "queue.toml").write_text(config(grace_s))
    where = ["--config", str(tmp / "queue.toml"), "--state", str(tmp / "state")]
    where.append("--allow-jobs-as-root")  # no-op unless root: then the jobs are ours
    server = subprocess.Popen(
        [sys.executable, "-m", "preemptible", "queue", "serve", *where, "--port", str(port)],
        env={**os.environ, "BENCH_ADMIN": ADMIN, "BENCH_LENDER": "l", "BENCH_BORROWER": "b"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    try:
        _wait(lambda: _healthy(client), 30, "the server to answer")
        command = [sys.executable, "-c", JOB, str(tmp / "ckpt"), str(teardown_s), mode]
        body = {"queue": "borrower", "gpus": 4, "tier": "low", "command": command}
        victim = client.post("/v1/jobs", json=body).json()["id"]
        _wait(lambda: "ready" in _logs(client, victim), 60, "the victim to start")
        time.sleep(1.0)  # a few steps, a first save
        preemptor = client.post(
            "/v1/jobs",
            json={"queue": "lender", "gpus": 2, "tier": "high", "command": ["sleep", "1"]},
        ).json()["id"]
        started = _wait(lambda: _job(client, preemptor).get("started_at"), grace_s + 60, "start")
        notice = next(e for e in _events(client, victim) if e["kind"] == "notice")
        acked = [e for e in _events(client, victim) if e["kind"] == "checkpointed"]
        return {
            "handoff_s": started - notice["at"],
            "ack_s": acked[0]["at"] - notice["at"] if acked else float("nan"),
        }
    finally:
        client.close()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        subprocess.run(["pkill", "-KILL", "-f", str(tmp)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def _healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def _job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    return dict(client.get(f"/v1/jobs/{job_id}").json())


def _logs(client: httpx.Client, job_id: str) -> str:
    return str(client.get(f"/v1/jobs/{job_id}/logs").json()["text"])


def _events(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return list(client.get("/v1/events", params={"job_id": job_id}).json())


def _wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")  # the server's output: run it by hand


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grace", type=float, default=30.0, help="grace, seconds")
    parser.add_argument(
        "--teardown", default="0,60", help="seconds the victim's exit takes after its save"
    )
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    teardowns = [float(t) for t in args.teardown.split(",")]
    print(f"grace {args.grace:g} s; the preemptor's start minus the notice, median of trials")
    print(f"{'teardown':>9} {'signals':>9} {'ack':>9} {'ratio':>7}  notice to ack")
    for teardown in teardowns:
        medians = {}
        ack_s = []
        for mode in ("signals", "ack"):
            runs = []
            for trial in range(args.trials):
                row = one_trial(args.grace, teardown, mode)
                runs.append(row["handoff_s"])
                if mode == "ack":
                    ack_s.append(row["ack_s"])
                print(
                    f"  {mode} teardown {teardown:g} s trial {trial}: {row['handoff_s']:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
            medians[mode] = statistics.median(runs)
        ratio = medians["signals"] / medians["ack"]
        print(
            f"{teardown:>8g}s {medians['signals']:>8.2f}s {medians['ack']:>8.2f}s {ratio:>6.1f}x"
            f"  {statistics.median(ack_s):.2f} s"
        )


if __name__ == "__main__":
    main()
