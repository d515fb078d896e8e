"""Choosing which running jobs to preempt for a blocked job. Chooses; evicts nothing.

Three reasons allow a preemption:

1. reclaim: the blocked job would run within its queue's nominal quota, and the victim's queue
   holds more than its nominal quota (runs on borrowed capacity). Tier and minimum runtime do not
   protect borrowed work; that is the price of borrowing, and it keeps the nominal guarantee
   (`reclaim_within`).
2. tier: the victim's tier is strictly lower, it has run for its negotiated minimum runtime, was
   not preempted within the cooldown, and its queue has budget left this hour. Victims come from
   the blocked job's own queue, or (ours) from other queues' borrowed capacity, never from another
   queue's guaranteed share.
3. loan: the victim started on loan ahead of the blocked job's reservation (`loan_for`), and
   the blocked job still holds it; the victim's tier is not higher, it has run for its minimum
   runtime, and it is in the blocked job's queue or its queue is borrowing (work within a
   queue's nominal quota is never taken). It was admitted on exactly that condition.
4. beyond the limit (ours): the victim's queue holds more than its nominal quota plus its
   borrowing limit (`Policy.beyond_limit` lent it capacity nobody else used), and the blocked
   job's own queue would stay within its limit. Victims come out of that excess; neither tier
   nor minimum runtime protects it, as for reclaim.

Among the allowed victims, `victim_sets.py` picks the set that makes the job fit at the least
lost work: GPU-seconds since each victim's last checkpoint (only its save time when it
checkpoints on notice within its grace) plus its restore. What a queue borrows is judged without
its jobs that were already told to go.

An allowed victim that is elastic may instead be shrunk toward its minimum (`elastic.py`,
`VictimSearch._shrink_or_evict`): the same reasons allow it, it gets the same grace, and the
plan with shrinks is chosen when it loses no more than the plan of evictions alone (never when
an eviction loses strictly less), so work within nominal quota still waits at most one grace for
what it is owed. For the same reason a job whose shrink is under way is never shrunk again but
may be evicted, priced as an eviction of all it holds (`docs/internals/shrink-or-evict.md`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from operator import itemgetter
from typing import Literal, NamedTuple

from preemptible.queue.core.config import PolicySettings, PreemptionSettings
from preemptible.queue.core.elastic import may_resize, shrink_option
from preemptible.queue.core.ledger import Ledger
from preemptible.queue.core.model import Job, RunningJob, VictimKind
from preemptible.queue.core.negotiation import (
    counted_restore_s,
    grace_seconds,
    min_runtime_seconds,
)
from preemptible.queue.core.policy import ElasticMode, Policy, VictimOrder
from preemptible.queue.core.quota import (
    QuotaVerdict,
    beyond_limit,
    borrowed,
    check_quota,
    is_borrowing,
)
from preemptible.queue.core.resources import Amounts
from preemptible.queue.core.state import ClusterState
from preemptible.queue.core.victim_index import Price
from preemptible.queue.core.victim_sets import Candidate, Victim, VictimPlan, cheapest_set

__all__ = [
    "Candidate",
    "Price",
    "Victim",
    "VictimPlan",
    "VictimSearch",
    "in_cooldown",
    "loans_due",
    "lost_gpu_seconds",
    "min_runtime_end",
    "queue_budget_left",
    "saves_within_grace",
    "victim_grace_s",
]


def victim_grace_s(job: Job, policy: Policy, settings: PreemptionSettings) -> float:
    """Grace granted to a victim: negotiated from its save cost, or the policy's fixed value."""
    if policy.negotiated_grace:
        return grace_seconds(job.save_s, settings)
    return policy.fixed_grace_s


def saves_within_grace(job: Job, policy: Policy, settings: PreemptionSettings) -> bool:
    """A notice costs `job` only its save (and a restore): it saves on notice within its grace."""
    return job.checkpoint_on_notice and job.save_s <= victim_grace_s(job, policy, settings)


