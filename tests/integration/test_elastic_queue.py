"""An elastic torchrun job under the real queue manager: shrunk instead of preempted, grown back.

A real `preemptible queue serve` on 4 virtual GPUs. `scripts/elastic_train.py` (a float64 MLP
under DDP, gloo on CPU, a constant global batch) is submitted with a range of 2..4 GPUs as
`torchrun --nproc-per-node {gpus} ...` and starts on 4. A high-tier job of the other queue
needs 2: the core shrinks the elastic job to 2 instead of evicting it; the SDK saves at its
next step, acks, and the manager starts it again at once on 2. Once the high-tier job is gone
(cancelled, after the elastic job has trained on 2), the elastic job grows back to 4 and runs
to its end. Then:

- it was never preempted nor requeued: two resizes, three attempts, sizes 4, 2, 4;
- every sample was trained on exactly once per epoch across the three sizes;
- its final parameters equal, bit for bit, a replay by torchrun alone that stops at the same
  steps and resumes at the same sizes, and are within `RTOL` of an uninterrupted 4-rank run
  (the reduction order differs with the world size: `test_elastic_resize.py`).
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch

from tests.helpers import assert_same
from tests.integration.test_elastic_resize import RTOL, SCRIPT, trained
from tests.integration.test_torchrun import TORCHRUN, Output
from tests.polling import wait_until

from .queue_server import Server, submit, wait_for

SAMPLES, GLOBAL_BATCH, EPOCHS = 48, 8, 4
STEPS = EPOCHS * SAMPLES // GLOBAL_BATCH
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
admin_token = "env:E_ADMIN"
[[queues]]
name = "research"
nominal = { gpus = 2 }
borrowing_limit = { gpus = 2 }
token = "env:E_RESEARCH"
[[queues]]
name = "prod"
nominal = { gpus = 2 }
token = "env:E_PROD"
"""
TOKENS = {"E_ADMIN": "admin-secret", "E_RESEARCH": "research-secret", "E_PROD": "prod-secret"}


def torchrun(root: Path, nproc: str, *args: str, epochs: int = EPOCHS) -> list[str]:
    """`elastic_train.py` under torchrun on one node, its checkpoints and output under `root`."""
    return [
        TORCHRUN,
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--standalone",
        str(SCRIPT),
        str(root / "ckpt"),
        str(root / "out"),
        "--epochs",
        str(epochs),
        *args,
    ]


def run(command: list[str]) -> tuple[int, str]:
    import subprocess

    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return Output(proc).finish(timeout=180)


def log(admin: httpx.Client, job_id: str, attempt: int | None = None) -> str:
    """The output of an attempt (the current one by default)."""
    params = {"limit": 1 << 20} if attempt is None else {"attempt": attempt, "limit": 1 << 20}
    return str(admin.get(f"/v1/jobs/{job_id}/logs", params=params).json()["text"])


def events(admin: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return list(admin.get("/v1/events", params={"job_id": job_id}).json())


def resized(admin: httpx.Client, job_id: str, kind: str) -> dict[str, Any] | None:
    return next(
        (
            e
            for e in events(admin, job_id)
            if e["kind"] == "resized" and e["data"]["resize"] == kind
        ),
        None,
    )


def test_an_elastic_job_is_shrunk_for_a_higher_tier_and_grows_back(tmp_path: Path) -> None:
    started = time.monotonic()
    queued, replay, whole = tmp_path / "queued", tmp_path / "replay", tmp_path / "whole"
    (tmp_path / "server").mkdir()
    server = Server(tmp_path / "server", CONFIG, TOKENS)
    server.start()
    pool = ThreadPoolExecutor(1)
    uninterrupted = pool.submit(run, torchrun(whole, "4"))  # meanwhile, the reference
    try:
        with server.client("admin-secret") as admin:
            job = submit(
                admin,
                "research",
                torchrun(queued, "{gpus}", "--step-s", "0.4", "--every-steps", "2"),
                gpus=4,
                min_gpus=2,
                gpus_multiple=2,
                estimate_s=3600,
                cwd=str(tmp_path),
            )["id"]

            def said(pattern: str) -> bool:
                return re.search(pattern, log(admin, job), re.M) is not None

            def describe() -> str:
                return log(admin, job)[-3000:] + "\n" + server.log()[-2000:]

            wait_until(
                lambda: said(r"^world 4 step 1 "), "steps on 4", timeout=120, describe=describe
            )
            # It saved and reported what a save costs: a notice is priced, and answered at once.
            wait_until(
                lambda: "negotiated" in {e["kind"] for e in events(admin, job)},
                "its cost report",
                timeout=60,
                describe=describe,
            )
            high = submit(admin, "prod", ["sleep", "600"], gpus=2, tier="high")["id"]
            wait_until(
                lambda: resized(admin, job, "shrink"), "the shrink", timeout=120, describe=describe
            )
            wait_for(admin, high, {"running"}, timeout=60)
            wait_until(
                lambda: said(r"^world 2 step \d+ "), "a step on 2", timeout=120, describe=describe
            )
            admin.delete(f"/v1/jobs/{high}")  # gone: its GPUs are free for a grow
            wait_until(
                lambda: resized(admin, job, "grow"), "the grow", timeout=120, describe=describe
            )
            done = wait_for(admin, job, {"completed", "failed"}, timeout=240)
            assert done["state"] == "completed", describe()
            story = events(admin, job)
            output = "".join(log(admin, job, k) for k in range(1, done["attempts"] + 1))
    finally:
        server.stop()
        pool.shutdown(wait=False)

    # Never preempted: two resizes, three attempts at 4, 2 and 4.
    kinds = [e["kind"] for e in story]
    assert "requeued" not in kinds and kinds.count("resized") == 2, kinds
    assert done["attempts"] == 3 and done["resizes"] == 2
    firsts = [int(s) for s in re.findall(r"^world \d: starting at step (\d+)$", output, re.M)]
    worlds = [int(w) for w in re.findall(r"^world (\d): starting at step", output, re.M)]
    assert worlds == [4, 2, 4] and firsts[0] == 0, output
    stops = [first - 1 for first in firsts[1:]]

    # The replay: torchrun alone, stopped at the same steps by the notice path.
    for nproc, stop in zip(worlds, [*stops, None], strict=True):
        more = [] if stop is None else ["--stop-at-step", str(stop)]
        code, out = run(torchrun(replay, str(nproc), *more))
        assert code == (0 if stop is None else 1), out
    code, out = uninterrupted.result()
    assert code == 0, out

    got = trained(queued)
    assert sorted(got) == list(range(EPOCHS))
    for epoch, rows in got.items():
        assert Counter(s for _, _, s in rows) == Counter(range(SAMPLES)), f"epoch {epoch}"
    final = torch.load(queued / "out" / "final.pt", weights_only=True)
    assert_same(final, torch.load(replay / "out" / "final.pt", weights_only=True))
    reference = torch.load(whole / "out" / "final.pt", weights_only=True)
    for k in final:
        torch.testing.assert_close(final[k], reference[k], rtol=RTOL, atol=0, msg=k)
    print(f"stops at {stops}; took {time.monotonic() - started:.1f} s", file=sys.stderr)
