"""Patient reclaim: a job within nominal quota waits for capacity to free before reclaiming.

Every reclaim costs its victims a save and a restore, and on a busy cluster some job ends every
few minutes. The nominal guarantee leaves room to wait for that: a job waits while reclaiming
later would still start it within `reclaim_within` of its submission (`guarantee_s`), whatever
borrower it then takes (the longest grace of any job on borrowed capacity, plus `EXIT_SLACK_S`
for the victims to exit and the cycle to see it). Only a first wait is patient (`submitted_at`
is kept across requeues), and only a plan of reclaims (other queues' borrowed work, whatever
its tier: `preemption.py` labels it so). While it waits, no other queue starts to borrow with a
longer grace than that (`ReclaimPatience.blocks_borrower`), so what it counted on holds, and no
later work of its own queue reclaims ahead of it: that work would take the room within nominal
quota it waits for, and it would then take that room back by tier preemption, or borrow.

Patient tier preemption: a plan that preempts lower tiers waits the same way, until
`tier_patience` after the submission (a tier has no guarantee to bound it, so the bound is a
setting). A plan that takes back loans never waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from preemptible.queue.core import reasons
from preemptible.queue.core.config import PreemptionSettings
from preemptible.queue.core.model import Job
from preemptible.queue.core.policy import Policy
from preemptible.queue.core.preemption import VictimPlan, victim_grace_s
from preemptible.queue.core.quota import QuotaVerdict, is_borrowing
from preemptible.queue.core.resources import Amounts
from preemptible.queue.core.state import ClusterState

EXIT_SLACK_S = 60.0
"""Time for preempted jobs to exit and the next cycle to admit the job they made room for."""
_TIER_PLAN = frozenset({"tier", "reclaim", "beyond_limit"})
"""Victim kinds of a plan that waits for `tier_patience` when it preempts a lower tier (a plan
that takes back loans goes ahead: the reserved job was promised them)."""


class ReclaimPatience:
    """One cycle's waiting reclaims and the victims' grace they count on.

    `alloc` is the cycle's own per-queue allocation, read (never written) when first needed.
    """

    def __init__(
        self,
        *,
        state: ClusterState,
        alloc: Mapping[str, Amounts],
        policy: Policy,
        settings: PreemptionSettings,
        now: float,
    ):
        self.st = state
        self.alloc = alloc
        self.policy = policy
        self.settings = settings
        self.now = now
        self.wake_at: float | None = None
        """The cycle should run again by then: the earliest end of a wait."""
        self.waiters: dict[str, str] = {}
        """Queue -> its first job that waits before reclaiming."""
        self._patience_s: float | None = None
        self.longest_victim_grace = 0.0
        """The longest grace of any job on borrowed capacity, as `patience_s` counted."""
        self.queue_grace: dict[str, float] = {}
        """Per queue, the longest grace of its running jobs (filled when first needed)."""
        self.admitted_grace: dict[str, float] = {}
        """Per queue, the longest grace of this cycle's admissions."""

    def waits(self, job: Job, plan: VictimPlan) -> str | None:
        """Why `job` waits instead of carrying out `plan` now, or None when it goes ahead."""
        waiter = self.waiters.get(job.queue)
        if waiter is not None and any(v.kind == "reclaim" for v in plan.victims):
            return reasons.reclaimer_waits(waiter, job.queue)
        kinds = {v.kind for v in plan.victims}
        if kinds <= _TIER_PLAN and "tier" in kinds:
            return self._waits_for_tier(job, plan)
        if not self.policy.patient_reclaim or kinds != {"reclaim"}:
            return None
        left = self._wait_until(job.submitted_at + self.patience_s())
        if left is None:
            return None
        self.waiters[job.queue] = job.id
        return reasons.waits_to_reclaim(left, (v.running.job.id for v in plan.victims))

    def _waits_for_tier(self, job: Job, plan: VictimPlan) -> str | None:
        """A plan with lower-tier victims waits until `tier_patience` after the submission."""
        if not self.policy.patient_tier_preemption:
            return None
        left = self._wait_until(job.submitted_at + self.settings.tier_patience_s)
        if left is None:
            return None
        return reasons.waits_to_preempt(left, (v.running.job.id for v in plan.victims))

    def _wait_until(self, until: float) -> float | None:
        """Seconds left until `until` (the cycle is asked to run again then), or None when it
        has passed."""
        if self.now >= until:
            return None
        self.wake_at = until if self.wake_at is None else min(self.wake_at, until)
        return until - self.now

    def patience_s(self) -> float:
        """How long after its submission a job within nominal quota may wait before reclaiming."""
        if self._patience_s is None:
            settings, index = self.settings, self.st.victim_index
            longest = max(
                (
                    index.facts(rj, self.policy, settings).grace_s
                    for name, running in self.st.running_by_queue.items()
                    if is_borrowing(self.st.queues[name], self.alloc[name])
                    for rj in running.values()
                ),
                default=settings.grace_max_s,
            )
            self.longest_victim_grace = longest
            self._patience_s = settings.guarantee_s - longest - EXIT_SLACK_S
        return self._patience_s

    def note_admitted(self, job: Job) -> None:
        """`job` starts in this cycle: its queue's jobs may now be victims with its grace."""
        grace = victim_grace_s(job, self.policy, self.settings)
        self.admitted_grace[job.queue] = max(self.admitted_grace.get(job.queue, 0.0), grace)

    def blocks_borrower(self, job: Job, verdict: QuotaVerdict) -> Literal["queue", "job"] | None:
        """A job of another queue waits to reclaim borrowed capacity, counting on victims whose
        grace is at most `longest_victim_grace`: `job` may not make its queue a borrower whose
        jobs (any of which could then be that victim) need longer. Returns None when it may
        start, else whose grace is too long: "queue" (its queue's jobs) or "job" (its own)."""
        if verdict is not QuotaVerdict.BORROWING or not self.waiters.keys() - {job.queue}:
            return None
        if job.queue not in self.queue_grace:
            running = self.st.running_by_queue.get(job.queue, {}).values()
            index = self.st.victim_index
            graces = (index.facts(rj, self.policy, self.settings).grace_s for rj in running)
            self.queue_grace[job.queue] = max(graces, default=0.0)
        queue_grace = max(self.queue_grace[job.queue], self.admitted_grace.get(job.queue, 0.0))
        if queue_grace > self.longest_victim_grace:
            return "queue"
        if victim_grace_s(job, self.policy, self.settings) > self.longest_victim_grace:
            return "job"
        return None