def in_cooldown(job: Job, now: float, settings: PreemptionSettings) -> bool:
    """`job` was preempted within the cooldown: another notice now would start a loop."""
    last = job.last_preempted_at
    return last is not None and now - last < settings.cooldown_s


def lost_gpu_seconds(
    running: RunningJob, now: float, grace_s: float, settings: PreemptionSettings
) -> float:
    """GPU-seconds a preemption now would waste: unsaved work (or the save) plus restore.

    The restore counts as negotiated (at most `max_claimed_restore`): a claim must not make a
    job the last victim any more than it may make it unpreemptable."""
    job = running.job
    gpus = max(running.size, 1)
    restore_s = counted_restore_s(job.restore_s, settings)
    if job.checkpoint_on_notice and job.save_s <= grace_s:
        return gpus * (job.save_s + restore_s)
    return gpus * (max(0.0, now - running.checkpoint_time(now)) + restore_s)


def queue_budget_left(
    state: ClusterState, queue: str, now: float, settings: PreemptionSettings, used: int
) -> int:
    """Preemptions the queue may still suffer in the rolling hour (the log holds at most the
    last hour's, pruned as it is written, so counting it is cheap)."""
    since = now - 3600.0
    recent = sum(1 for at in state.recent_preemptions.get(queue, ()) if at >= since)
    return settings.queue_budget_per_hour - recent - used


def min_runtime_end(rj: RunningJob, settings: PreemptionSettings) -> float:
    """When `rj` has run its negotiated minimum runtime (before that, only reclaim takes it)."""
    return rj.started_at + min_runtime_seconds(rj.job.save_s, rj.job.restore_s, settings)


_ORDER = itemgetter(0)
"""A `Candidate`'s `order`, its sort key."""

_Mode = Literal["reclaim", "beyond_limit", "tier", "beyond+tier"]
"""Why a queue's jobs of one tier may be victims of a search (`VictimSearch._tier_list`)."""


class _Scope(NamedTuple):
    """Which reasons may apply to one search, and what each queue borrows."""

    verdict: QuotaVerdict
    reclaim: bool
    tier: bool
    loans: bool
    borrowed: dict[str, Amounts]
    """Per queue, what victims of it may free (`cheapest_set` keeps within it when it can)."""
    borrowing: dict[str, bool]
    beyond: frozenset[str]
    """Other queues over their borrowing limit, whose excess the job may take."""


