"""One scheduling cycle: a snapshot and the current time in, decisions with reasons out.

Phases, as in kueue's `schedule()`:

1. Nominated jobs first: a job whose victims were told to go in an earlier cycle gets the
   freed capacity before anyone else, so capacity freed by preemption cannot be taken by a third
   job (the root of preemption loops). While it waits, the free capacity it counted on is held;
   so is the new place of a moved job, from its notice until it restarts there.
   One that would now borrow, while other queues' work within nominal quota waits, takes its
   turn in the walk instead (it would be reclaimed at once); a moved job, which only changes
   node, does not.
2. Walk pending jobs in policy order by merging the heads of the pending groups (see
   `state.py`); fair-share keys are refreshed lazily when a queue's allocation changes.
3. For each job: quota check (within nominal, borrowing, or over the limit); capacity and
   placement check; if it fits, admit it (as backfill when a reservation exists and it does not
   delay it, or on loan when it would but checkpoints on notice: the reserved job may preempt it
   later). If it does not fit, a job ahead of any reservation that fits by count, only not on
   one node block, may move a few small jobs to other nodes (`defrag.py`); else try preemption
   (reclaim, lower tier, or, for the job the
   reservation is for, loans; a first reclaim waits for capacity to free on its own while the
   one-grace guarantee allows, `patience.py`); failing that, a strict
   policy stops here, a backfilling one reserves capacity for this job and continues with the
   rest, and the others skip the job's group.
4. Stop early when nothing is free and nothing can be preempted: the rest wait for capacity.

Ordering criteria, in order (policy `preemptible`):
    1. tier, higher first; a borrower is ordered after other queues' pending work within
       their nominal quota of its own tier, and in the lowest tier of such work when that is
       lower than its own (`nominal_first`): that work would reclaim whatever the borrower
       got. A queue's own work never demotes its borrowers (within a queue, age decides);
    2. fair-share value of the job's queue (1.0 = exactly its weighted share) minus waiting
       time / `aging` (one `aging` of waiting is worth one fair-share unit), capped at
       `aging_max_units`: once every queue's head has waited that long, fair share alone
       decides, so saturated queues still converge to their weights. A job that has waited
       past the cap while its queue is below its fair share (value < 1), or past the
       `starvation_limit` whatever its queue's share, is starving: it goes first in its tier,
       oldest first, and so gets the backfill reservation;
    3. submission time, then job id (stable tie-break).

Nothing here reads a clock, does I/O or mutates the snapshot: the shell applies the decisions.
"""

from __future__ import annotations

import heapq

from preemptible.queue.core.backfill import (
    Reservation,
    Started,
    may_backfill,
    plan_reservation,
)
from preemptible.queue.core.config import QueueConfig
from preemptible.queue.core.defrag import find_moves
from preemptible.queue.core.fair_share import dominant_share, fair_share_value, weight_fractions
from preemptible.queue.core.model import (
    Admit,
    CycleResult,
    Job,
    Preempt,
    Reserve,
    RunningJob,
    Tier,
)
from preemptible.queue.core.patience import BORROWER_BLOCKED, ReclaimPatience
from preemptible.queue.core.placement import Placement
from preemptible.queue.core.policy import Ordering, Policy
from preemptible.queue.core.preemption import (
    find_victims,
    in_cooldown,
    loans_due,
    saves_within_grace,
)
from preemptible.queue.core.quota import QuotaVerdict, check_quota, describe_limit, is_borrowing
from preemptible.queue.core.state import GroupKey, Snapshot

