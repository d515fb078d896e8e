"""Choosing which running jobs to preempt for a blocked job. Chooses; evicts nothing.

Three reasons allow a preemption:

1. reclaim: the blocked job would run within its queue's nominal quota, and the victim's queue
   holds more than its nominal quota (runs on borrowed capacity). Tier and minimum runtime do not
   protect borrowed work; that is the price of borrowing, and it keeps the nominal guarantee to
   one grace period.
2. tier: the victim's tier is strictly lower, it has run for its negotiated minimum runtime, was
   not preempted within the cooldown, and its queue has budget left this hour. Victims come from
   the blocked job's own queue, or (ours) from other queues' borrowed capacity, never from another
   queue's guaranteed share.
3. loan: the victim started on loan ahead of the blocked job's reservation (`loan_for`), and
   the blocked job still holds it; the victim's tier is not higher, it has run for its minimum
   runtime, and it is in the blocked job's queue or its queue is borrowing (work within a
   queue's nominal quota is never taken). It was admitted on exactly that condition.

Among the allowed victims we look for a set that makes the job fit at the least lost work:
GPU-seconds since each victim's last checkpoint (only its save time when it checkpoints on
notice within its grace) plus its restore. Single-node jobs compare node by node; larger jobs
add victims greedily by cost per GPU; both then drop any victim the fit does not need (as kueue
does).

Victims from another queue come out of what that queue borrows (`Policy.within_borrowed`):
together they may not take it below its nominal quota. Only when the search finds no such set
(jobs are indivisible: a queue that borrows 1 GPU with one 5-GPU job) may a victim straddle the
quota, and only while its queue still borrows before it goes, which is kueue's only rule. The
search is greedy, so it can miss a set within what a queue borrows and straddle instead. What
a queue borrows is judged without its jobs that were already told to go.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from preemptible.queue.core.config import PreemptionSettings
from preemptible.queue.core.model import _TIER_RANK as _RANK
from preemptible.queue.core.model import Job, RunningJob
from preemptible.queue.core.negotiation import grace_seconds, min_runtime_seconds
from preemptible.queue.core.placement import NodePool, Placement
from preemptible.queue.core.policy import Policy, VictimOrder
from preemptible.queue.core.quota import QuotaVerdict, borrowed, check_quota, is_borrowing
from preemptible.queue.core.state import ClusterState


@dataclass(frozen=True, kw_only=True, slots=True)
class Victim:
    """One chosen victim with its price."""

    running: RunningJob
    lost_gpu_s: float
    grace_s: float
    kind: Literal["reclaim", "tier", "loan"]
    """Why it may be preempted: "reclaim", "tier" or "loan" (see the module docstring)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class VictimPlan:
    """Victims whose exit makes the blocked job fit, and where it will then go."""

    victims: tuple[Victim, ...]
    placement: Placement | None


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


def lost_gpu_seconds(running: RunningJob, now: float, grace_s: float) -> float:
    """GPU-seconds a preemption now would waste: unsaved work (or the save) plus restore."""
    job = running.job
    gpus = max(job.request.gpus, 1)
    if job.checkpoint_on_notice and job.save_s <= grace_s:
        return gpus * (job.save_s + job.restore_s)
    return gpus * (max(0.0, now - running.checkpoint_time(now)) + job.restore_s)


def queue_budget_left(
    state: ClusterState, queue: str, now: float, settings: PreemptionSettings, used: int
) -> int:
    """Preemptions the queue may still suffer in the rolling hour (the log holds at most the
    last hour's, pruned as it is written, so counting it is cheap)."""
    since = now - 3600.0
    recent = sum(1 for at in state.recent_preemptions.get(queue, ()) if at >= since)
    return settings.queue_budget_per_hour - recent - used