class VictimSearch:
    """The victim searches of one cycle: who may be a victim, then which set is cheapest.

    Searches share what they can. Prices do not depend on the preemptor; who may be a victim
    depends only on the preemptor's queue and tier while allocations, budgets and what is
    leaving stay the same, so the cycle calls `forget_eligible` when it admits a job or chooses
    victims. `ledger` is the cycle's own, read at each search.
    """

    def __init__(
        self,
        *,
        now: float,
        state: ClusterState,
        ledger: Ledger,
        policy: Policy,
        settings: PreemptionSettings,
        elastic: ElasticMode = ElasticMode.OFF,
        policy_settings: PolicySettings | None = None,
    ):
        self.now = now
        self.state = state
        self.ledger = ledger
        self.policy = policy
        self.settings = settings
        self.elastic = elastic
        """How elastic jobs may be shrunk instead of evicted (`shrink_or_evict`)."""
        self.policy_settings = policy_settings or PolicySettings()
        self.taken: set[str] = set()
        """Jobs chosen as victims (or to move) in this cycle: no later search takes them."""
        self.budget_used: dict[str, int] = {}
        """Per queue, the notices this cycle has sent its jobs (against its hourly budget)."""
        self._prices: dict[str, Price] = {}
        self._eligible: dict[
            tuple[str, int, bool, bool, str | None, frozenset[str]], list[Candidate]
        ] = {}
        self._tier_lists: dict[tuple[str, int, _Mode], list[Candidate]] = {}

    def take(self, victim: Job, *, budget: bool = True) -> None:
        """`victim` gets a notice this cycle: it counts against its queue's budget (unless it
        is a shrink, `budget=False`) and no later search of the cycle may choose it again."""
        if budget:
            self.budget_used[victim.queue] = self.budget_used.get(victim.queue, 0) + 1
        self.taken.add(victim.id)

    def forget_eligible(self) -> None:
        """Allocations or budgets changed: who may be a victim must be found again."""
        self._eligible.clear()

    def find(self, job: Job, *, take_loans: bool = False, tier: bool = True) -> VictimPlan | None:
        """The cheapest set of victims that lets `job` start, or None when there is none.

        `take_loans`: `job` holds the reservation, so jobs on loan to it are candidates too;
        `tier=False` leaves tier victims out (their search is backed off).
        """
        scope = self._scope(job, take_loans=take_loans, tier=tier)
        if scope is None:
            return None
        candidates = self.candidates(job, scope)
        if not candidates:
            return None
        plan = self._cheapest(job, candidates, scope)
        if self.elastic is ElasticMode.OFF:
            return plan
        return self._shrink_or_evict(job, candidates, scope, plan)

    def _shrink_or_evict(
        self, job: Job, candidates: list[Candidate], scope: _Scope, plan: VictimPlan | None
    ) -> VictimPlan | None:
        """The plan of evictions alone, or one that shrinks elastic jobs instead: the cheaper
        (`ElasticMode.PRICED`, the shrinks on a tie), or any that shrinks (`PRIORITY`)."""
        shrinks = self._shrinks(candidates)
        if not shrinks:
            return plan
        shrinkable = {c.running.job.id for c in shrinks}
        rest = [c for c in candidates if c.running.job.id not in shrinkable]
        # Shrinks before any eviction: the priority rule, and for the priced one the plan
        # with shrinks to weigh when the cheapest-first order finds none.
        first = shrinks + [c._replace(order=(1, *c.order)) for c in rest]
        mixed = None
        if self.elastic is ElasticMode.PRICED:
            mixed = self._cheapest(job, sorted(shrinks + rest, key=lambda c: c.order), scope)
        if mixed is None or not mixed.shrinks:
            other = self._cheapest(job, first, scope)
            if other is not None and other.shrinks:
                mixed = other
        if mixed is None or not mixed.shrinks:
            return plan if plan is not None else mixed
        evict = None if plan is None else plan.lost_gpu_s
        chosen = mixed
        if (
            self.elastic is ElasticMode.PRICED
            and plan is not None
            and plan.lost_gpu_s < mixed.lost_gpu_s
        ):
            # A tie goes to the shrink: an eviction gives up all the victim's GPUs until it is
            # readmitted, a shrink keeps it running on the rest.
            chosen = plan
        return dataclasses.replace(
            chosen, evict_lost_gpu_s=evict, shrink_lost_gpu_s=mixed.lost_gpu_s
        )

    def _shrinks(self, candidates: list[Candidate]) -> list[Candidate]:
        """A shrink to its minimum for each candidate that may shrink, in the search order."""
        out = []
        for c in candidates:
            rj = c.running
            if c.shrinking_to is not None or not rj.job.is_elastic:
                continue  # a job whose shrink is under way is never shrunk again
            if not may_resize(rj.job, self.now, self.policy_settings):
                continue
            option = shrink_option(rj, self.now, c.grace_s, self.settings)
            if option is None:
                continue
            lost = option.lost_gpu_s
            order: tuple[float | str, ...]
            rank = self.state.victim_rank.get(rj.job.id, 0)
            if self.elastic is ElasticMode.PRIORITY:
                order = (0, rj.job.tier.rank, rank, -rj.started_at, rj.job.id)
            elif self.policy.victim_order is VictimOrder.LOWEST_PRIORITY_NEWEST:
                order = c.order
            else:
                freed = max(rj.size - option.gpus_after, 1)
                order = (lost / freed, lost, rank, -rj.started_at, rj.job.id)
            out.append(c._replace(order=order, lost_gpu_s=lost, shrink=option))
        out.sort(key=lambda c: c.order)
        return out

    def _cheapest(self, job: Job, candidates: list[Candidate], scope: _Scope) -> VictimPlan | None:
        ledger = self.ledger
        return cheapest_set(
            job,
            candidates,
            own_alloc=ledger.alloc[job.queue],
            queue=self.state.queues[job.queue],
            quotas=self.policy.quotas,
            free=ledger.free,
            pool=ledger.pool,
            node_jobs=self.state.node_jobs,
            borrowed=scope.borrowed,
            within_borrowed=self.policy.within_borrowed,
        )

    def _scope(self, job: Job, *, take_loans: bool, tier: bool) -> _Scope | None:
        """Which of reclaim, tier and loan may apply to `job`; None when none can."""
        policy, state, ledger = self.policy, self.state, self.ledger
        verdict = QuotaVerdict.WITHIN_NOMINAL
        if policy.quotas:
            verdict = check_quota(state.queues[job.queue], ledger.alloc[job.queue], job.request)
        can_reclaim = policy.reclaim and policy.quotas and verdict is QuotaVerdict.WITHIN_NOMINAL
        lower = range(job.tier.rank)
        can_tier = tier and policy.tier_preemption and any(state.tier_gpus[t] for t in lower)
        take_loans = take_loans and job.id in state.loans
        beyond = self._beyond(job, verdict)
        if not (can_reclaim or can_tier or take_loans or beyond):
            return None
        room = {
            name: borrowed(q, ledger.alloc[name], ledger.leaving[name])
            for name, q in state.queues.items()
        }
        borrowing = {name: r.any_positive() for name, r in room.items()}
        if not (can_tier or take_loans or any(borrowing.values())):
            return None
        if not can_reclaim:
            room.update(beyond)  # a borrower takes only what the victim's queue has beyond
        return _Scope(
            verdict, can_reclaim, can_tier, take_loans, room, borrowing, frozenset(beyond)
        )

    def _beyond(self, job: Job, verdict: QuotaVerdict) -> dict[str, Amounts]:
        """Other queues' excess over their borrowing limit that `job` may take (rule 4)."""
        policy, state, ledger = self.policy, self.state, self.ledger
        if not (policy.beyond_limit and policy.quotas) or verdict is QuotaVerdict.OVER_LIMIT:
            return {}
        excess = {
            name: beyond_limit(q, ledger.alloc[name], ledger.leaving[name])
            for name, q in state.queues.items()
            if name != job.queue
        }
        return {name: amounts for name, amounts in excess.items() if amounts.any_positive()}

    def candidates(self, job: Job, scope: _Scope) -> list[Candidate]:
        """Who may be a victim for `job`, in the policy's victim order (cached for the cycle)."""
        key = (
            job.queue,
            job.tier.rank,
            scope.reclaim,
            scope.tier,
            job.id if scope.loans else None,
            scope.beyond,
        )
        cached = self._eligible.get(key)
        if cached is not None:
            return [c for c in cached if c.running.job.id not in self.taken]
        found = self._eligible[key] = self._find_eligible(job, scope)
        return found

    def _find_eligible(self, job: Job, scope: _Scope) -> list[Candidate]:
        policy, settings, now, rank = self.policy, self.settings, self.now, job.tier.rank
        # A borrower that takes another queue's borrowed capacity runs on borrowed capacity
        # itself: the victim's queue can reclaim it back at once, so the save is lost for nothing.
        across = policy.tier_preemption_across_queues and scope.verdict is not (
            QuotaVerdict.BORROWING
        )
        parts: list[tuple[str, int, _Mode]] = []
        tier_queues: set[str] = set()
        loan_queues: set[str] = set()
        for vq, running in self.state.running_by_queue.items():
            borrowing = scope.borrowing[vq]
            reclaim_q = scope.reclaim and borrowing and vq != job.queue
            tier_q = scope.tier and (vq == job.queue or (across and borrowing))
            loan_q = scope.loans and (vq == job.queue or borrowing)  # as in `loans_due`
            beyond_q = vq in scope.beyond
            taken_back = reclaim_q or beyond_q  # neither tier nor minimum runtime protects it
            if not (taken_back or tier_q or loan_q) or not running:
                continue
            if tier_q and policy.anti_thrashing:
                used = self.budget_used.get(vq, 0)
                tier_q = queue_budget_left(self.state, vq, now, settings, used) > 0
                if not (taken_back or tier_q or loan_q):
                    continue
            if tier_q:
                tier_queues.add(vq)
            if loan_q:
                loan_queues.add(vq)
            # Jobs told to go are in no tier's list. A search for tier victims alone visits the
            # tiers below the job's; loans, of its own tier too, come from `state.loans`.
            tiers = len(self.state.staying[vq]) if taken_back else rank if tier_q else 0
            for tier_rank in range(tiers):
                tier_r = tier_q and tier_rank < rank
                mode: _Mode
                if reclaim_q:
                    # Another queue's borrowed work is the job's to reclaim whatever its tier:
                    # the guarantee, not the tier rules, says when it goes (`patience.py`).
                    mode = "reclaim"
                elif beyond_q:
                    mode = "beyond+tier" if tier_r else "beyond_limit"
                else:
                    mode = "tier"
                parts.append((vq, tier_rank, mode))
        loans = self._loan_candidates(job, tier_queues, loan_queues) if loan_queues else {}
        found: list[Candidate] = []
        for vq, tier_rank, mode in parts:
            # Without the jobs taken this cycle, and the loans listed as loans: a few a cycle,
            # so a tier's list is copied only when it holds one.
            members = self.state.staying[vq][tier_rank]
            drop = {j for j in self.taken if j in members}
            drop.update(j for j in loans if j in members)
            listed = self._tier_list(vq, tier_rank, mode)
            found += [c for c in listed if c.running.job.id not in drop] if drop else listed
        found += loans.values()
        found.sort(key=_ORDER)
        return found

    def _tier_list(self, queue: str, tier_rank: int, mode: _Mode) -> list[Candidate]:
        """The candidates among `queue`'s running jobs of one tier for one reason, in order
        (cached for the cycle: the searches of a cycle share them). `mode`: "reclaim" and
        "beyond_limit" take every job; "tier" those past their minimum runtime and cooldown;
        "beyond+tier" every job, as a tier victim when it could be one."""
        key = (queue, tier_rank, mode)
        cached = self._tier_lists.get(key)
        if cached is not None:
            return cached
        out: list[Candidate] = []
        policy, settings, now, state = self.policy, self.settings, self.now, self.state
        by_tier = mode == "tier" or mode == "beyond+tier"
        protect = by_tier and policy.protect_min_runtime
        anti, cooldown = by_tier and policy.anti_thrashing, settings.cooldown_s
        every: VictimKind = "reclaim" if mode == "reclaim" else "beyond_limit"
        make = tuple.__new__  # a `Candidate` without the call its constructor adds
        for rj, facts, price in state.victim_index.priced(
            state.staying[queue][tier_rank].values(),
            now,
            state.victim_rank,
            state.shrinking,
            policy,
            settings,
            self._prices,
        ):
            kind = every
            if by_tier:  # `_may_take_by_tier`, inline: thousands of jobs a search
                ok = not protect or now >= facts.min_runtime_end
                if ok and anti:
                    last = rj.job.last_preempted_at
                    ok = last is None or now - last >= cooldown
                if ok:
                    kind = "tier"
                elif mode == "tier":
                    continue
            order, lost, grace, to = price
            out.append(make(Candidate, (order, rj, lost, grace, kind, None, to)))
        out.sort(key=_ORDER)
        self._tier_lists[key] = out
        return out

    def _may_take_by_tier(self, rj: RunningJob) -> bool:
        """`rj` has run its minimum runtime (when the policy protects it) and is past its
        cooldown (when the policy has one): a tier or a loan may take it."""
        return self._mature(rj) and not (
            self.policy.anti_thrashing and in_cooldown(rj.job, self.now, self.settings)
        )

    def _mature(self, rj: RunningJob) -> bool:
        """`rj` has run its negotiated minimum runtime, or the policy does not protect it."""
        if not self.policy.protect_min_runtime:
            return True
        facts = self.state.victim_index.facts(rj, self.policy, self.settings)
        return self.now >= facts.min_runtime_end

    def _loan_candidates(
        self, job: Job, tier_queues: set[str], loan_queues: set[str]
    ) -> dict[str, Candidate]:
        """The jobs on loan to `job` that it may take back as loans, by id: of no higher tier,
        in a queue it may take loans from, past their minimum runtime. A tier victim as well
        counts as one (`kind` "tier"), as in the search of each queue."""
        out: dict[str, Candidate] = {}
        running, rank = self.state.running, job.tier.rank
        for loan_id in self.state.loans.get(job.id, ()):
            rj = running[loan_id]
            vq, tier_rank = rj.job.queue, rj.job.tier.rank
            if vq not in loan_queues or tier_rank > rank or loan_id in self.taken:
                continue
            if not self._mature(rj):
                continue  # still listed by its queue's search when another reason takes it
            tier_ok = vq in tier_queues and tier_rank < rank and self._may_take_by_tier(rj)
            order, lost, grace, to = self._prices.get(loan_id) or self._price(rj)
            out[loan_id] = Candidate(
                order, rj, lost, grace, "tier" if tier_ok else "loan", None, to
            )
        return out

    def _price(self, rj: RunningJob) -> Price:
        """The price of preempting `rj` now (cached for the cycle; its parts that do not change
        while it runs are kept between cycles, `victim_index.py`)."""
        price = self._prices.get(rj.job.id)
        if price is None:
            # A job whose shrink is under way may still be evicted (never shrunk again): work
            # within nominal quota must not wait for that save before it may reclaim. It loses
            # what an eviction of all it holds loses and frees what the shrink keeps.
            shrinking = self.state.shrinking.get(rj.job.id)
            price = self._prices[rj.job.id] = self.state.victim_index.price(
                rj,
                self.now,
                self.state.victim_rank.get(rj.job.id, 0),  # 0 frees a whole island: first
                None if shrinking is None else shrinking[0],
                self.policy,
                self.settings,
            )
        return price


