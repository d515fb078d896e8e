"""The order in which one cycle looks at pending jobs.

Criteria of our policy (`Ordering.FAIR`), in order:

1. tier, higher first; a borrower is ordered after other queues' pending work within their
   nominal quota of its own tier, and in the lowest tier of such work when that is lower than
   its own (`Policy.nominal_first`): that work would reclaim whatever the borrower got. A
   queue's own work never demotes its borrowers (within a queue, age decides);
2. fair-share value of the job's queue (1.0 = exactly its weighted share) minus waiting time /
   `aging` (one `aging` of waiting is worth one fair-share unit), capped at `aging_max_units`:
   once every queue's head has waited that long, fair share alone decides, so saturated queues
   still converge to their weights. A job that has waited past the cap while its queue is below
   its fair share (value < 1), or past the `starvation_limit` whatever its queue's share, is
   starving: it goes first in its tier, oldest first, and so gets the backfill reservation;
3. submission time, then job id (stable tie-break).

The baselines order by submission (fifo), tier (priority), within-nominal first then tier
(kueue), or SLURM's multifactor priority (slurm).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from preemptible.queue.core.config import QueueConfig
from preemptible.queue.core.fair_share import dominant_share, fair_share_value, weight_fractions
from preemptible.queue.core.model import Job, Tier
from preemptible.queue.core.policy import Ordering, Policy
from preemptible.queue.core.quota import QuotaVerdict, check_quota
from preemptible.queue.core.resources import Amounts
from preemptible.queue.core.state import ClusterState, GroupKey

SLURM_AGE_MAX_S = 7 * 86400.0
"""SLURM's PriorityMaxAge default: the age factor is full after a week."""
_STARVING = -1e15
"""Fair-share key of a starving job, before its submission time: below any real value."""
NO_RECLAIMER = max(t.rank for t in Tier) + 1
"""`PendingOrder.reclaimer_rank` of a queue when no other queue has pending work within nominal
quota."""


class HeapEntry(NamedTuple):
    """A pending group's head in the walk's heap: the lowest entry is looked at first."""

    key: tuple[float, ...]
    submitted_at: float
    job_id: str
    group: GroupKey
    version: int
    """Its queue's version when the key was computed: stale once the queue's allocation changed."""