def find_victims(
    job: Job,
    *,
    now: float,
    state: ClusterState,
    alloc: Mapping[str, Sequence[float]],
    free: Sequence[float],
    pool: NodePool | None,
    policy: Policy,
    settings: PreemptionSettings,
    taken: set[str],
    budget_used: Mapping[str, int],
    leaving: Mapping[str, Sequence[float]] | None = None,
    take_loans: bool = False,
    tier: bool = True,
    cost_cache: dict[str, tuple[tuple, float, float]] | None = None,
    candidate_cache: dict[tuple, list] | None = None,
) -> VictimPlan | None:
    """The cheapest set of victims that lets `job` start, or None when there is none.

    `cost_cache` and `candidate_cache` belong to one cycle: prices do not depend on the
    preemptor, and the eligible set only on its queue and tier while allocations, budgets and
    `leaving` are unchanged (the caller clears `candidate_cache` when it admits a job or
    chooses victims). `budget_used`: preemptions the caller has already decided this cycle,
    per queue. `leaving`: per queue, what its jobs told to go still hold (default: the
    state's). `take_loans`: `job` holds the
    reservation, so jobs on loan to it are candidates too; `tier=False` leaves tier victims out
    (their search is backed off).
    """
    queues = state.queues
    queue = queues[job.queue]
    req = job.request.as_tuple()
    if policy.quotas:
        verdict = check_quota(queue, alloc[job.queue], req)
    else:
        verdict = QuotaVerdict.WITHIN_NOMINAL
    can_reclaim = policy.reclaim and policy.quotas and verdict is QuotaVerdict.WITHIN_NOMINAL
    rank = job.tier.rank
    can_tier = tier and policy.tier_preemption and any(state.tier_gpus[t] for t in range(rank))
    take_loans = take_loans and job.id in state.loans
    if not (can_reclaim or can_tier or take_loans):
        return None
    if leaving is None:
        leaving = state.leaving
    room = {name: borrowed(q, alloc[name], leaving[name]) for name, q in queues.items()}
    borrowing = {name: any(x > 1e-9 for x in r) for name, r in room.items()}
    if not (can_tier or take_loans or any(borrowing.values())):
        return None

    cache_key = (job.queue, rank, can_reclaim, can_tier, job.id if take_loans else None)
    if candidate_cache is not None and cache_key in candidate_cache:
        candidates = [c for c in candidate_cache[cache_key] if c[1].job.id not in taken]
        if not candidates:
            return None
        return _choose(job, candidates, alloc, free, pool, policy, queue, req, state, room)
    candidates: list[tuple[tuple, RunningJob, float, float, bool]] = []
    newest_first = policy.victim_order is VictimOrder.LOWEST_PRIORITY_NEWEST
    # A borrower that takes another queue's borrowed capacity runs on borrowed capacity itself:
    # the victim's queue can reclaim it back at once, so the save is lost for nothing.
    across = policy.tier_preemption_across_queues and verdict is not QuotaVerdict.BORROWING
    for vq, running in state.running_by_queue.items():
        reclaim_q = can_reclaim and borrowing[vq] and vq != job.queue
        tier_q = can_tier and (vq == job.queue or (across and borrowing[vq]))
        loan_q = take_loans and (vq == job.queue or borrowing[vq])  # as in `loans_due`
        if not (reclaim_q or tier_q or loan_q) or not running:
            continue
        if tier_q and policy.anti_thrashing:
            tier_q = queue_budget_left(state, vq, now, settings, budget_used.get(vq, 0)) > 0
            if not (reclaim_q or tier_q or loan_q):
                continue
        for rj in running.values():
            vjob = rj.job
            if rj.terminating or vjob.id in taken:
                continue
            tier_ok = tier_q and _RANK[vjob.tier] < rank
            loan_ok = loan_q and _on_loan_to(rj, job)
            if (tier_ok or loan_ok) and policy.protect_min_runtime:
                ran_enough = now >= min_runtime_end(rj, settings)
                tier_ok, loan_ok = tier_ok and ran_enough, loan_ok and ran_enough
            if tier_ok and policy.anti_thrashing:
                tier_ok = not in_cooldown(vjob, now, settings)
            if not (reclaim_q or tier_ok or loan_ok):
                continue
            cached = cost_cache.get(vjob.id) if cost_cache is not None else None
            if cached is None:
                cached = _price(rj, now, policy, settings, newest_first)
                if cost_cache is not None:
                    cost_cache[vjob.id] = cached
            key, lost, grace = cached
            kind = "tier" if tier_ok else "loan" if loan_ok else "reclaim"
            candidates.append((key, rj, lost, grace, kind))
    candidates.sort(key=lambda c: c[0])
    if candidate_cache is not None:
        candidate_cache[cache_key] = candidates
    if not candidates:
        return None
    return _choose(job, candidates, alloc, free, pool, policy, queue, req, state, room)