INF = float("inf")
_SLURM_AGE_MAX_S = 7 * 86400.0
_STARVING = -1e15
_NO_RECLAIMER = max(t.rank for t in Tier) + 1
"""`reclaimer_rank` of a queue when no other queue has pending work within nominal quota."""


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
        st = snapshot.state
        self.st = st
        self.now = now
        self.policy = policy
        self.config = config
        self.cluster = st.cluster
        self.usage = snapshot.usage
        cl = st.cluster
        self.free = [
            cl.gpus - st.used[0],
            (cl.cpus - st.used[1]) if cl.cpus else INF,
            (cl.memory_gb - st.used[2]) if cl.memory_gb else INF,
        ]
        self.alloc = {name: list(a) for name, a in st.alloc.items()}
        self.pool = st.pool.copy() if st.pool is not None else None
        self.weights = weight_fractions(st.queues.values())
        self.version = dict.fromkeys(st.queues, 0)
        self.admits: list[Admit] = []
        self.preempts: list[Preempt] = []
        self.reserves: list[Reserve] = []
        self.reasons: dict[str, str] = {}
        self.started: set[str] = set()
        self.started_ends: list[Started] = []
        self.taken: set[str] = set()
        self.leaving = {name: list(amounts) for name, amounts in st.leaving.items()}
        """Per queue: held by jobs told to go, before this cycle or by it."""
        self.budget_used: dict[str, int] = {}
        self.reservation: Reservation | None = None
        self.plans_left = policy.max_preemption_plans if config.preemption.enabled else 0
        self.examined = 0
        self.default_reason = "pending: waiting for its turn"
        self.fs_cache: dict[str, float] = {}
        units = ((1, 0, 0), (0, 1, 0), (0, 0, 1))
        self.step_share = next((x for u in units if (x := dominant_share(*u, cl))), 0.0)
        """Dominant share of one GPU (else one CPU, else 1 GB): the "after" step."""
        self.failed: list[tuple[str, int, int]] = []
        self.cost_cache: dict[str, tuple[tuple, float, float]] = {}
        self.rerun = False
        self.patience = (
            ReclaimPatience(
                state=st, alloc=self.alloc, policy=policy, settings=config.preemption, now=now
            )
            if policy.patient_reclaim
            else None
        )
        window = config.preemption.nomination_window_s
        claimed = sum(
            st.pending[j].request.gpus
            for j, at in st.nominated.items()
            if j in st.pending and now - at <= window
        )
        self.incoming = max(0, st.terminating_gpus - claimed)
        """GPUs that preempted jobs will free soon and no nominated job has claimed."""
        self.failed_here: list[tuple[str, int, int]] = []
        """Failed victim searches of this cycle (for any reason); `failed` is what backs off."""
        self.candidate_cache: dict[tuple, list] = {}
        self.movers: dict[int, list[RunningJob]] = {}
        """Per node, the jobs there that could move (`defrag.find_moves`), found once a cycle:
        the state, the time and the settings do not change within one."""
        self.reclaimer_rank = self._reclaimer_ranks()
        """Per queue, the lowest tier of other queues' pending work within nominal quota: a
        borrower of this tier or a higher one is ordered in this tier after that work, which
        would reclaim whatever it is given."""

    # --- orchestration ------------------------------------------------------------------------

    def run(self) -> CycleResult:
        self._nominated_first()
        self._walk()
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
            wake_at=self.patience.wake_at if self.patience is not None else None,
        )

    def _nominated_first(self) -> None:
        st = self.st
        window = self.config.preemption.nomination_window_s
        live = [job_id for job_id, at in st.nominated.items() if self.now - at <= window]
        # Oldest first, but moved jobs before the rest: each restarts on, or keeps holding, the
        # place held for it since its notice, which no other nominee's best fit may take.
        for job_id in sorted(live, key=lambda j: j not in st.moving):
            if self.free[0] <= 0:
                break  # nothing to admit or hold; later cycles will see the freed capacity
            job = st.pending.get(job_id)
            moving = job_id in st.moving
            if job is None:
                running = st.running.get(job_id)
                if moving and running is not None:  # still saving: its new place waits for it
                    self._hold_nodes(st.nominated_nodes.get(job_id, ()))
                continue
            self.examined += 1
            verdict = self._quota(job)
            if verdict is QuotaVerdict.OVER_LIMIT:
                continue
            if (
                verdict is QuotaVerdict.BORROWING
                and not moving  # a moved job only changes node
                and self.reclaimer_rank[job.queue] < _NO_RECLAIMER
            ):
                # Its queue filled its nominal quota meanwhile: started now it would borrow, and
                # other queues' pending work within nominal quota would reclaim it at once (and
                # it, requeued, would reclaim back). It takes its turn in the walk instead.
                continue
            placement = self._place(job, on=st.nominated_nodes.get(job_id) if moving else None)
            if placement is not None:
                self._admit(job, placement, verdict, "admitted: capacity freed by preemption")
            else:
                self.reasons[job_id] = "pending: waiting for the jobs preempted for it to exit"
                self.started.add(job_id)  # handled: the walk must not preempt again for it
                self._hold(job, st.nominated_nodes.get(job_id, ()))

    def _walk(self) -> None:
        st = self.st
        can_preempt = self._preemption_possible()
        if not st.groups or (self.free[0] <= 0 and not can_preempt):
            self.default_reason = "pending: no free GPUs and nothing it may preempt"
            return
        heap: list[tuple] = []
        pos: dict[GroupKey, int] = {}
        for gkey, group in st.groups.items():
            pos[gkey] = 0
            heap.append(self._entry(group.jobs[0], gkey))
        heapq.heapify(heap)
        depth: dict[GroupKey, int] = {}
        while heap:
            if self.free[0] <= 0 and not (can_preempt and self.plans_left > 0):
                if self.reservation is None:
                    self.default_reason = "pending: no free GPUs and nothing it may preempt"
                break
            entry = heapq.heappop(heap)
            gkey = entry[-2]
            job = st.groups[gkey].jobs[pos[gkey]]
            if entry[-1] != self.version[job.queue]:
                heapq.heappush(heap, self._entry(job, gkey))
                continue
            outcome = self._consider(job, depth, gkey)
            if outcome == "stop":
                self.default_reason = f"pending: behind the blocked head job {job.id} (strict)"
                break
            if outcome == "next":
                jobs = st.groups[gkey].jobs
                i = pos[gkey] + 1
                while i < len(jobs) and jobs[i].id in self.started:
                    i += 1
                if i < len(jobs):
                    pos[gkey] = i
                    heapq.heappush(heap, self._entry(jobs[i], gkey))
            # "skip": the whole group waits (same shape, same queue: same verdict)

    # --- one job ------------------------------------------------------------------------------

    def _consider(self, job: Job, depth: dict[GroupKey, int], gkey: GroupKey) -> str:
        if job.id in self.started:
            return "next"
        self.examined += 1
        verdict = self._quota(job)
        if verdict is QuotaVerdict.OVER_LIMIT:
            queue = self.st.queues[job.queue]
            self.reasons[job.id] = (
                f"pending: {job.queue} would exceed its quota ({describe_limit(queue)})"
            )
            return "stop" if self.policy.head_of_line else "skip"
        placement = self._place(job)
        blocked = None
        if placement is not None and self.patience is not None:
            blocked = self.patience.blocks_borrower(job, verdict)
        if blocked is not None:
            self.reasons[job.id] = BORROWER_BLOCKED
            if blocked == "queue":
                return "skip"  # its queue's jobs are too slow to save: the whole group waits
            depth[gkey] = depth.get(gkey, 0) + 1  # its own save: the next one may be quicker
            return "next" if depth[gkey] < self.config.policy.backfill_depth else "skip"
        if placement is not None:
            res = self.reservation
            if res is None or (
                res.borrowing and verdict is QuotaVerdict.WITHIN_NOMINAL and job.queue != res.queue
            ):
                self._admit(job, placement, verdict, self._admit_reason(job, verdict))
                self._use_held_nodes(placement)
                return "next"
            settings = self.config.policy
            kept = self._backfill_placement(job, placement, res)
            if kept is not None:
                head = res.job_id
                self._admit(
                    job,
                    kept,
                    verdict,
                    f"admitted by backfill: does not delay {head}",
                    backfill=True,
                )
                return "next"
            if self._may_loan(job):
                head = res.job_id
                self._admit(
                    job,
                    placement,
                    verdict,
                    f"admitted on loan: may delay {head}, which may preempt it once it has run "
                    "its minimum runtime",
                    backfill=True,
                    loan_for=head,
                )
                return "next"  # a loan's GPUs come back to the reservation: its spare stands
            self.reasons[job.id] = f"pending: would delay the reservation of {res.job_id}"
            if job.estimate_s is None and not self.policy.loan_backfill:
                return "skip"  # the rest of the group has the same shape (and no estimate)
            # With loans, the refusal may be this job's own (its save, its last preemption).
            depth[gkey] = depth.get(gkey, 0) + 1
            return "next" if depth[gkey] < settings.backfill_depth else "skip"
        # It does not fit now.
        if (
            self.plans_left > 0
            and job.id not in self.st.nominated
            and (self._maybe_move(job) or self._maybe_preempt(job, verdict))
        ):
            return "skip"
        if self.policy.head_of_line:
            self.reasons[job.id] = self._blocked_reason(job, verdict)
            return "stop"
        if (
            self.policy.backfill
            and self.config.policy.backfill
            and self.reservation is None
            and (
                not self.policy.reserve_only_starving
                or (verdict is not QuotaVerdict.BORROWING and self._starving(job))
            )
        ):
            self._reserve(job, verdict)
            return "skip"
        self.reasons[job.id] = self._blocked_reason(job, verdict)
        return "skip"

    def _quota(self, job: Job) -> QuotaVerdict:
        if not self.policy.quotas:
            return QuotaVerdict.WITHIN_NOMINAL
        return check_quota(self.st.queues[job.queue], self.alloc[job.queue], job.request.as_tuple())

    def _place(self, job: Job, *, on: Placement | None = None) -> Placement | None:
        """Where `job` fits now: best fit, or `on` (a moved job's new place) while it is free."""
        if not self._fits_by_count(job):
            return None
        if self.pool is None:
            return ()
        if on and all(self.pool.free[n] >= g for n, g in on):
            return on
        return self.pool.find(int(job.request.gpus))

    def _fits_by_count(self, job: Job) -> bool:
        """Whether `job` fits in what is free now, GPUs, CPUs and memory, wherever it is."""
        req = job.request.as_tuple()
        free = self.free
        return not (req[0] > free[0] or req[1] > free[1] + 1e-9 or req[2] > free[2] + 1e-9)

    def _backfill_placement(
        self, job: Job, placement: Placement, res: Reservation
    ) -> Placement | None:
        """Where `job` may start without delaying the reservation: its best-fit `placement`,
        else off the nodes the reservation holds, else nowhere (None)."""
        estimate = self.config.policy.default_estimate_s
        if may_backfill(job, placement, res, now=self.now, default_estimate_s=estimate):
            return placement
        if not res.node_spare or self.pool is None:
            return None
        elsewhere = self.pool.find(int(job.request.gpus), avoid=res.node_spare)
        if elsewhere is None:
            return None
        if may_backfill(job, elsewhere, res, now=self.now, default_estimate_s=estimate):
            return elsewhere
        return None

    def _use_held_nodes(self, placement: Placement) -> None:
        """GPUs taken for good on the reservation's nodes without its consent (work within
        nominal quota past a borrower's reservation, a preemptor's hold) are no longer spare."""
        if self.reservation is not None:
            self.reservation.consume(placement)

    def _admit(
        self,
        job: Job,
        placement: Placement,
        verdict: QuotaVerdict,
        reason: str,
        *,
        backfill: bool = False,
        loan_for: str | None = None,
    ) -> None:
        req = job.request.as_tuple()
        a = self.alloc[job.queue]
        for i in range(3):
            self.free[i] -= req[i]
            a[i] += req[i]
        if self.pool is not None:
            self.pool.take(placement)
        self.version[job.queue] += 1
        self.fs_cache.pop(job.queue, None)
        self.candidate_cache.clear()
        self.started.add(job.id)
        if self.patience is not None:
            self.patience.note_admitted(job)
        end = self.now + job.expected_runtime_s(self.config.policy.default_estimate_s)
        self.started_ends.append((end, req, placement))
        self.reasons.pop(job.id, None)
        self.admits.append(
            Admit(
                job_id=job.id,
                placement=placement,
                borrowing=verdict is QuotaVerdict.BORROWING,
                backfill=backfill,
                loan_for=loan_for,
                reason=reason,
            )
        )

    def _may_loan(self, job: Job) -> bool:
        """Whether `job` may start on loan ahead of the reservation: it saves on notice within
        its grace (so taking it back costs a save and a restore) and was not preempted within
        the cooldown."""
        if not self.policy.loan_backfill:
            return False
        if not saves_within_grace(job, self.policy, self.config.preemption):
            return False
        return not in_cooldown(job, self.now, self.config.preemption)

    def _admit_reason(self, job: Job, verdict: QuotaVerdict) -> str:
        if not self.policy.quotas:
            return "admitted: capacity free"
        if verdict is QuotaVerdict.BORROWING:
            return f"admitted: {job.queue} borrows idle capacity (reclaimable)"
        return f"admitted: within {job.queue}'s nominal quota"

    def _blocked_reason(self, job: Job, verdict: QuotaVerdict) -> str:
        g = job.request.gpus
        free = max(0, int(self.free[0]))
        nominal = self.st.queues[job.queue].nominal.gpus
        if verdict is QuotaVerdict.BORROWING and g > nominal:
            head = (
                f"pending: larger than {job.queue}'s nominal quota ({nominal:g} GPUs), so it can "
                "run only on borrowed capacity, and too little is idle"
            )
        elif verdict is QuotaVerdict.BORROWING:
            head = f"pending: {job.queue} over quota and no idle capacity to borrow"
        else:
            head = "pending: no free capacity"
        detail = f"needs {g} GPUs, {free} free"
        if self.pool is not None and free >= g:
            detail += "; no node block fits it (fragmented)"
        return f"{head} ({detail})"

    def _reserve(self, job: Job, verdict: QuotaVerdict) -> None:
        res = plan_reservation(
            job,
            now=self.now,
            state=self.st,
            free=self.free,
            pool=self.pool,
            also_running=self.started_ends,
            loans_due=loans_due(
                job,
                now=self.now,
                state=self.st,
                alloc=self.alloc,
                leaving=self.leaving,
                policy=self.policy,
                settings=self.config.preemption,
            ),
        )
        res.borrowing = self.policy.quotas and verdict is QuotaVerdict.BORROWING
        self.reservation = res
        when = "unknown" if res.start_at == INF else f"t={res.start_at:.0f}s"
        reason = (
            f"{self._blocked_reason(job, verdict)}; first in line, so capacity is reserved "
            f"from {when} and smaller jobs backfill only if they do not delay it"
        )
        self.reasons[job.id] = reason
        self.reserves.append(Reserve(job_id=job.id, start_at=res.start_at, reason=reason))

    def _maybe_preempt(self, job: Job, verdict: QuotaVerdict) -> bool:
        key = (job.queue, job.tier.rank, job.request.gpus)
        # The first blocked job holds the reservation: it may take back what was lent ahead of it.
        take_loans = (
            self.policy.loan_backfill and self.reservation is None and job.id in self.st.loans
        )
        # Backing off is for tier preemption only: a job within nominal quota must be able to
        # reclaim as soon as capacity it is owed is held by borrowers (the one-grace guarantee),
        # and the reserved job must get its loans back as soon as they have run long enough.
        guaranteed = self.policy.reclaim and verdict is QuotaVerdict.WITHIN_NOMINAL
        backed_off = not guaranteed and self.st.preemption_backoff.get(key, -INF) > self.now
        smaller_failed = any(  # a smaller job of this kind found nothing in this cycle
            q == key[0] and r == key[1] and g <= key[2] for q, r, g in self.failed_here
        )
        loans_only = backed_off or smaller_failed
        if loans_only and not take_loans:
            return False
        if self.policy.anti_thrashing and 0 < job.request.gpus <= self.incoming:
            # Capacity already being freed by earlier preemptions covers it: do not preempt more.
            self.incoming -= job.request.gpus
            self.reasons[job.id] = "pending: waiting for capacity that preempted jobs are freeing"
            return True
        self.plans_left -= 1
        plan = find_victims(
            job,
            now=self.now,
            state=self.st,
            alloc=self.alloc,
            free=self.free,
            pool=self.pool,
            policy=self.policy,
            settings=self.config.preemption,
            taken=self.taken,
            take_loans=take_loans,
            tier=not loans_only,
            budget_used=self.budget_used,
            leaving=self.leaving,
            cost_cache=self.cost_cache,
            candidate_cache=self.candidate_cache,
        )
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
        names = []
        ran = "; ran past its minimum runtime" if self.policy.protect_min_runtime else ""
        for v in plan.victims:
            vjob = v.running.job
            self._take_victim(vjob)
            leaving = self.leaving[vjob.queue]
            for i, amount in enumerate(vjob.request.as_tuple()):
                leaving[i] += amount
            names.append(vjob.id)
            if v.kind == "loan":
                why = f"preempted: ran on loan ahead of {job.id}'s reservation, which is due{ran}"
            elif v.kind == "reclaim":
                why = (
                    f"preempted: {job.queue} reclaims capacity {vjob.queue} borrowed, for "
                    f"{job.id} (within its nominal quota)"
                )
            else:
                tiers = f"tier {vjob.tier.value} yields to {job.tier.value}"
                why = f"preempted: {tiers} job {job.id}{ran}"
            self.preempts.append(
                Preempt(
                    job_id=vjob.id,
                    grace_s=v.grace_s,
                    for_job=job.id,
                    lost_gpu_s=v.lost_gpu_s,
                    reclaim=v.kind == "reclaim",
                    loan=v.kind == "loan",
                    for_nodes=plan.placement or (),
                    reason=f"{why}; expected loss {v.lost_gpu_s:.0f} GPU-s",
                )
            )
        # Victims chosen: the queue budgets and what each queue borrows have changed.
        self.candidate_cache.clear()
        freed = sum(v.running.job.request.gpus for v in plan.victims)
        self.incoming += max(0, freed + max(0, int(self.free[0])) - job.request.gpus)
        self._hold(job, plan.placement or ())
        self.reasons[job.id] = (
            f"pending: preempting {', '.join(names)} to make room; starts when they exit"
        )
        return True

    def _take_victim(self, vjob: Job) -> None:
        """`vjob` gets a notice this cycle: it counts against its queue's budget and no later
        search of the cycle may choose it again."""
        self.budget_used[vjob.queue] = self.budget_used.get(vjob.queue, 0) + 1
        self.taken.add(vjob.id)

    def _maybe_move(self, job: Job) -> bool:
        """Move small jobs off a node for a job ahead of any reservation that fits by count
        alone (`defrag.py`)."""
        if not (self.policy.defragment and self.config.policy.defragment):
            return False
        if self.pool is None or self.reservation is not None:
            return False
        if not self._fits_by_count(job):
            return False
        if job.request.gpus <= self.incoming:
            return False  # preempted jobs are about to free as much: their nodes may do
        plan = find_moves(
            job,
            now=self.now,
            state=self.st,
            pool=self.pool,
            policy=self.policy,
            settings=self.config.preemption,
            taken=self.taken,
            budget_used=self.budget_used,
            movers=self.movers,
        )
        if plan is None:
            return False  # a search that finds nothing costs no plan: the job may still preempt
        self.plans_left -= 1
        names: list[str] = []
        for move in plan.moves:
            vjob = move.running.job
            self._take_victim(vjob)
            names.append(vjob.id)
            where = ", ".join(f"node {n}" for n, _ in move.restart_on)
            self.preempts.append(
                Preempt(
                    job_id=vjob.id,
                    grace_s=move.grace_s,
                    for_job=job.id,
                    lost_gpu_s=move.lost_gpu_s,
                    for_nodes=plan.placement,
                    restart_on=move.restart_on,
                    reason=(
                        f"preempted: moves to {where} so that {job.id} gets a node block; "
                        f"restarts there once saved; expected loss {move.lost_gpu_s:.0f} GPU-s"
                    ),
                )
            )
            self._hold_nodes(move.restart_on)
        self.candidate_cache.clear()
        self._hold_nodes(plan.placement)  # the rest of its block is the moved jobs' GPUs
        self.reasons[job.id] = (
            f"pending: moving {', '.join(names)} to other nodes to make a node block for it; "
            "starts when they have saved"
        )
        return True

    def _hold_nodes(self, nodes: Placement) -> None:
        """Hold the GPUs free now on `nodes` (for a move), by count exactly what is taken: the
        rest of the block is GPUs that moved jobs still hold, which no one else can take."""
        self.free[0] -= self._take_free_on(nodes)

    def _take_free_on(self, nodes: Placement) -> int:
        """Take from the pool what is free now of `nodes`; returns the GPUs taken."""
        hold = [(n, min(g, self.pool.free[n])) for n, g in nodes]
        hold = [(n, g) for n, g in hold if g > 0]
        self.pool.take(hold)
        self._use_held_nodes(hold)
        return sum(g for _, g in hold)

    def _hold(self, job: Job, nodes: Placement) -> None:
        """Hold what is free now for a preemptor, by count and on the nodes its victims free,
        so that nobody else takes it before they exit. By count, GPUs free on other nodes wait
        too, for one grace at most. Holding only the nodes' free GPUs was tried: waits moved
        both ways between runs, goodput fell and preemptions rose (`docs/policy-history.md`)."""
        req = job.request.as_tuple()
        for i in range(3):
            if self.free[i] != INF:
                self.free[i] -= min(max(self.free[i], 0), req[i])
        if self.pool is not None and nodes:
            self._take_free_on(nodes)

    def _preemption_possible(self) -> bool:
        if self.plans_left <= 0:
            return False
        p = self.policy
        if p.tier_preemption and any(self.st.tier_gpus[:3]):
            return True
        if p.loan_backfill and self.st.loans:
            return True
        if p.reclaim and p.quotas:
            return any(is_borrowing(q, self.alloc[n]) for n, q in self.st.queues.items())
        return False

    # --- ordering -----------------------------------------------------------------------------

    def _entry(self, job: Job, gkey: GroupKey) -> tuple:
        return (*self._key(job), job.submitted_at, job.id, gkey, self.version[job.queue])

    def _key(self, job: Job) -> tuple[float, ...]:
        ordering = self.policy.ordering
        if ordering is Ordering.FIFO:
            return (0.0,)
        if ordering is Ordering.PRIORITY:
            return (-job.tier.rank,)
        if ordering is Ordering.KUEUE:
            queue = self.st.queues[job.queue]
            verdict = check_quota(queue, self.alloc[job.queue], job.request.as_tuple())
            return (float(verdict is not QuotaVerdict.WITHIN_NOMINAL), -job.tier.rank)
        wait = max(0.0, self.now - job.submitted_at)
        if ordering is Ordering.SLURM:
            share = self.weights.get(job.queue, 0.0)
            used = self.usage.get(job.queue, 0.0)
            fair = 2.0 ** (-used / share) if share > 0 else 0.0
            age = min(wait / _SLURM_AGE_MAX_S, 1.0)
            return (-(job.tier.rank * 1e5 + 1e4 * fair + 1e3 * age),)
        settings = self.config.policy
        rank = job.tier.rank
        demoted = 0.0
        reclaimer = self.reclaimer_rank[job.queue]
        if rank >= reclaimer:
            queue = self.st.queues[job.queue]
            verdict = check_quota(queue, self.alloc[job.queue], job.request.as_tuple())
            if verdict is not QuotaVerdict.WITHIN_NOMINAL:
                rank = reclaimer
                demoted = 1.0
        if self._starving(job):
            # Oldest first, ahead of the rest of its tier, so it gets the reservation and
            # capacity drains towards it.
            return (-rank, demoted, _STARVING + job.submitted_at)
        credit = min(wait / settings.aging_s, settings.aging_max_units)
        return (-rank, demoted, self._fair_share(job) - credit)

    def _reclaimer_ranks(self) -> dict[str, int]:
        """Per queue: the lowest tier of pending work within nominal quota in *other* queues
        (`_NO_RECLAIMER` when there is none, so that nobody is demoted)."""
        p = self.policy
        ranks = dict.fromkeys(self.st.queues, _NO_RECLAIMER)
        if not (p.nominal_first and p.quotas and p.reclaim and p.ordering is Ordering.FAIR):
            return ranks
        lowest: dict[str, int] = {}
        for (queue, rank, gpus, cpus, memory), group in self.st.groups.items():
            if rank >= lowest.get(queue, _NO_RECLAIMER) or not group.jobs:
                continue
            q = self.st.queues[queue]
            if (
                check_quota(q, self.alloc[queue], (gpus, cpus, memory))
                is QuotaVerdict.WITHIN_NOMINAL
            ):
                lowest[queue] = rank
        # The two lowest, from different queues: each queue sees the lowest of the others.
        by_rank = sorted((r, q) for q, r in lowest.items())[:2]
        for name in ranks:
            ranks[name] = next((r for r, q in by_rank if q != name), _NO_RECLAIMER)
        return ranks

    def _starving(self, job: Job) -> bool:
        """Past the starvation limit, or past the aging cap in a queue below its fair share.

        The limit ignores the share: a burst far beyond a queue's weight would otherwise wait
        for as long as the other queues keep the cluster busy.
        """
        settings = self.config.policy
        wait = self.now - job.submitted_at
        limit = settings.starvation_limit_s
        if limit and wait >= limit:
            return True
        if wait < settings.aging_s * settings.aging_max_units:
            return False
        return self._fair_share(job, after=False) < 1.0

    def _fair_share(self, job: Job, *, after: bool = True) -> float:
        """The queue's fair-share value as it would be with one more GPU (DRF's "after" view).

        Judging by the share after admission, not before, keeps a queue that just released a
        GPU from winning it back every time, which would freeze shares away from the weights.
        The step is one GPU whatever the job asks for: the value belongs to the queue, so that
        within a queue age decides; sized by the job, every small job that has aged past the
        cap would go before a big one of the same queue, which then starves in a backlog.
        """
        queue = job.queue
        now_share = self.fs_cache.get(queue)
        if now_share is None:
            a = self.alloc[queue]
            now_share = dominant_share(a[0], a[1], a[2], self.cluster)
            self.fs_cache[queue] = now_share
        if after:
            now_share += self.step_share
        return fair_share_value(self.usage.get(queue, 0.0), now_share, self.weights[queue])

    def _fragmentation(self) -> float:
        if self.pool is None:
            return 0.0
        shapes = {key[2] for key, group in self.st.groups.items() if group.jobs}
        return self.pool.fragmentation(shapes)
