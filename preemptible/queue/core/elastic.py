"""Elastic jobs: what a resize costs, which sizes a job may take, when a grow pays.

An elastic job (`Job.min_gpus`) saves at its next step and restarts at another size; the SDK
restores on any world size, so a resize keeps all its progress. What it costs is priced in
GPU-seconds, in the same unit as an eviction (`preemption.lost_gpu_seconds`):

    resize  = gpus_now x save + gpus_after x restore
    evict   = gpus_now x (save, or the work since its last checkpoint, + restore)

The save runs on every GPU it holds; the restart pays a restore on the GPUs it keeps. The
throughput of the GPUs a shrink gives up is not counted on either side: the job they are given
to uses them, and an eviction gives up all of them (and more, until the victim runs again).
A job that cannot save within its grace loses its work since its last checkpoint instead of
the save, as an eviction would.

The alternative of shrinking by priority alone (Kueue's elastic workloads, KAI's pods above a
job's minimum) is `ElasticMode.PRIORITY`; it ignores both prices.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from preemptible.queue.core.config import PolicySettings, PreemptionSettings
from preemptible.queue.core.model import GrowPrice, Job, RunningJob
from preemptible.queue.core.negotiation import counted_restore_s
from preemptible.queue.core.placement import Placement

INF = float("inf")


def resize_lost_gpu_s(
    running: RunningJob, gpus_after: int, now: float, grace_s: float, settings: PreemptionSettings
) -> float:
    """GPU-seconds a resize of `running` to `gpus_after` now would waste (module docstring)."""
    job = running.job
    restore = counted_restore_s(job.restore_s, settings)
    if job.checkpoint_on_notice and job.save_s <= grace_s:
        unsaved = job.save_s
    else:
        unsaved = max(0.0, now - running.checkpoint_time(now))
    return running.size * unsaved + gpus_after * restore


def resize_interval_s(job: Job, settings: PolicySettings) -> float:
    """The least time between two resizes of `job`: `resize_interval`, or more for a job whose
    resize takes long (a multiple of its save plus restore), so that no job spends more than a
    tenth of its time (with the default multiple) saving and restoring for resizes."""
    return max(
        settings.resize_interval_s,
        settings.resize_interval_multiple * (job.save_s + job.restore_s),
    )


def may_resize(job: Job, now: float, settings: PolicySettings) -> bool:
    """Whether `job` was not resized within its minimum interval."""
    last = job.last_resized_at
    return last is None or now - last >= resize_interval_s(job, settings)


def smaller_sizes(running: RunningJob) -> tuple[int, ...]:
    """Sizes below the current one that `running` may shrink to, largest first."""
    return tuple(g for g in running.job.sizes() if g < running.size)


def larger_sizes(running: RunningJob) -> tuple[int, ...]:
    """Sizes above the current one that `running` may grow to, largest first."""
    return tuple(g for g in running.job.sizes() if g > running.size)


def released(running: RunningJob, gpus_after: int) -> Placement:
    """The (node, GPUs) a shrink to `gpus_after` gives up: from its last nodes first, so that a
    multi-node job keeps its whole nodes and gives up its partial one."""
    give = running.size - gpus_after
    out: list[tuple[int, int]] = []
    for node, gpus in reversed(running.placement):
        if give <= 0:
            break
        take = min(gpus, give)
        out.append((node, take))
        give -= take
    return tuple(sorted(out))


def kept(running: RunningJob, gpus_after: int) -> Placement:
    """The (node, GPUs) it keeps after a shrink to `gpus_after` (`released`'s complement)."""
    gone = dict(released(running, gpus_after))
    return tuple((n, g - gone.get(n, 0)) for n, g in running.placement if g - gone.get(n, 0) > 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class ShrinkOption:
    """Shrinking one running job to `gpus_after`, with what it costs at each allowed size."""

    gpus_after: int
    sizes: tuple[int, ...]
    """Sizes it may shrink to, smallest first (the search may take fewer GPUs than planned)."""
    unsaved_gpu_s: float
    """The part of the price that does not depend on the size after: the save (or the unsaved
    work) on every GPU it holds now."""
    restore_s: float
    """The restore each GPU it keeps pays."""

    @property
    def lost_gpu_s(self) -> float:
        """GPU-seconds this shrink wastes (`resize_lost_gpu_s`)."""
        return self.unsaved_gpu_s + self.gpus_after * self.restore_s

    def larger(self) -> ShrinkOption | None:
        """The same shrink, one size larger (it gives up fewer GPUs), or None at the largest."""
        bigger = [g for g in self.sizes if g > self.gpus_after]
        if not bigger:
            return None
        return ShrinkOption(
            gpus_after=bigger[0],
            sizes=self.sizes,
            unsaved_gpu_s=self.unsaved_gpu_s,
            restore_s=self.restore_s,
        )


def shrink_option(
    running: RunningJob, now: float, grace_s: float, settings: PreemptionSettings
) -> ShrinkOption | None:
    """Shrinking `running` as far as it may go, or None when it is at its minimum."""
    sizes = tuple(sorted(smaller_sizes(running)))
    if not sizes:
        return None
    restore = counted_restore_s(running.job.restore_s, settings)
    unsaved = resize_lost_gpu_s(running, 0, now, grace_s, settings)
    return ShrinkOption(gpus_after=sizes[0], sizes=sizes, unsaved_gpu_s=unsaved, restore_s=restore)


def remaining_run_s(running: RunningJob, now: float, default_estimate_s: float) -> float:
    """How much longer `running` is expected to run: its estimate (or the default) minus the
    time since its admission. A job that has outrun its estimate has no estimate left: it is
    assumed to have the default estimate to go, as a job that never gave one."""
    job = running.job
    estimate = job.estimate_s if job.estimate_s is not None else default_estimate_s
    left = estimate - (now - running.started_at)
    return left if left > 0 else default_estimate_s


def next_resize_at(job: Job, settings: PolicySettings) -> float:
    """When `job` may be resized again (`may_resize`)."""
    if job.last_resized_at is None:
        return float("-inf")
    return job.last_resized_at + resize_interval_s(job, settings)


def resize_restore_s(job: Job, settings: PreemptionSettings) -> float:
    """The restore a resize's restart pays: the job's measured restore or, when it has none yet
    (it never restored), its save: the restart reads back what the resize's save just wrote."""
    return counted_restore_s(job.restore_s if job.restore_s > 0 else job.save_s, settings)


def idle_horizon_s(
    free_gpus: float,
    extra_gpus: float,
    *,
    needs: Iterable[float],
    ends: Iterable[tuple[float, float]],
    arrivals_gpus_per_s: float,
    now: float,
) -> float:
    """How long `extra_gpus` of the `free_gpus` are expected to stay unwanted by other work:
    seconds until the first of

    - a pending job needing `needs` GPUs could start by count, as the running jobs free their
      GPUs at their expected ends (`ends`: (time, GPUs) in time order; a job past its end is
      taken to end now, as backfill does);
    - new jobs, asking `arrivals_gpus_per_s` GPUs a second, have asked for more than the GPUs
      free then without the grow's.

    inf when neither happens."""
    least = min(needs, default=INF)
    supply, start = free_gpus, 0.0
    for at, gpus in (*ends, (INF, 0.0)):
        end = max(0.0, at - now)
        if end > start:  # supply stays the same over [start, end)
            if supply >= least:
                return start
            if arrivals_gpus_per_s > 0:
                wanted = (supply - extra_gpus) / arrivals_gpus_per_s
                if wanted < end:
                    return max(start, wanted)
            start = end
        supply += gpus
    return INF


def grow_price(
    running: RunningJob,
    gpus_after: int,
    *,
    now: float,
    grace_s: float,
    idle_s: float,
    reclaimable: bool,
    policy: PolicySettings,
    settings: PreemptionSettings,
) -> GrowPrice:
    """Price growing `running` to `gpus_after` (docs/internals/grow-when-it-pays.md):

        gained = (after - now) x min(remaining run, idle horizon)
        cost   = grow + [idle horizon < remaining run, or reclaimable] x shrink back
        pays when gained >= grow_payback x cost

    `idle_s`: how long the added GPUs would otherwise stay unwanted (`idle_horizon_s`);
    `reclaimable`: the grow would borrow GPUs another queue's nominal quota may reclaim.
    """
    job = running.job
    remaining = remaining_run_s(running, now, policy.default_estimate_s)
    gained = (gpus_after - running.size) * min(remaining, idle_s)
    restore = resize_restore_s(job, settings)
    if job.checkpoint_on_notice and job.save_s <= grace_s:
        unsaved = job.save_s
    else:
        unsaved = max(0.0, now - running.checkpoint_time(now))
    grow = running.size * unsaved + gpus_after * restore
    back = 0.0
    if idle_s < remaining or reclaimable:
        back = gpus_after * unsaved + running.size * restore
    return GrowPrice(
        gained_gpu_s=gained,
        resize_gpu_s=grow,
        back_gpu_s=back,
        idle_s=idle_s,
        payback=policy.grow_payback,
    )