def loans_due(
    job: Job,
    *,
    now: float,
    state: ClusterState,
    alloc: Mapping[str, Sequence[float]],
    policy: Policy,
    settings: PreemptionSettings,
    leaving: Mapping[str, Sequence[float]] | None = None,
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


def min_runtime_end(rj: RunningJob, settings: PreemptionSettings) -> float:
    """When `rj` has run its negotiated minimum runtime (before that, only reclaim takes it)."""
    return rj.started_at + min_runtime_seconds(rj.job.save_s, rj.job.restore_s, settings)


def _price(rj, now, policy, settings, newest_first) -> tuple[tuple, float, float]:
    """(sort key, lost GPU-seconds, grace) of preempting `rj` now; independent of the preemptor."""
    vjob = rj.job
    grace = victim_grace_s(vjob, policy, settings)
    lost = lost_gpu_seconds(rj, now, grace)
    if newest_first:
        key = (vjob.tier.rank, -rj.started_at, vjob.id)
    else:
        key = (lost / max(vjob.request.gpus, 1), lost, -rj.started_at, vjob.id)
    return key, lost, grace


def _choose(job, candidates, alloc, free, pool, policy, queue, req, state, room):
    def quota_ok(freed_own: Sequence[float]) -> bool:
        if not policy.quotas:
            return True
        own = alloc[job.queue]
        after = [own[i] - freed_own[i] for i in range(3)]
        return check_quota(queue, after, req) is not QuotaVerdict.OVER_LIMIT

    if pool is not None and 0 < req[0] <= pool.gpus_per_node:
        search = _per_node
    elif pool is not None:
        search = partial(_whole_nodes, node_jobs=state.node_jobs)
    else:
        search = _greedy
    guard = _Borrowed(job.queue, room, straddle=not policy.within_borrowed)
    chosen, placement = search(job, candidates, free, pool, quota_ok, guard)
    if chosen is None and guard.refused and not guard.straddle:
        guard = _Borrowed(job.queue, room, straddle=True)
        chosen, placement = search(job, candidates, free, pool, quota_ok, guard)
    if chosen is None:
        return None
    victims = tuple(Victim(running=c[1], lost_gpu_s=c[2], grace_s=c[3], kind=c[4]) for c in chosen)
    return VictimPlan(victims=victims, placement=placement)


class _Borrowed:
    """Keeps victims of other queues within what those queues borrow (see the module docstring).

    `room`: per queue, what it holds beyond its nominal quota. With `straddle`, a victim may take
    its queue below nominal as long as the queue still borrows before it goes.
    """

    __slots__ = ("own", "refused", "room", "straddle")

    def __init__(self, own: str, room: Mapping[str, Sequence[float]], *, straddle: bool):
        self.own = own
        self.room = room
        self.straddle = straddle
        self.refused = False
        """Whether a victim was refused, i.e. whether straddling could find more."""

    def allows(self, c, taken: Mapping[str, Sequence[float]]) -> bool:
        """Whether candidate `c` may join victims that already take `taken` per queue."""
        vq = c[1].job.queue
        if vq == self.own:
            return True
        room = self.room[vq]
        used = taken.get(vq, (0.0, 0.0, 0.0))
        if self.straddle:
            ok = any(used[i] < room[i] - 1e-9 for i in range(3))
        else:
            r = c[1].job.request.as_tuple()
            ok = all(used[i] + r[i] <= room[i] + 1e-9 for i in range(3) if room[i] > 1e-9)
        self.refused |= not ok
        return ok


def _tally(taken: dict[str, list[float]], c, sign: int) -> None:
    """Add (sign 1) or remove (-1) candidate `c` from what victims take per queue."""
    r = c[1].job.request.as_tuple()
    t = taken.setdefault(c[1].job.queue, [0.0, 0.0, 0.0])
    for i in range(3):
        t[i] += sign * r[i]


def _all_allowed(guard: _Borrowed, victims: list, taken: dict[str, list[float]]):
    """What victims take per queue with `victims` added, if the guard allows each in turn."""
    trial = {q: list(t) for q, t in taken.items()}
    for c in victims:
        if not guard.allows(c, trial):
            return None
        _tally(trial, c, +1)
    return trial


def _fits_flat(free: Sequence[float], freed: Sequence[float], req: Sequence[float]) -> bool:
    return all(free[i] + freed[i] + 1e-9 >= req[i] for i in range(3))


def _greedy(job, candidates, free, pool, quota_ok, guard):
    """Add victims cheapest-per-GPU first until the job fits, then drop the unneeded ones."""
    req = job.request.as_tuple()
    freed = [0.0, 0.0, 0.0]
    freed_own = [0.0, 0.0, 0.0]
    taken: dict[str, list[float]] = {}
    test = pool.copy() if pool is not None else None
    chosen = []

    def fits() -> bool:
        if not _fits_flat(free, freed, req) or not quota_ok(freed_own):
            return False
        return test is None or test.find(req[0]) is not None

    def account(c, sign: int) -> None:
        r = c[1].job.request.as_tuple()
        own = c[1].job.queue == job.queue
        for i in range(3):
            freed[i] += sign * r[i]
            if own:
                freed_own[i] += sign * r[i]
        _tally(taken, c, sign)
        if test is not None:
            (test.give if sign > 0 else test.take)(c[1].placement)

    for c in candidates:
        if not guard.allows(c, taken):
            continue
        chosen.append(c)
        account(c, +1)
        if fits():
            break
    else:
        return None, None
    for c in reversed(chosen[:-1]):
        account(c, -1)
        if fits():
            chosen.remove(c)
        else:
            account(c, +1)
    placement = test.find(req[0]) if test is not None else None
    return chosen, placement


class _NodeRoom:
    """Victims gathered on one node for a single-node job, and what they free."""

    __slots__ = ("chosen", "cost", "freed", "freed_own", "room", "taken")

    def __init__(self, room: int):
        self.chosen: list = []
        self.cost = 0.0
        self.freed = [0.0, 0.0, 0.0]
        self.freed_own = [0.0, 0.0, 0.0]
        self.taken: dict[str, list[float]] = {}
        self.room = room
        """GPUs free on the node once the chosen victims exit."""

    def add(self, c, gpus_here: int, own: bool, sign: int = 1) -> None:
        r = c[1].job.request.as_tuple()
        for i in range(3):
            self.freed[i] += sign * r[i]
            if own:
                self.freed_own[i] += sign * r[i]
        _tally(self.taken, c, sign)
        self.cost += sign * c[2]
        self.room += sign * gpus_here
        if sign > 0:
            self.chosen.append(c)
        else:
            self.chosen.remove(c)


def _per_node(job, candidates, free, pool, quota_ok, guard, *, enough_nodes: int = 8):
    """For a single-node job: on each node, the cheapest victims that make room; best node wins.

    One pass over the candidates in price order, accumulating per node; a node is complete the
    first time its room suffices, and then keeps only the victims the fit needs. Candidates come
    cheapest first, so after `enough_nodes` complete nodes a cheaper one is unlikely; we stop
    there to bound the cost of a cycle.
    """
    req = job.request.as_tuple()
    gpus = req[0]
    nodes: dict[int, _NodeRoom] = {}
    best: tuple[float, int, list] | None = None
    done: set[int] = set()

    def fits(n: _NodeRoom) -> bool:
        return n.room >= gpus and _fits_flat(free, n.freed, req) and quota_ok(n.freed_own)

    for c in candidates:
        rj = c[1]
        own = rj.job.queue == job.queue
        for node, g in rj.placement:
            if node in done:
                continue
            acc = nodes.get(node)
            if acc is None:
                acc = nodes[node] = _NodeRoom(pool.free[node])
            if not guard.allows(c, acc.taken):
                continue
            acc.add(c, g, own)
            if not fits(acc):
                continue
            done.add(node)
            for victim in reversed(acc.chosen[:-1]):  # drop what the fit does not need
                here = sum(h for n, h in victim[1].placement if n == node)
                mine = victim[1].job.queue == job.queue
                acc.add(victim, here, mine, -1)
                if not fits(acc):
                    acc.add(victim, here, mine, +1)
            if best is None or (acc.cost, node) < (best[0], best[1]):
                best = (acc.cost, node, list(acc.chosen))
        if len(done) >= enough_nodes:
            break
    if best is None:
        return None, None
    return best[2], ((best[1], gpus),)


def _whole_nodes(job, candidates, free, pool, quota_ok, guard, *, node_jobs):
    """For a multi-node job: clear the cheapest nodes whose every job may be preempted."""
    req = job.request.as_tuple()
    per = pool.gpus_per_node
    need = -(-int(req[0]) // per)  # a remainder takes a node of its own
    by_id = {c[1].job.id: c for c in candidates}
    priced: list[tuple[float, int, list]] = []
    for node, free_gpus in enumerate(pool.free):
        if free_gpus == per:
            priced.append((0.0, node, []))
            continue
        cands = []
        for job_id in node_jobs[node]:
            c = by_id.get(job_id)
            if c is None:
                break
            cands.append(c)
        else:
            held = sum(g for c in cands for n, g in c[1].placement if n == node)
            if free_gpus + held == per:
                # In price order: a node's jobs are a set, whose order changes with the hash
                # seed, and the victims' order decides what a straddling quota allows.
                cands.sort(key=lambda c: c[0])
                priced.append((sum(c[2] for c in cands), node, cands))
    if len(priced) < need:
        return None, None
    priced.sort(key=lambda p: (p[0], p[1]))
    chosen, seen, nodes = [], set(), []
    taken: dict[str, list[float]] = {}
    for _, node, cands in priced:
        new = [c for c in cands if c[1].job.id not in seen]
        trial = _all_allowed(guard, new, taken)
        if trial is None:
            continue
        taken = trial
        seen.update(c[1].job.id for c in new)
        chosen.extend(new)
        nodes.append(node)
        if len(nodes) == need:
            break
    else:
        return None, None
    freed, freed_own = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for c in chosen:
        r = c[1].job.request.as_tuple()
        for i in range(3):
            freed[i] += r[i]
            if c[1].job.queue == job.queue:
                freed_own[i] += r[i]
    if not (_fits_flat(free, freed, req) and quota_ok(freed_own)):
        return None, None
    nodes.sort()
    whole, rest = divmod(int(req[0]), per)
    placement = [(n, per) for n in nodes[:whole]]
    if rest:
        placement.append((nodes[whole], rest))
    return chosen, tuple(placement)
