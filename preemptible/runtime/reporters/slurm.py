"""The SLURM job's comment: ``scontrol update JobId=$SLURM_JOB_ID Comment=...``.

The comment is the one free-text field a job may set on itself that ``squeue -o %k`` and
``sacct`` show, so an admin or a script sees the cost beside the job. It is compact
``key=value`` pairs; setting it replaces any earlier comment. At most one update per
``min_interval_s`` (each is an RPC to slurmctld).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from preemptible.checkpoint import CheckpointCost
from preemptible.runtime.reporters.sink import Deferred

SLURM_JOB_ID_ENV = "SLURM_JOB_ID"

SlurmCommand = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=False)


def comment(cost: CheckpointCost) -> str:
    """``preemptible save_p95_s=1.234 restore_s=0.500 bytes=123 step=10 at=1767225600``."""
    parts = [
        f"save_p95_s={cost.save.p95:.3f}",
        f"restore_s={cost.restore.last:.3f}",
        f"bytes={cost.bytes}",
    ]
    if cost.upload.count:  # two tiers: save_p95_s is the local commit, this the upload
        parts.append(f"upload_p95_s={cost.upload.p95:.3f}")
    if cost.last_checkpoint_step is not None:
        parts.append(f"step={cost.last_checkpoint_step}")
    if cost.last_checkpoint_time is not None:
        parts.append(f"at={int(cost.last_checkpoint_time)}")
    return "preemptible " + " ".join(parts)


class SlurmComment:
    """Sets the job's comment to the measured cost.

    Args:
        job_id: ``$SLURM_JOB_ID``.
        runner: runs an argv and returns the completed process (tests replace it).
        min_interval_s: at most one update per this many seconds.
        clock: a monotonic clock.
    """

    name = "slurm"

    def __init__(
        self,
        job_id: str,
        *,
        runner: SlurmCommand = _run,
        min_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.job_id, self.runner, self.min_interval_s = job_id, runner, min_interval_s
        self._clock = clock
        self._last_at: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlurmComment | None:
        job_id = env.get(SLURM_JOB_ID_ENV, "").strip()
        return cls(job_id) if job_id else None

    def argv(self, cost: CheckpointCost) -> list[str]:
        return ["scontrol", "update", f"JobId={self.job_id}", f"Comment={comment(cost)}"]

    def report(self, cost: CheckpointCost) -> None:
        if self._last_at is not None:
            wait = self.min_interval_s - (self._clock() - self._last_at)
            if wait > 0:
                raise Deferred(wait)
        done = self.runner(self.argv(cost))
        if done.returncode != 0:
            raise RuntimeError(
                f"scontrol exited {done.returncode}: {(done.stderr or '').strip()[:200]}"
            )
        self._last_at = self._clock()

    def close(self) -> None:
        pass