class PendingOrder:
    """Sort keys of pending jobs as this cycle's admissions change the queues' allocations.

    A queue's fair share changes only when a job of that queue starts, so each admission bumps
    its queue's `version`: heap entries of that queue computed before are stale and recomputed
    when they come up.
    """

    def __init__(
        self,
        *,
        state: ClusterState,
        usage: Mapping[str, float],
        alloc: Mapping[str, Amounts],
        policy: Policy,
        config: QueueConfig,
        now: float,
    ):
        self.st = state
        self.usage = usage
        self.alloc = alloc
        """The cycle's own per-queue allocation (its ledger's), read when keys are computed."""
        self.policy = policy
        self.settings = config.policy
        self.now = now
        self.weights = weight_fractions(state.queues.values())
        self.version = dict.fromkeys(state.queues, 0)
        self._share_now: dict[str, float] = {}
        units = ((1, 0, 0), (0, 1, 0), (0, 0, 1))
        cl = state.cluster
        self.step_share = next((x for u in units if (x := dominant_share(*u, cl))), 0.0)
        """Dominant share of one GPU (else one CPU, else 1 GB): the "after" step."""
        self.reclaimer_rank = self._reclaimer_ranks()
        """Per queue, the lowest tier of other queues' pending work within nominal quota: a
        borrower of this tier or a higher one is ordered in this tier after that work, which
        would reclaim whatever it is given."""

    def entry(self, job: Job, group: GroupKey) -> HeapEntry:
        """`job`'s heap entry, as the head of `group`."""
        return HeapEntry(self.key(job), job.submitted_at, job.id, group, self.version[job.queue])

    def is_stale(self, entry: HeapEntry) -> bool:
        """Whether `entry`'s queue changed since its key was computed."""
        return entry.version != self.version[entry.group[0]]

    def changed(self, queue: str) -> None:
        """`queue`'s allocation changed (a job of it started): its keys are stale."""
        self.version[queue] += 1
        self._share_now.pop(queue, None)

    def has_reclaimer(self, queue: str) -> bool:
        """Whether other queues have pending work within nominal quota (which would reclaim
        what `queue` borrows)."""
        return self.reclaimer_rank[queue] < NO_RECLAIMER

    def key(self, job: Job) -> tuple[float, ...]:
        """The sort key of `job` now (lower goes first)."""
        ordering = self.policy.ordering
        if ordering is Ordering.FIFO:
            return (0.0,)
        if ordering is Ordering.PRIORITY:
            return (-job.tier.rank,)
        if ordering is Ordering.KUEUE:
            verdict = check_quota(self.st.queues[job.queue], self.alloc[job.queue], job.request)
            return (float(verdict is not QuotaVerdict.WITHIN_NOMINAL), -job.tier.rank)
        wait = max(0.0, self.now - job.submitted_at)
        if ordering is Ordering.SLURM:
            share = self.weights.get(job.queue, 0.0)
            used = self.usage.get(job.queue, 0.0)
            fair = 2.0 ** (-used / share) if share > 0 else 0.0
            age = min(wait / SLURM_AGE_MAX_S, 1.0)
            return (-(job.tier.rank * 1e5 + 1e4 * fair + 1e3 * age),)
        return self._fair_key(job, wait)

    def _fair_key(self, job: Job, wait: float) -> tuple[float, ...]:
        rank = job.tier.rank
        demoted = 0.0
        reclaimer = self.reclaimer_rank[job.queue]
        if rank >= reclaimer:
            verdict = check_quota(self.st.queues[job.queue], self.alloc[job.queue], job.request)
            if verdict is not QuotaVerdict.WITHIN_NOMINAL:
                rank = reclaimer
                demoted = 1.0
        if self.starving(job):
            # Oldest first, ahead of the rest of its tier, so it gets the reservation and
            # capacity drains towards it.
            return (-rank, demoted, _STARVING + job.submitted_at)
        credit = min(wait / self.settings.aging_s, self.settings.aging_max_units)
        return (-rank, demoted, self.fair_share(job) - credit)

    def _reclaimer_ranks(self) -> dict[str, int]:
        """Per queue: the lowest tier of pending work within nominal quota in *other* queues
        (`NO_RECLAIMER` when there is none, so that nobody is demoted)."""
        p = self.policy
        ranks = dict.fromkeys(self.st.queues, NO_RECLAIMER)
        if not (p.nominal_first and p.quotas and p.reclaim and p.ordering is Ordering.FAIR):
            return ranks
        lowest: dict[str, int] = {}
        for (queue, rank, gpus, cpus, memory), group in self.st.groups.items():
            if rank >= lowest.get(queue, NO_RECLAIMER) or not group.jobs:
                continue
            request = Amounts(gpus, cpus, memory)
            verdict = check_quota(self.st.queues[queue], self.alloc[queue], request)
            if verdict is QuotaVerdict.WITHIN_NOMINAL:
                lowest[queue] = rank
        # The two lowest, from different queues: each queue sees the lowest of the others.
        by_rank = sorted((r, q) for q, r in lowest.items())[:2]
        for name in ranks:
            ranks[name] = next((r for r, q in by_rank if q != name), NO_RECLAIMER)
        return ranks

    def starving(self, job: Job) -> bool:
        """Past the starvation limit, or past the aging cap in a queue below its fair share.

        The limit ignores the share: a burst far beyond a queue's weight would otherwise wait
        for as long as the other queues keep the cluster busy.
        """
        settings = self.settings
        wait = self.now - job.submitted_at
        limit = settings.starvation_limit_s
        if limit and wait >= limit:
            return True
        if wait < settings.aging_s * settings.aging_max_units:
            return False
        return self.fair_share(job, after=False) < 1.0

    def fair_share(self, job: Job, *, after: bool = True) -> float:
        """The queue's fair-share value as it would be with one more GPU (DRF's "after" view).

        Judging by the share after admission, not before, keeps a queue that just released a
        GPU from winning it back every time, which would freeze shares away from the weights.
        The step is one GPU whatever the job asks for: the value belongs to the queue, so that
        within a queue age decides; sized by the job, every small job that has aged past the
        cap would go before a big one of the same queue, which then starves in a backlog.
        """
        queue = job.queue
        share = self._share_now.get(queue)
        if share is None:
            a = self.alloc[queue]
            share = self._share_now[queue] = dominant_share(
                a.gpus, a.cpus, a.memory_gb, self.st.cluster
            )
        if after:
            share += self.step_share
        return fair_share_value(self.usage.get(queue, 0.0), share, self.weights[queue])