def loans_due(
    job: Job,
    *,
    now: float,
    state: ClusterState,
    alloc: Mapping[str, Amounts],
    policy: Policy,
    settings: PreemptionSettings,
    leaving: Mapping[str, Amounts] | None = None,
) -> dict[str, float]:
    """Running job id -> when `job` may take it back, for every job on loan to it that it may.

    That is `now`, or the end of the loan's minimum runtime. The reservation counts these GPUs
    as the head's from then on, not from the loans' expected ends: judged by those ends, the
    nodes its loans run on look busy, the plan moves to another node, backfill fills the node
    it left, and the head waits while the plan flips from node to node. (A loan that is due may
    still stay for a cycle: when the head waits for victims already told to go, or the cycle
    has no victim searches left.)
    """
    if not policy.loan_backfill or job.id not in state.loans:
        return {}
    if leaving is None:
        leaving = state.leaving
    due: dict[str, float] = {}
    for vq, running in state.running_by_queue.items():
        if vq != job.queue and not is_borrowing(state.queues[vq], alloc[vq], leaving[vq]):
            continue  # work within its queue's nominal quota is never taken back
        for rj in running.values():
            if not rj.terminating and _on_loan_to(rj, job):
                back = min_runtime_end(rj, settings) if policy.protect_min_runtime else now
                due[rj.job.id] = max(now, back)
    return due


def _on_loan_to(rj: RunningJob, job: Job) -> bool:
    """`rj` runs on loan ahead of `job`'s reservation and is of no higher tier."""
    return rj.loan_for == job.id and rj.job.tier.rank <= job.tier.rank
