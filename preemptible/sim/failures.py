"""Crashes and hangs in the simulator: when they strike, and what the queue manager does next.

The live queue manager restarts a job that crashed or hung from its last checkpoint, after a
back-off, at most `max_restarts` times, and fails a crash loop at once (`RestartSettings`;
docs/user-guide/queue-manager.md, "Crashes and hangs"). The simulator draws failures itself and
applies the same rules to them (`FailureModel.verdict`).

Failures strike per GPU-hour of running, as broken hardware does: a job on 8 GPUs fails eight
times as often as one on a single GPU. Each job carries two countdowns (crash, hang) of
GPU-seconds of running left to its next failure. Each countdown is an exponential draw from a
hash of the seed, the job and how many failures of that kind the job has had, so a job fails
after the same GPU-hours of running under every policy and in any order of events: policies
are compared on the same bad luck. One shared `random.Random` would not do that: as soon as
two policies start jobs in another order, every later job gets another draw.

A hang holds its GPUs doing nothing until the manager notices it (`hang_bound_s`: the
configuration's `hang_after`, else `hang_min`, since a trace has no step times and the learned
bound of steps shorter than `hang_min / hang_factor` is `hang_min`), then it is sent a notice
it cannot act on and is killed at the end of its grace.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from preemptible.errors import ConfigError
from preemptible.queue.core import RestartSettings

GPU_S_PER_RATE_UNIT = 1000 * 3600.0
"""A rate is failures per 1,000 GPU-hours of running: its mean countdown in GPU-seconds is
this over the rate."""


class FailureKind(StrEnum):
    """What went wrong with a run."""

    CRASH = "crash"
    """The job exited on its own: its GPUs are free at once."""
    HANG = "hang"
    """The job's step stood still: it holds its GPUs until the hang bound and its grace."""


class GaveUp(StrEnum):
    """Why a failed job was not restarted (as the live manager words the outcome)."""

    NO_RESTART_LEFT = "no_restart_left"
    """It had used its `max_restarts`."""
    CRASH_LOOP = "crash_loop"
    """`crash_loop_after` failures in a row left no newer checkpoint."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FailureRates:
    """How often jobs crash and hang in a simulation (both 0: never, the default)."""

    crashes_per_1000_gpu_h: float = 0.0
    """Crashes per 1,000 GPU-hours of running."""
    hangs_per_1000_gpu_h: float = 0.0
    """Hangs per 1,000 GPU-hours of running."""
    seed: int = 0
    """Seed of the draws: the same seed gives the same failures."""

    def __post_init__(self) -> None:
        for name, flag in (("crashes", "--crash-rate"), ("hangs", "--hang-rate")):
            value = getattr(self, f"{name}_per_1000_gpu_h")
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(
                    f"{flag} must be a number of {name} per 1,000 GPU-hours of running, "
                    f"0 or more (0: none), not {value}"
                )

    @property
    def on(self) -> bool:
        """Whether any failure is modelled."""
        return self.crashes_per_1000_gpu_h > 0 or self.hangs_per_1000_gpu_h > 0


class Verdict(NamedTuple):
    """What follows a failure: a restart after `backoff_s`, or `gave_up` and why."""

    gave_up: GaveUp | None
    backoff_s: float


@dataclass(slots=True)
class JobFailures:
    """One job's crashes and hangs so far, and the countdowns to its next ones."""

    job_id: str
    crash_left_gpu_s: float
    """GPU-seconds of running before the next crash."""
    hang_left_gpu_s: float
    """GPU-seconds of running before the next hang."""
    crashes: int = 0
    hangs: int = 0
    restarts: int = 0
    stalled: int = 0
    """Failures in a row that left no newer checkpoint than their run's first: the back-off
    doubles with each, and at `crash_loop_after` the job is failed as a crash loop."""
    lost_gpu_s: float = 0.0
    log: list[tuple[float, float, FailureKind]] = field(default_factory=list)
    """(time, GPU-seconds, kind) of every failure's loss, charged when the job leaves."""
    gave_up: GaveUp | None = None
    attempt_saved_s: float = 0.0
    """Progress checkpointed when the current run started (a newer one is progress)."""
    hung_at: float | None = None
    """When the current run's step stood still (None: it is not hung)."""
    since: float = 0.0
    """From when the current run spends its countdowns."""
    gpus: int = 0
    """At how many GPUs it spends them (0: disarmed, nothing spent)."""
    due: FailureKind = FailureKind.CRASH
    """Which failure is armed to strike first."""
    token: int = 0
    """Changes whenever the armed failure does: an event with another token is stale."""


