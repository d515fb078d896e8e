"""One scheduling cycle: a snapshot and the current time in, decisions with reasons out.

The phases, as in kueue's `schedule()`:

1. **Nominees first** (`_nominated_first`). A job whose victims were told to go in an earlier
   cycle gets the freed capacity before anyone else, so capacity freed by preemption cannot be
   taken by a third job (the root of preemption loops). While it waits, the free capacity it
   counted on is held; so is the new place of a moved job, from its notice until it restarts
   there. A nominee that would now borrow, while other queues' work within nominal quota
   waits, takes its turn in the walk instead (it would be reclaimed at once); a moved job,
   which only changes node, does not.
2. **The walk** (`_walk`). Pending jobs are visited in policy order (`ordering.py`) by merging
   the heads of the pending groups (`state.py`); a queue's keys are recomputed lazily when an
   admission changes its allocation.
3. **Each job** (`_consider`):
   1. quota: within nominal, borrowing, or over the limit (then its group waits);
   2. if it fits now, it starts (`_start`): at once when no reservation exists; as backfill
      when it does not delay the reservation; on loan when it would but saves on notice (the
      reserved job may take it back later); otherwise it waits;
   3. if it does not fit (`_blocked`): a job ahead of any reservation that fits by count, only
      not on one node block, may move a few small jobs to other nodes (`defrag.py`); else it
      may preempt (`_maybe_preempt`: reclaim, lower tier, or, for the reserved job, its loans;
      a first reclaim or tier preemption may wait for capacity to free on its own,
      `patience.py`);
   4. still blocked: a strict policy stops the walk here, a backfilling one reserves capacity
      for this job (`backfill.py`) and goes on with the rest, the others skip the job's group.
4. **Stop early** when nothing is free and nothing can be preempted: the rest wait.
5. **Beyond the limit** (`_beyond_limit`, ours). What the walk left free goes to jobs it
   refused only for their queue's borrowing limit, when they save on notice within their
   grace: they are the first reclaimed when another queue within its limit needs the capacity
   (`preemption.py`, rule 4), so the limit costs the others one grace, not idle GPUs.
6. **Grow** (`_grow`, elastic jobs). What is still free, when no reservation drains capacity
   and no pending job could use it, goes to shrunk elastic jobs when what they gain on GPUs
   nobody else is expected to want pays for the resize and any expected shrink back
   (`elastic.grow_price`).

Elastic jobs (`elastic.py`) are also admitted at a smaller size in their range when their full
size does not fit (3.2), and victim searches may shrink them instead of evicting (3.3).

Capacity as the decisions so far leave it is the `Ledger`'s; victim searches share one
`VictimSearch`; every reason's wording is in `reasons.py`.

Nothing here reads a clock, does I/O or mutates the snapshot: the shell applies the decisions.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq

from preemptible.queue.core import elastic, reasons
from preemptible.queue.core.backfill import Reservation, Started, may_backfill, plan_reservation
from preemptible.queue.core.config import QueueConfig
from preemptible.queue.core.defrag import MovePlan, find_moves
from preemptible.queue.core.elastic import (
    grow_price,
    idle_horizon_s,
    larger_sizes,
    may_resize,
    next_resize_at,
)
from preemptible.queue.core.ledger import Ledger
from preemptible.queue.core.model import (
    Admit,
    CycleResult,
    Job,
    Preempt,
    Reserve,
    Resize,
    RunningJob,
    SearchKey,
)
from preemptible.queue.core.ordering import HeapEntry, PendingOrder
from preemptible.queue.core.patience import ReclaimPatience
from preemptible.queue.core.placement import Placement
from preemptible.queue.core.policy import ElasticMode, Policy, effective_elastic
from preemptible.queue.core.preemption import (
    Victim,
    VictimPlan,
    VictimSearch,
    in_cooldown,
    loans_due,
    saves_within_grace,
    victim_grace_s,
)
from preemptible.queue.core.quota import QuotaVerdict, check_quota, is_borrowing
from preemptible.queue.core.state import GroupKey, Snapshot

INF = float("inf")


class Step(enum.Enum):
    """What the walk does after looking at a job."""

    NEXT = "next"
    """Look at the next job of the same group."""
    SKIP = "skip"
    """The rest of the group waits (same queue, tier and shape: the same verdict)."""
    STOP = "stop"
    """The walk ends here (a strict head-of-line policy)."""


def schedule(snapshot: Snapshot, now: float, policy: Policy, config: QueueConfig) -> CycleResult:
    """Run one cycle and return the decisions; `snapshot` is left unchanged.

    Args:
        snapshot: the state and decayed usage at `now`.
        now: the current time, in the same unit and origin as the jobs' times.
        policy: which rules to apply (ours or a baseline).
        config: capacity, quotas and the policy/preemption settings.
    """
    return _Cycle(snapshot, now, policy, config).run()


class _Cycle:
    """The mutable bookkeeping of one cycle; discarded when it returns."""

    def __init__(self, snapshot: Snapshot, now: float, policy: Policy, config: QueueConfig):
        st = self.st = snapshot.state
        self.now = now
        self.policy = policy
        self.config = config
        self.ledger = Ledger(st)
        self.order = PendingOrder(
            state=st,
            usage=snapshot.usage,
            alloc=self.ledger.alloc,
            policy=policy,
            config=config,
            now=now,
        )
        self.elastic = effective_elastic(policy, config.policy.elastic)
        self.search = VictimSearch(
            now=now,
            state=st,
            ledger=self.ledger,
            policy=policy,
            settings=config.preemption,
            elastic=self.elastic,
            policy_settings=config.policy,
        )
        self.patience = (
            ReclaimPatience(
                state=st,
                alloc=self.ledger.alloc,
                policy=policy,
                settings=config.preemption,
                now=now,
            )
            if policy.patient_reclaim or policy.patient_tier_preemption
            else None
        )
        self.admits: list[Admit] = []
        self.preempts: list[Preempt] = []
        self.resizes: list[Resize] = []
        self.grow_at: float | None = None
        """When a shrunk job that may not be resized yet may grow (`CycleResult.wake_at`)."""
        self.arrived_gpus: float | None = None
        """GPUs asked by the jobs still here that arrived within the last `default_estimate`
        (`_idle_horizon_s`), counted at the first grow priced in the cycle."""
        self.reserves: list[Reserve] = []
        self.reasons: dict[str, str] = {}
        self.default_reason = reasons.WAITING_TURN
        self.started: set[str] = set()
        """Jobs admitted (or, for nominees, handled) in this cycle: the walk passes them by."""
        self.started_ends: list[Started] = []
        self.reservation: Reservation | None = None
        self.plans_left = policy.max_preemption_plans if config.preemption.enabled else 0
        """Victim and move searches this cycle may still run."""
        self.examined = 0
        self.failed: list[SearchKey] = []
        """Failed tier-preemption searches: the shell backs these kinds of job off."""
        self.failed_here: list[SearchKey] = []
        """Failed victim searches of this cycle (for any reason)."""
        self.rerun = False
        self.over_limit: list[GroupKey] = []
        """Groups the walk refused for their queue's borrowing limit, in the walk's order."""
        self.incoming = self._unclaimed_leaving()
        """GPUs that preempted jobs will free soon and no nominated job has claimed."""
        self.movers: dict[int, list[RunningJob]] = {}
        """Per node, the jobs there that could move (`defrag.find_moves`), found once a cycle:
        the state, the time and the settings do not change within one."""

    def _unclaimed_leaving(self) -> float:
        st, window = self.st, self.config.preemption.nomination_window_s
        claimed = sum(
            st.pending[j].request.gpus
            for j, at in st.nominated.items()
            if j in st.pending and self.now - at <= window
        )
        return max(0, st.terminating_gpus - claimed)

    def run(self) -> CycleResult:
        self._nominated_first()
        self._walk()
        self._beyond_limit()
        self._grow()
        return CycleResult(
            admit=tuple(self.admits),
            preempt=tuple(self.preempts),
            reserve=tuple(self.reserves),
            pending=self.reasons,
            default_reason=self.default_reason,
            fragmentation=self._fragmentation(),
            examined=self.examined,
            failed_preemptions=tuple(self.failed),
            rerun=self.rerun and bool(self.admits),
            wake_at=self._wake_at(),
            resize=tuple(self.resizes),
        )

    def _wake_at(self) -> float | None:
        times = [self.grow_at] if self.grow_at is not None else []
        if self.patience is not None and self.patience.wake_at is not None:
            times.append(self.patience.wake_at)
        return min(times, default=None)

    # --- 1. nominees --------------------------------------------------------------------------

    def _nominated_first(self) -> None:
        st = self.st
        window = self.config.preemption.nomination_window_s
        live = [job_id for job_id, at in st.nominated.items() if self.now - at <= window]
        # Oldest first, but moved jobs before the rest: each restarts on, or keeps holding, the
        # place held for it since its notice, which no other nominee's best fit may take.
        for job_id in sorted(live, key=lambda j: j not in st.moving):
            if self.ledger.free.gpus <= 0:
                break  # nothing to admit or hold; later cycles will see the freed capacity
            job = st.pending.get(job_id)
            moving = job_id in st.moving
            if job is None:
                if moving and job_id in st.running:  # still saving: its new place waits for it
                    self._hold_nodes(st.nominated_nodes.get(job_id, ()))
                continue
            self.examined += 1
            verdict = self._quota(job)
            if verdict is QuotaVerdict.OVER_LIMIT:
                continue
            if (
                verdict is QuotaVerdict.BORROWING
                and not moving  # a moved job only changes node
                and self.order.has_reclaimer(job.queue)
            ):
                # Its queue filled its nominal quota meanwhile: started now it would borrow, and
                # other queues' pending work within nominal quota would reclaim it at once (and
                # it, requeued, would reclaim back). It takes its turn in the walk instead.
                continue
            on = st.nominated_nodes.get(job_id) if moving else None
            placement = self.ledger.place(job.request, on=on)
            if placement is not None:
                self._admit(job, placement, verdict, reasons.ADMITTED_NOMINEE)
            else:
                self.reasons[job_id] = reasons.NOMINEE_WAITS
                self.started.add(job_id)  # handled: the walk must not preempt again for it
                self._hold(job, st.nominated_nodes.get(job_id, ()))

    # --- 2. the walk --------------------------------------------------------------------------

    def _walk(self) -> None:
        st = self.st
        can_preempt = self._preemption_possible()
        if not st.groups or (self.ledger.free.gpus <= 0 and not can_preempt):
            self.default_reason = reasons.NOTHING_TO_PREEMPT
            return
        heap = [self.order.entry(group.jobs[0], gkey) for gkey, group in st.groups.items()]
        heapq.heapify(heap)
        pos = dict.fromkeys(st.groups, 0)
        depth: dict[GroupKey, int] = {}
        while heap:
            if self.ledger.free.gpus <= 0 and not (can_preempt and self.plans_left > 0):
                if self.reservation is None:
                    self.default_reason = reasons.NOTHING_TO_PREEMPT
                break
            entry = heapq.heappop(heap)
            gkey = entry.group
            job = st.groups[gkey].jobs[pos[gkey]]
            if self.order.is_stale(entry):
                heapq.heappush(heap, self.order.entry(job, gkey))
                continue
            step = self._consider(job, depth, gkey)
            if step is Step.STOP:
                self.default_reason = reasons.behind_strict_head(job)
                break
            if step is Step.NEXT:
                self._push_next(heap, pos, gkey)

    def _push_next(self, heap: list[HeapEntry], pos: dict[GroupKey, int], gkey: GroupKey) -> None:
        """Push the group's next job the cycle has not started yet, if any."""
        jobs = self.st.groups[gkey].jobs
        i = pos[gkey] + 1
        while i < len(jobs) and jobs[i].id in self.started:
            i += 1
        if i < len(jobs):
            pos[gkey] = i
            heapq.heappush(heap, self.order.entry(jobs[i], gkey))

    def _preemption_possible(self) -> bool:
        if self.plans_left <= 0:
            return False
        p = self.policy
        if p.tier_preemption and any(self.st.tier_gpus[:3]):
            return True
        if p.loan_backfill and self.st.loans:
            return True
        if p.reclaim and p.quotas:
            alloc = self.ledger.alloc
            return any(is_borrowing(q, alloc[n]) for n, q in self.st.queues.items())
        return False

    # --- 3. one job ---------------------------------------------------------------------------

    def _consider(self, job: Job, depth: dict[GroupKey, int], gkey: GroupKey) -> Step:
        if job.id in self.started:
            return Step.NEXT
        self.examined += 1
        verdict = self._quota(job)
        if verdict is QuotaVerdict.OVER_LIMIT:
            self.reasons[job.id] = reasons.over_quota(job, self.st.queues[job.queue])
            self.over_limit.append(gkey)
            return Step.STOP if self.policy.head_of_line else Step.SKIP
        placement = self.ledger.place(job.request)
        full = None
        if placement is None:
            smaller = self._smaller_fit(job)
            if smaller is None:
                return self._blocked(job, verdict)
            full = job
            job, placement, verdict = smaller
        if self.patience is not None:
            # At a smaller size too: an elastic job would borrow with the same grace.
            blocked = self.patience.blocks_borrower(job, verdict)
            if blocked is not None:
                self.reasons[job.id] = reasons.BORROWER_BLOCKED
                if blocked == "queue":
                    return Step.SKIP  # its queue's jobs are too slow to save: the group waits
                return self._deeper(depth, gkey)  # its own save: the next may be quicker
        return self._start(job, placement, verdict, depth, gkey, full=full)

    def _deeper(self, depth: dict[GroupKey, int], gkey: GroupKey) -> Step:
        """Look further into a group whose job was refused for a reason of its own, up to the
        backfill depth."""
        depth[gkey] = depth.get(gkey, 0) + 1
        return Step.NEXT if depth[gkey] < self.config.policy.backfill_depth else Step.SKIP

    def _smaller_fit(self, job: Job) -> tuple[Job, Placement, QuotaVerdict] | None:
        """An elastic job whose full size does not fit: the largest size in its range that
        fits now, as the job at that size, with its placement and quota verdict."""
        if self.elastic is ElasticMode.OFF or not job.is_elastic:
            return None
        for gpus in job.sizes()[1:]:
            sized = dataclasses.replace(job, request=job.at_size(gpus))
            verdict = self._quota(sized)
            if verdict is QuotaVerdict.OVER_LIMIT:
                continue
            placement = self.ledger.place(sized.request)
            if placement is not None:
                return sized, placement, verdict
        return None

    def _start(
        self,
        job: Job,
        placement: Placement,
        verdict: QuotaVerdict,
        depth: dict[GroupKey, int],
        gkey: GroupKey,
        *,
        full: Job | None = None,
    ) -> Step:
        """`job` fits now: start it unless that would delay the reservation (2). `full`: the
        elastic job as submitted, when `job` is it at a smaller size."""

        def sized(reason: str) -> str:
            if full is None:
                return reason
            return reasons.admitted_smaller(full, job.request.gpus, reason)

        gpus = None if full is None else job.request.gpus
        res = self.reservation
        if res is None or (
            res.borrowing and verdict is QuotaVerdict.WITHIN_NOMINAL and job.queue != res.queue
        ):
            reason = sized(reasons.admitted(job, verdict, quotas=self.policy.quotas))
            self._admit(job, placement, verdict, reason, gpus=gpus)
            self._use_held_nodes(placement)
            return Step.NEXT
        kept = self._backfill_placement(job, placement, res)
        if kept is not None:
            reason = sized(reasons.admitted_by_backfill(res.job_id))
            self._admit(job, kept, verdict, reason, backfill=True, gpus=gpus)
            return Step.NEXT
        if self._may_loan(job):
            reason = sized(reasons.admitted_on_loan(res.job_id))
            self._admit(
                job, placement, verdict, reason, backfill=True, loan_for=res.job_id, gpus=gpus
            )
            return Step.NEXT  # a loan's GPUs come back to the reservation: its spare stands
        self.reasons[job.id] = reasons.would_delay(res.job_id)
        if job.estimate_s is None and not self.policy.loan_backfill:
            return Step.SKIP  # the rest of the group has the same shape (and no estimate)
        # With loans, the refusal may be this job's own (its save, its last preemption).
        return self._deeper(depth, gkey)

    def _blocked(self, job: Job, verdict: QuotaVerdict) -> Step:
        """`job` does not fit now: move, preempt, reserve or wait (3 and 4)."""
        if (
            self.plans_left > 0
            and job.id not in self.st.nominated
            and (self._maybe_move(job) or self._maybe_preempt(job, verdict))
        ):
            return Step.SKIP
        if self.policy.head_of_line:
            self.reasons[job.id] = self._blocked_reason(job, verdict)
            return Step.STOP
        if (
            self.policy.backfill
            and self.config.policy.backfill
            and self.reservation is None
            and (
                not self.policy.reserve_only_starving
                or (verdict is not QuotaVerdict.BORROWING and self.order.starving(job))
            )
        ):
            self._reserve(job, verdict)
            return Step.SKIP
        self.reasons[job.id] = self._blocked_reason(job, verdict)
        return Step.SKIP

    def _quota(self, job: Job) -> QuotaVerdict:
        if not self.policy.quotas:
            return QuotaVerdict.WITHIN_NOMINAL
        return check_quota(self.st.queues[job.queue], self.ledger.alloc[job.queue], job.request)

    def _blocked_reason(self, job: Job, verdict: QuotaVerdict) -> str:
        return reasons.blocked(
            job,
            verdict,
            nominal_gpus=self.st.queues[job.queue].nominal.gpus,
            free_gpus=max(0, int(self.ledger.free.gpus)),
            nodes=self.ledger.pool is not None,
        )

    # --- 5. beyond the borrowing limit ---------------------------------------------------------

    def _beyond_limit(self) -> None:
        policy = self.policy
        if not (policy.beyond_limit and policy.quotas and self.config.policy.beyond_limit):
            return
        for gkey in self.over_limit:
            for job in self.st.groups[gkey].jobs:
                if self.ledger.free.gpus <= 0:
                    return
                if job.id in self.started or job.id in self.st.nominated:
                    continue
                if not self._may_lend(job):
                    continue
                placement = self.ledger.place(job.request)
                if placement is None:
                    break  # the rest of the group has the same shape
                res = self.reservation
                loan_for = None
                if res is not None:
                    kept = self._backfill_placement(job, placement, res)
                    if kept is None:
                        loan_for = res.job_id  # saves on notice: may go on loan (`_may_loan`)
                    else:
                        placement = kept
                queue = self.st.queues[job.queue]
                reason = reasons.admitted_beyond_limit(job, queue, loan_for)
                verdict = QuotaVerdict.BORROWING
                self._admit(
                    job, placement, verdict, reason, backfill=res is not None, loan_for=loan_for
                )

    def _may_lend(self, job: Job) -> bool:
        """Whether `job` may run beyond its queue's limit: taking it back costs a save and a
        restore, it was not preempted within the cooldown, and no patient reclaim counts on
        its queue's jobs being quicker to save."""
        if not saves_within_grace(job, self.policy, self.config.preemption):
            return False
        if in_cooldown(job, self.now, self.config.preemption):
            return False
        patience = self.patience
        return patience is None or patience.blocks_borrower(job, QuotaVerdict.BORROWING) is None

    # --- admission and backfill ---------------------------------------------------------------

    def _admit(
        self,
        job: Job,
        placement: Placement,
        verdict: QuotaVerdict,
        reason: str,
        *,
        backfill: bool = False,
        loan_for: str | None = None,
        gpus: int | None = None,
    ) -> None:
        """Admit `job` (at `gpus`: then `job` is the elastic job at that size)."""
        self.ledger.admit(job, placement)
        self.order.changed(job.queue)
        self.search.forget_eligible()
        self.started.add(job.id)
        if self.patience is not None:
            self.patience.note_admitted(job)
        end = self.now + job.expected_runtime_s(self.config.policy.default_estimate_s)
        self.started_ends.append(Started(end, job.request, placement))
        self.reasons.pop(job.id, None)
        self.admits.append(
            Admit(
                job_id=job.id,
                placement=placement,
                borrowing=verdict is QuotaVerdict.BORROWING,
                backfill=backfill,
                loan_for=loan_for,
                reason=reason,
                gpus=gpus,
            )
        )

    def _backfill_placement(
        self, job: Job, placement: Placement, res: Reservation
    ) -> Placement | None:
        """Where `job` may start without delaying the reservation: its best-fit `placement`,
        else off the nodes the reservation holds, else nowhere (None)."""
        estimate = self.config.policy.default_estimate_s
        if may_backfill(job, placement, res, now=self.now, default_estimate_s=estimate):
            return placement
        pool = self.ledger.pool
        if not res.node_spare or pool is None:
            return None
        elsewhere = pool.find(int(job.request.gpus), avoid=res.node_spare)
        if elsewhere is None:
            return None
        if may_backfill(job, elsewhere, res, now=self.now, default_estimate_s=estimate):
            return elsewhere
        return None

    def _may_loan(self, job: Job) -> bool:
        """Whether `job` may start on loan ahead of the reservation: it saves on notice within
        its grace (so taking it back costs a save and a restore) and was not preempted within
        the cooldown."""
        if not self.policy.loan_backfill:
            return False
        if not saves_within_grace(job, self.policy, self.config.preemption):
            return False
        return not in_cooldown(job, self.now, self.config.preemption)

    def _reserve(self, job: Job, verdict: QuotaVerdict) -> None:
        ledger = self.ledger
        due = loans_due(
            job,
            now=self.now,
            state=self.st,
            alloc=ledger.alloc,
            leaving=ledger.leaving,
            policy=self.policy,
            settings=self.config.preemption,
        )
        res = plan_reservation(
            job,
            now=self.now,
            state=self.st,
            free=ledger.free,
            pool=ledger.pool,
            also_running=self.started_ends,
            loans_due=due,
        )
        res.borrowing = self.policy.quotas and verdict is QuotaVerdict.BORROWING
        self.reservation = res
        reason = reasons.reserved(self._blocked_reason(job, verdict), res.start_at, self.now)
        self.reasons[job.id] = reason
        self.reserves.append(Reserve(job_id=job.id, start_at=res.start_at, reason=reason))

    # --- preemption and moves -----------------------------------------------------------------

    def _maybe_preempt(self, job: Job, verdict: QuotaVerdict) -> bool:
        """Search victims for `job` and send their notices; True when `job` is handled (it
        waits for victims, or for capacity that is being freed anyway)."""
        key = SearchKey(job.queue, job.tier.rank, job.request.gpus)
        # The first blocked job holds the reservation: it may take back what was lent ahead of it.
        take_loans = (
            self.policy.loan_backfill and self.reservation is None and job.id in self.st.loans
        )
        # Backing off is for tier preemption only: a job within nominal quota must be able to
        # reclaim as soon as capacity it is owed is held by borrowers (the nominal guarantee),
        # and the reserved job must get its loans back as soon as they have run long enough.
        guaranteed = self.policy.reclaim and verdict is QuotaVerdict.WITHIN_NOMINAL
        backed_off = not guaranteed and self.st.preemption_backoff.get(key, -INF) > self.now
        smaller_failed = any(  # a smaller job of this kind found nothing in this cycle
            f.queue == key.queue and f.tier_rank == key.tier_rank and f.gpus <= key.gpus
            for f in self.failed_here
        )
        loans_only = backed_off or smaller_failed
        if loans_only and not take_loans:
            return False
        if self.policy.anti_thrashing and 0 < job.request.gpus <= self.incoming:
            # Capacity already being freed by earlier preemptions covers it: do not preempt more.
            self.incoming -= job.request.gpus
            self.reasons[job.id] = reasons.CAPACITY_INCOMING
            return True
        self.plans_left -= 1
        plan = self.search.find(job, take_loans=take_loans, tier=not loans_only)
        if plan is None:
            self.failed_here.append(key)
            if guaranteed:
                self.rerun = True  # the borrowers it is owed may be among this cycle's admits
            elif not loans_only:
                self.failed.append(key)
            return False
        if self.patience is not None and (why := self.patience.waits(job, plan)):
            self.reasons[job.id] = why  # patient reclaim (`patience.py`)
            return True
        self._notify_victims(job, plan)
        return True

    def _notify_victims(self, job: Job, plan: VictimPlan) -> None:
        """Send `plan`'s victims their notices and hold what they free for `job`."""
        names, shrunk = [], []
        for v in plan.victims:
            vjob = v.running.job
            if v.gpus_after is not None:
                self._shrink(job, plan, v)
                shrunk.append(vjob.id)
                continue
            self.search.take(vjob)
            self.ledger.leave(v.running, v.leaves())
            names.append(vjob.id)
            reason = reasons.preempted(
                vjob,
                v.kind,
                job,
                min_runtime=self.policy.protect_min_runtime,
                lost_gpu_s=v.lost_gpu_s,
            )
            if plan.shrink_lost_gpu_s is not None:
                reason = reasons.evicted_over_shrink(
                    reason, plan.shrink_lost_gpu_s, plan.lost_gpu_s
                )
            if v.shrinking_to is not None:
                reason = reasons.evicted_while_shrinking(reason, v.shrinking_to)
            self.preempts.append(
                Preempt(
                    job_id=vjob.id,
                    grace_s=v.grace_s,
                    for_job=job.id,
                    lost_gpu_s=v.lost_gpu_s,
                    kind=v.kind,
                    for_nodes=plan.placement or (),
                    reason=reason,
                )
            )
        # Victims chosen: the queue budgets and what each queue borrows have changed.
        self.search.forget_eligible()
        freed = sum(v.leaves().gpus for v in plan.victims)
        self.incoming += max(0, freed + max(0, int(self.ledger.free.gpus)) - job.request.gpus)
        self._hold(job, plan.placement or ())
        if shrunk:
            self.reasons[job.id] = reasons.making_room(names, shrunk)
        else:
            self.reasons[job.id] = reasons.preempting(names)

    def _shrink(self, job: Job, plan: VictimPlan, v: Victim) -> None:
        """Shrink the elastic victim `v` for `job` instead of evicting it."""
        rj, gpus_after = v.running, v.gpus_after
        assert gpus_after is not None
        vjob = rj.job
        self.search.take(vjob, budget=False)
        self.ledger.leave(rj, rj.held - vjob.at_size(gpus_after))
        reason = reasons.shrunk(
            vjob,
            rj.size,
            gpus_after,
            v.kind,
            job,
            lost_gpu_s=v.lost_gpu_s,
            plan_lost_gpu_s=plan.lost_gpu_s,
            evict_lost_gpu_s=plan.evict_lost_gpu_s,
            by_priority=self.elastic is ElasticMode.PRIORITY,
        )
        self.resizes.append(
            Resize(
                job_id=vjob.id,
                gpus=gpus_after,
                grace_s=v.grace_s,
                kind="shrink",
                for_job=job.id,
                lost_gpu_s=v.lost_gpu_s,
                placement=elastic.kept(rj, gpus_after),
                for_nodes=plan.placement or (),
                reason=reason,
            )
        )

    # --- 6. grow ------------------------------------------------------------------------------

    def _grow(self) -> None:
        """Give GPUs nobody pending can use to shrunk elastic jobs, when the rest of their
        run pays for the resize (priced) or whenever they idle (priority)."""
        if self.elastic is ElasticMode.OFF or self.reservation is not None:
            return
        if self.ledger.free.gpus <= 0 or self._pending_could_use():
            return
        st = self.st
        shrunk = [
            rj
            for rj in st.running.values()
            if rj.gpus is not None
            and rj.size < rj.job.request.gpus
            and not rj.terminating
            and rj.job.id not in st.shrinking
            and rj.job.id not in self.search.taken
        ]
        shrunk.sort(key=lambda r: (-r.job.tier.rank, r.size / r.job.request.gpus, r.started_at))
        for rj in shrunk:
            if self.ledger.free.gpus <= 0:
                return
            if may_resize(rj.job, self.now, self.config.policy):
                self._maybe_grow(rj)
            else:
                at = next_resize_at(rj.job, self.config.policy)
                self.grow_at = at if self.grow_at is None else min(self.grow_at, at)

    def _maybe_grow(self, rj: RunningJob) -> None:
        job, ledger, policy = rj.job, self.ledger, self.config.policy
        grace = victim_grace_s(job, self.policy, self.config.preemption)
        priced = self.elastic is ElasticMode.PRICED
        for gpus in larger_sizes(rj):
            extra = job.at_size(gpus) - rj.held
            if not ledger.fits_by_count(extra):
                continue
            verdict = QuotaVerdict.WITHIN_NOMINAL
            if self.policy.quotas:
                verdict = check_quota(self.st.queues[job.queue], ledger.alloc[job.queue], extra)
                if verdict is QuotaVerdict.OVER_LIMIT:
                    continue
            on = self._grow_on(rj, extra.gpus)
            if on is None:
                continue
            price = grow_price(
                rj,
                gpus,
                now=self.now,
                grace_s=grace,
                idle_s=self._idle_horizon_s(rj, extra.gpus) if priced else INF,
                reclaimable=(
                    verdict is QuotaVerdict.BORROWING
                    and self._owed_elsewhere(job.queue) > ledger.free.gpus - extra.gpus
                ),
                policy=policy,
                settings=self.config.preemption,
            )
            if priced and not price.pays:
                continue
            ledger.grow(rj, extra, on)
            self.order.changed(job.queue)
            self.search.forget_eligible()
            self.search.take(job, budget=False)
            merged = dict(rj.placement)
            for node, g in on:
                merged[node] = merged.get(node, 0) + g
            self.resizes.append(
                Resize(
                    job_id=job.id,
                    gpus=gpus,
                    grace_s=grace,
                    kind="grow",
                    lost_gpu_s=price.resize_gpu_s,
                    placement=tuple(sorted(merged.items())),
                    reason=reasons.grown(job, rj.size, gpus, price, by_priority=not priced),
                )
            )
            return

    def _idle_horizon_s(self, rj: RunningJob, extra_gpus: float) -> float:
        """How long `extra_gpus` of what is free now are expected to stay unwanted
        (`elastic.idle_horizon_s`): pending jobs the walk did not start and their quota allows,
        each at its smallest size, and new jobs at the rate the jobs still here arrived over
        the last `default_estimate` (not counting `rj` itself: its demand is what the grow
        serves), against the running jobs' expected ends."""
        st = self.st
        needs = []
        for group in st.groups.values():
            job = next((j for j in group.jobs if j.id not in self.started), None)
            if job is None or self._quota(job) is QuotaVerdict.OVER_LIMIT:
                continue
            needs.append(job.at_size(job.sizes()[-1]).gpus)
        window = self.config.policy.default_estimate_s
        since = self.now - window
        if self.arrived_gpus is None:
            jobs = [*st.pending.values(), *(r.job for r in st.running.values())]
            self.arrived_gpus = sum(j.request.gpus for j in jobs if j.submitted_at > since)
        own = rj.job.request.gpus if rj.job.submitted_at > since else 0
        rate = (self.arrived_gpus - own) / window if window > 0 else 0.0
        running = st.running
        return idle_horizon_s(
            self.ledger.free.gpus,
            extra_gpus,
            needs=needs,
            ends=[(at, running[j].held.gpus) for at, j in st.ends if j in running],
            arrivals_gpus_per_s=rate,
            now=self.now,
        )

    def _owed_elsewhere(self, queue: str) -> float:
        """GPUs the other queues' nominal quotas promise and they do not hold: what their
        next jobs may reclaim from borrowers."""
        total = self.st.cluster.gpus
        return sum(
            min(total, max(0.0, q.nominal.gpus - self.ledger.alloc[q.name].gpus))
            for q in self.st.queues.values()
            if q.name != queue
        )

    def _grow_on(self, rj: RunningJob, extra: int) -> Placement | None:
        """Where `rj` may take `extra` GPUs: on the nodes it holds first, then on the emptiest
        other nodes (it restarts anyway); () on a flat pool; None when too few are free."""
        pool = self.ledger.pool
        if pool is None:
            return ()
        own = [node for node, _ in rj.placement]
        others = sorted(
            (n for n in range(len(pool.free)) if n not in own and pool.free[n] > 0),
            key=lambda n: (-pool.free[n], n),
        )
        on = []
        for node in (*own, *others):
            take = min(pool.free[node], extra)
            if take > 0:
                on.append((node, take))
                extra -= take
            if extra <= 0:
                return tuple(on)
        return None

    def _pending_could_use(self) -> bool:
        """Whether a pending job the cycle did not start fits in what is free and its quota:
        then free GPUs are its to take (next cycle, or once its own wait ends), not a grow's."""
        for group in self.st.groups.values():
            job = next((j for j in group.jobs if j.id not in self.started), None)
            if job is None:
                continue
            need = job.request if self.elastic is ElasticMode.OFF else job.at_size(job.sizes()[-1])
            if not self.ledger.fits_by_count(need):
                continue
            if self._quota(job) is not QuotaVerdict.OVER_LIMIT:
                return True
        return False

    def _maybe_move(self, job: Job) -> bool:
        """Move small jobs off a node for a job ahead of any reservation that fits by count
        alone (`defrag.py`)."""
        if not (self.policy.defragment and self.config.policy.defragment):
            return False
        pool = self.ledger.pool
        if pool is None or self.reservation is not None:
            return False
        if not self.ledger.fits_by_count(job.request):
            return False
        if job.request.gpus <= self.incoming:
            return False  # preempted jobs are about to free as much: their nodes may do
        plan = find_moves(
            job,
            now=self.now,
            state=self.st,
            pool=pool,
            policy=self.policy,
            settings=self.config.preemption,
            taken=self.search.taken,
            budget_used=self.search.budget_used,
            movers=self.movers,
        )
        if plan is None:
            return False  # a search that finds nothing costs no plan: the job may still preempt
        self.plans_left -= 1
        self._notify_movers(job, plan)
        return True

    def _notify_movers(self, job: Job, plan: MovePlan) -> None:
        """Send the moved jobs their notices and hold their new places and `job`'s block."""
        for move in plan.moves:
            vjob = move.running.job
            self.search.take(vjob)
            self.preempts.append(
                Preempt(
                    job_id=vjob.id,
                    grace_s=move.grace_s,
                    for_job=job.id,
                    lost_gpu_s=move.lost_gpu_s,
                    kind="move",
                    for_nodes=plan.placement,
                    restart_on=move.restart_on,
                    reason=reasons.moved(job, move.restart_on, move.lost_gpu_s),
                )
            )
            self._hold_nodes(move.restart_on)
        self.search.forget_eligible()
        self._hold_nodes(plan.placement)  # the rest of its block is the moved jobs' GPUs
        self.reasons[job.id] = reasons.moving(m.running.job.id for m in plan.moves)

    # --- holds --------------------------------------------------------------------------------

    def _hold(self, job: Job, nodes: Placement) -> None:
        """Hold what is free now for a preemptor, by count and on the nodes its victims free,
        so that nobody else takes it before they exit. By count, GPUs free on other nodes wait
        too, for one grace at most (`docs/internals/nominated-first.md` says why not only the
        nodes' GPUs)."""
        self.ledger.hold(job.request)
        if self.ledger.pool is not None and nodes:
            self._take_free_on(nodes)

    def _hold_nodes(self, nodes: Placement) -> None:
        """Hold the GPUs free now on `nodes` (for a move), by count exactly what is taken: the
        rest of the block is GPUs that moved jobs still hold, which no one else can take."""
        held = self._take_free_on(nodes)
        self.ledger.free.gpus -= sum(g for _, g in held)

    def _take_free_on(self, nodes: Placement) -> Placement:
        """Take from the pool what is free now of `nodes`; returns what was taken."""
        held = self.ledger.hold_free_on(nodes)
        self._use_held_nodes(held)
        return held

    def _use_held_nodes(self, placement: Placement) -> None:
        """GPUs taken for good on the reservation's nodes without its consent (work within
        nominal quota past a borrower's reservation, a preemptor's hold) are no longer spare."""
        if self.reservation is not None:
            self.reservation.consume(placement)

    def _fragmentation(self) -> float:
        pool = self.ledger.pool
        if pool is None:
            return 0.0
        shapes = {key[2] for key, group in self.st.groups.items() if group.jobs}
        return pool.fragmentation(shapes)
