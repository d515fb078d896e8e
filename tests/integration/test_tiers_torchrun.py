"""Two tiers under a real ``torchrun --nproc-per-node 2`` (gloo, CPU): every rank saves into
the shared local tier, rank 0 alone uploads, and every restart resumes both ranks at one step.

The remote is a plain directory: what is tested is who writes and uploads what, not the
transport (`test_tiers.py` runs two tiers against a real S3 endpoint).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

from preemptible import Checkpointer
from preemptible.checkpoint.manifest import step_dirname
from tests.integration.test_torchrun import Output, spawn, torchrun_command

REPO = Path(__file__).parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "tiers_torchrun_train.py"
NOTICE_EXIT = 143
STOPPED = re.compile(r"rank (\d) stopped at step (\d+) durable (\w+)\n")
RESUMED = re.compile(r"rank (\d) resumed from (\d+) weight ([\d.]+)\n")


def start(remote: Path, local: Path, *, total: int = 100_000) -> Output:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREEMPTIBLE_")}
    env.update(PREEMPTIBLE_GRACE_SECONDS="20", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = torchrun_command(str(SCRIPT), str(remote), str(local), "--total", str(total))
    return Output(spawn(command, env))


def resumed(out: str) -> dict[int, tuple[int, float]]:
    """Each rank's restored step and the weight it read (its rank + step + 1 if its own)."""
    return {int(r): (int(s), float(w)) for r, s, w in RESUMED.findall(out)}


def test_a_torchrun_job_saves_both_ranks_locally_uploads_once_and_resumes_from_either_tier(
    tmp_path: Path,
) -> None:
    remote, local = tmp_path / "remote", tmp_path / "local"
    # 1. Train past a few saves, then a SIGTERM: both ranks stop at one step, saved and uploaded.
    job = start(remote, local)
    job.until(r"rank 1 step 8\b")
    os.kill(job.proc.pid, signal.SIGTERM)
    code, out = job.finish()
    # torchrun dies of its own SIGTERM (a SignalException, 1) after both workers exited 143.
    assert code == 1 and out.count(f"; exiting with {NOTICE_EXIT}") == 2, out
    stops = sorted(STOPPED.findall(out))
    assert len(stops) == 2 and stops[0][1] == stops[1][1], out
    stop = int(stops[0][1])
    # Rank 0 uploads and knows what is durable; rank 1 does not track it.
    assert [(r, d) for r, _, d in stops] == [("0", str(stop)), ("1", "None")], out
    on_local = Checkpointer(local).latest()
    assert on_local is not None and on_local.step == stop and on_local.world_size == 2
    files = (local / step_dirname(stop)).iterdir()
    assert {f.name[:9] for f in files if f.name.startswith("rank")} == {"rank00000", "rank00001"}
    assert Checkpointer(remote).verify(stop).ok  # every rank's files, checked on the way
    # 2. The same node: the local tier serves the restart, even with the remote copy gone,
    # and rank 0 uploads it again.
    shutil.rmtree(remote / step_dirname(stop))
    code, out = finish(start(remote, local, total=stop + 3))
    assert code == 0 and "rank 0 done" in out and "rank 1 done" in out, out
    assert resumed(out) == {0: (stop, stop + 1.0), 1: (stop, stop + 2.0)}, out
    assert Checkpointer(remote).verify(stop).ok
    newest = Checkpointer(remote).latest()
    assert newest is not None and newest.step == stop + 2  # the end of the run is durable too
    # 3. Another node (an empty local tier): both ranks resume from the remote, each its own.
    code, out = finish(start(remote, tmp_path / "other", total=newest.step + 3))
    assert code == 0, out
    assert resumed(out) == {
        0: (newest.step, newest.step + 1.0),
        1: (newest.step, newest.step + 2.0),
    }


def finish(job: Output) -> tuple[int, str]:
    return job.finish(timeout=90)