class FailureModel:
    """The draws and the restart rules of one simulation."""

    def __init__(self, rates: FailureRates, restarts: RestartSettings):
        self.rates = rates
        self.restarts = restarts

    @property
    def hang_bound_s(self) -> float:
        """How long a hung job holds its GPUs before the manager notices (see the module)."""
        if self.restarts.hang_after_s is not None:
            return self.restarts.hang_after_s
        return self.restarts.hang_min_s

    def new_job(self, job_id: str) -> JobFailures:
        """A job's record, with the countdowns to its first crash and first hang."""
        return JobFailures(
            job_id=job_id,
            crash_left_gpu_s=self._countdown(job_id, FailureKind.CRASH, 0),
            hang_left_gpu_s=self._countdown(job_id, FailureKind.HANG, 0),
        )

    def arm(self, job: JobFailures, since: float, gpus: int) -> float | None:
        """The run spends its countdowns from `since` on `gpus` GPUs: when its next failure
        strikes (None: never; `job.due` says which kind, `job.token` marks the event)."""
        job.token += 1
        job.since, job.gpus = since, gpus
        left = min(job.crash_left_gpu_s, job.hang_left_gpu_s)
        if gpus <= 0 or math.isinf(left):
            job.gpus = 0
            return None
        job.due = FailureKind.CRASH if left == job.crash_left_gpu_s else FailureKind.HANG
        return since + left / gpus

    def disarm(self, job: JobFailures, now: float) -> None:
        """The run stops spending its countdowns at `now` (it leaves, or resizes)."""
        spent = job.gpus * max(0.0, now - job.since)
        job.crash_left_gpu_s = max(0.0, job.crash_left_gpu_s - spent)
        job.hang_left_gpu_s = max(0.0, job.hang_left_gpu_s - spent)
        job.gpus = 0
        job.token += 1

    def strike(self, job: JobFailures, now: float) -> FailureKind:
        """The armed failure happens at `now`: count it and draw the next of its kind."""
        kind = job.due
        self.disarm(job, now)
        if kind is FailureKind.CRASH:
            job.crashes += 1
            job.crash_left_gpu_s = self._countdown(job.job_id, kind, job.crashes)
        else:
            job.hangs += 1
            job.hang_left_gpu_s = self._countdown(job.job_id, kind, job.hangs)
            job.hung_at = now
        return kind

    def verdict(self, job: JobFailures, limit: int, *, progressed: bool) -> Verdict:
        """Restart or not, as the live manager decides: `limit` restarts in all, a crash loop
        failed at once, a back-off that doubles with each failure in a row without progress.
        A failure at the same step as the one before, the manager's other sign of a crash
        loop, does not arise from independent random failures and is not modelled."""
        job.stalled = 0 if progressed else job.stalled + 1
        if limit == 0:
            return Verdict(GaveUp.NO_RESTART_LEFT, 0.0)
        if job.stalled >= self.restarts.crash_loop_after:
            return Verdict(GaveUp.CRASH_LOOP, 0.0)
        if job.restarts >= limit:
            return Verdict(GaveUp.NO_RESTART_LEFT, 0.0)
        job.restarts += 1
        return Verdict(None, self.restarts.backoff(max(1, job.stalled)))

    def _countdown(self, job_id: str, kind: FailureKind, n: int) -> float:
        """GPU-seconds of running from the job's n-th failure of `kind` to its next one."""
        per_1000_gpu_h = (
            self.rates.crashes_per_1000_gpu_h
            if kind is FailureKind.CRASH
            else self.rates.hangs_per_1000_gpu_h
        )
        if per_1000_gpu_h <= 0:
            return math.inf
        key = f"{self.rates.seed}\0{job_id}\0{kind.value}\0{n}".encode()
        bits = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        uniform = (bits + 0.5) / 2.0**64  # in (0, 1): never log(0)
        return -math.log(uniform) * GPU_S_PER_RATE_UNIT / per_1000_gpu_h
