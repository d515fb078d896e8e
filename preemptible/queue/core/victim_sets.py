"""Which set of allowed victims makes a blocked job fit at the least lost work.

`preemption.py` says who may be a victim and at what price; this module picks the set. A job of
up to one node's GPUs compares node by node (`_per_node`); a larger job clears the cheapest
whole nodes (`_whole_nodes`); on a flat pool victims are added cheapest per GPU first
(`_greedy`). Each then drops any victim the fit does not need, as kueue does.

Victims from another queue come out of what that queue borrows: together they may not take it
below its nominal quota. Only when no such set exists (jobs are indivisible: a queue that
borrows 1 GPU with one 5-GPU job) may a victim straddle the quota, and only while its queue
still borrows before it goes, which is kueue's only rule. The searches are greedy, so one can
miss a set within what a queue borrows and straddle instead; on the published traces that was
rare and never avoidable (`docs/internals/reclaim-within-borrowed.md`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from preemptible.queue.core.elastic import ShrinkOption, kept, released
from preemptible.queue.core.model import Job, Queue, Resources, RunningJob, VictimKind
from preemptible.queue.core.placement import NodePool, Placement
from preemptible.queue.core.quota import QuotaVerdict, check_quota
from preemptible.queue.core.resources import TOLERANCE, Amounts, HasAmounts, values


class Candidate(NamedTuple):
    """A running job that may be preempted (or shrunk) for the blocked job, with its price."""

    order: tuple[float | str, ...]
    """Sort key: candidates are tried in this order (cheapest first, for ours)."""
    running: RunningJob
    lost_gpu_s: float
    """GPU-seconds preempting it now would waste."""
    grace_s: float
    """The grace it would get."""
    kind: VictimKind
    shrink: ShrinkOption | None = None
    """Shrink it to `shrink.gpus_after` instead of evicting it (`elastic.py`); None: evict."""
    shrinking_to: int | None = None
    """A shrink to this size is under way (`ClusterState.shrinking`): it may only be evicted.
    What the shrink gives up is leaving already, for the job it was shrunk for; that job
    keeps it unless this eviction takes it back (`_TAKEN_BACK`)."""

    def frees(self) -> Resources:
        """What it gives up for the blocked job: all it holds, what a shrink takes, or (a
        shrink under way) what that shrink keeps, or all it holds when taken back."""
        if self.shrinking_to is not None and self.kind not in _TAKEN_BACK:
            return self.running.job.at_size(self.shrinking_to)
        if self.shrink is None:
            return self.running.held
        return self.running.held - self.running.job.at_size(self.shrink.gpus_after)

    def frees_on(self) -> Placement:
        """The (node, GPUs) it gives up for the blocked job (`frees`)."""
        if self.shrinking_to is not None and self.kind not in _TAKEN_BACK:
            return kept(self.running, self.shrinking_to)
        if self.shrink is None:
            return self.running.placement
        return released(self.running, self.shrink.gpus_after)

    def leaves(self) -> Resources:
        """What its notice adds to its queue's leaving capacity: what it frees, less what a
        shrink under way counts as leaving already."""
        if self.shrinking_to is not None:
            return self.running.job.at_size(self.shrinking_to)
        return self.frees()

    def larger_shrink(self) -> Candidate | None:
        """The same shrink, giving up fewer GPUs; None when it is not a shrink or cannot."""
        if self.shrink is None:
            return None
        bigger = self.shrink.larger()
        if bigger is None or bigger.gpus_after >= self.running.size:
            return None
        return self._replace(shrink=bigger, lost_gpu_s=bigger.lost_gpu_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class Victim:
    """One chosen victim with its price."""

    running: RunningJob
    lost_gpu_s: float
    grace_s: float
    kind: VictimKind
    """Why it may be preempted: "reclaim", "tier", "loan" or "beyond_limit"."""
    gpus_after: int | None = None
    """Shrink it to this many GPUs instead of evicting it; None: evict."""
    shrinking_to: int | None = None
    """It is evicted while a shrink to this size is under way (`Candidate.shrinking_to`)."""

    def leaves(self) -> Resources:
        """What its notice adds to its queue's leaving capacity (`Candidate.leaves`)."""
        held = self.running.held
        if self.shrinking_to is not None:
            return self.running.job.at_size(self.shrinking_to)
        if self.gpus_after is None:
            return held
        return held - self.running.job.at_size(self.gpus_after)


@dataclass(frozen=True, kw_only=True, slots=True)
class VictimPlan:
    """Victims whose exit makes the blocked job fit, and where it will then go."""

    victims: tuple[Victim, ...]
    placement: Placement | None
    evict_lost_gpu_s: float | None = None
    """When shrinks were weighed: what the cheapest plan of evictions alone would lose (None
    when there is none)."""
    shrink_lost_gpu_s: float | None = None
    """When shrinks were weighed: what the cheapest plan with shrinks would lose (None when
    there is none)."""

    @property
    def lost_gpu_s(self) -> float:
        """What the plan loses in all."""
        return sum(v.lost_gpu_s for v in self.victims)

    @property
    def shrinks(self) -> bool:
        """Whether it shrinks any job."""
        return any(v.gpus_after is not None for v in self.victims)


_TAKEN_BACK = frozenset({"reclaim", "beyond_limit"})
"""Kinds of victim whose shrink under way counts wholly for the blocked job: what the shrink
gives up was borrowed too, and the job it was given up to would borrow it, so it yields it to
the reclaim (`cycle.py`'s nominees take their turn in the walk while work within nominal quota
of another queue waits)."""

QuotaCheck = Callable[[Amounts], bool]
"""Whether the blocked job's queue may take it once its own victims free this much."""
Search = Callable[
    [Job, Sequence[Candidate], Amounts, NodePool | None, QuotaCheck, "_Borrowed"],
    tuple[list[Candidate] | None, Placement | None],
]


def cheapest_set(
    job: Job,
    candidates: Sequence[Candidate],
    *,
    own_alloc: Amounts,
    queue: Queue,
    quotas: bool,
    free: Amounts,
    pool: NodePool | None,
    node_jobs: Sequence[set[str]],
    borrowed: Mapping[str, Amounts],
    within_borrowed: bool,
) -> VictimPlan | None:
    """The cheapest victims among `candidates` (in their order) that let `job` start.

    Args:
        own_alloc: what `job`'s queue holds now; `queue`: its quota (checked when `quotas`).
        free: what is free now by count; `pool`: per node, None for a flat pool.
        node_jobs: per node, the ids of the jobs there.
        borrowed: per queue, what it borrows beyond its nominal quota.
        within_borrowed: keep victims of other queues within what they borrow when possible.
    """

    def quota_ok(freed_own: Amounts) -> bool:
        if not quotas:
            return True
        return check_quota(queue, own_alloc.minus(freed_own), job.request) is not (
            QuotaVerdict.OVER_LIMIT
        )

    search: Search
    if pool is not None and 0 < job.request.gpus <= pool.gpus_per_node:
        search = _per_node
    elif pool is not None:
        search = partial(_whole_nodes, node_jobs=node_jobs)
    else:
        search = _greedy
    guard = _Borrowed(job.queue, borrowed, straddle=not within_borrowed)
    chosen, placement = search(job, candidates, free, pool, quota_ok, guard)
    if chosen is None and guard.refused and not guard.straddle:
        guard = _Borrowed(job.queue, borrowed, straddle=True)
        chosen, placement = search(job, candidates, free, pool, quota_ok, guard)
    if chosen is None:
        return None
    victims = tuple(
        Victim(
            running=c.running,
            lost_gpu_s=c.lost_gpu_s,
            grace_s=c.grace_s,
            kind=c.kind,
            gpus_after=None if c.shrink is None else c.shrink.gpus_after,
            shrinking_to=c.shrinking_to,
        )
        for c in chosen
    )
    return VictimPlan(victims=victims, placement=placement)


class _Borrowed:
    """Keeps victims of other queues within what those queues borrow.

    `borrowed`: per queue, what it holds beyond its nominal quota. With `straddle`, a victim may
    take its queue below nominal as long as the queue still borrows before it goes.
    """

    __slots__ = ("borrowed", "own", "refused", "straddle")

    def __init__(self, own: str, borrowed: Mapping[str, Amounts], *, straddle: bool):
        self.own = own
        self.borrowed = borrowed
        self.straddle = straddle
        self.refused = False
        """Whether a victim was refused, i.e. whether straddling could find more."""

    def allows(self, c: Candidate, taken: Mapping[str, Amounts]) -> bool:
        """Whether `c` may join victims that already take `taken` per queue."""
        vq = c.running.job.queue
        if vq == self.own:
            return True
        room = values(self.borrowed[vq])
        used = values(taken[vq]) if vq in taken else (0.0, 0.0, 0.0)
        if self.straddle:
            ok = any(u < r - TOLERANCE for u, r in zip(used, room, strict=True))
        else:
            asked = values(c.leaves())
            ok = all(
                u + a <= r + TOLERANCE
                for u, a, r in zip(used, asked, room, strict=True)
                if r > TOLERANCE
            )
        self.refused |= not ok
        return ok


def _tally(
    taken: dict[str, Amounts], c: Candidate, sign: int, leaves: Resources | None = None
) -> None:
    """Add (sign 1) or remove (-1) `c` from what victims take per queue (what it borrows is
    judged without what is leaving already, `Candidate.leaves`; `leaves`: that, if known)."""
    amount = c.leaves() if leaves is None else leaves
    taken.setdefault(c.running.job.queue, Amounts(0.0, 0.0, 0.0)).add(amount, sign)


def _all_allowed(
    guard: _Borrowed, victims: list[Candidate], taken: Mapping[str, Amounts]
) -> dict[str, Amounts] | None:
    """What victims take per queue with `victims` added, if the guard allows each in turn."""
    trial = {q: t.copy() for q, t in taken.items()}
    for c in victims:
        if not guard.allows(c, trial):
            return None
        _tally(trial, c, +1)
    return trial


def _fits(free: Amounts, freed: HasAmounts, need: HasAmounts) -> bool:
    return free.plus(freed).covers(need)


class _Freed:
    """What chosen victims free: in all, and of the blocked job's own queue."""

    __slots__ = ("all", "own", "own_queue", "taken")

    def __init__(self, own_queue: str):
        self.own_queue = own_queue
        self.all = Amounts(0.0, 0.0, 0.0)
        self.own = Amounts(0.0, 0.0, 0.0)
        self.taken: dict[str, Amounts] = {}
        """Per victim queue, what its chosen jobs take."""

    def add(self, c: Candidate, sign: int = 1) -> None:
        frees = c.frees()
        self.all.add(frees, sign)
        if c.running.job.queue == self.own_queue:
            self.own.add(frees, sign)
        # What it leaves is what it frees unless a shrink of it is under way (`leaves`).
        _tally(self.taken, c, sign, frees if c.shrinking_to is None else None)


def _greedy(
    job: Job,
    candidates: Sequence[Candidate],
    free: Amounts,
    pool: NodePool | None,
    quota_ok: QuotaCheck,
    guard: _Borrowed,
) -> tuple[list[Candidate] | None, Placement | None]:
    """Add victims cheapest-per-GPU first until the job fits, then drop the unneeded ones."""
    req = job.request
    freed = _Freed(job.queue)
    test = pool.copy() if pool is not None else None
    chosen: list[Candidate] = []

    def fits() -> bool:
        if not _fits(free, freed.all, req) or not quota_ok(freed.own):
            return False
        return test is None or test.find(req.gpus) is not None

    def account(c: Candidate, sign: int) -> None:
        freed.add(c, sign)
        if test is not None:
            (test.give if sign > 0 else test.take)(c.frees_on())

    for c in candidates:
        if not guard.allows(c, freed.taken):
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
    _take_less(chosen, account, fits)
    placement = test.find(req.gpus) if test is not None else None
    return chosen, placement


class _NodeRoom(_Freed):
    """Victims gathered on one node for a single-node job, and what they free."""

    __slots__ = ("chosen", "cost", "room")

    def __init__(self, own_queue: str, room: int):
        super().__init__(own_queue)
        self.chosen: list[Candidate] = []
        self.cost = 0.0
        self.room = room
        """GPUs free on the node once the chosen victims exit."""

    def gather(self, c: Candidate, gpus_here: int, sign: int = 1) -> None:
        self.add(c, sign)
        self.cost += sign * c.lost_gpu_s
        self.room += sign * gpus_here
        if sign > 0:
            self.chosen.append(c)
        else:
            self.chosen.remove(c)


def _take_less(
    chosen: list[Candidate],
    account: Callable[[Candidate, int], None],
    fits: Callable[[], bool],
) -> None:
    """Shrink each chosen elastic job by no more than the fit needs, a size at a time."""
    for i, c in enumerate(chosen):
        while (bigger := c.larger_shrink()) is not None:
            account(c, -1)
            account(bigger, +1)
            if fits():
                chosen[i] = c = bigger
            else:
                account(bigger, -1)
                account(c, +1)
                break


def _per_node(
    job: Job,
    candidates: Sequence[Candidate],
    free: Amounts,
    pool: NodePool | None,
    quota_ok: QuotaCheck,
    guard: _Borrowed,
    *,
    enough_nodes: int = 8,
) -> tuple[list[Candidate] | None, Placement | None]:
    """For a single-node job: on each node, the cheapest victims that make room; best node wins.

    One pass over the candidates in price order, accumulating per node; a node is complete the
    first time its room suffices, and then keeps only the victims the fit needs. Candidates come
    cheapest first, so after `enough_nodes` complete nodes a cheaper one is unlikely; we stop
    there to bound the cost of a cycle.
    """
    assert pool is not None
    req = job.request
    gpus = req.gpus
    nodes: dict[int, _NodeRoom] = {}
    best: tuple[float, int, list[Candidate]] | None = None
    done: set[int] = set()

    def fits(n: _NodeRoom) -> bool:
        return n.room >= gpus and _fits(free, n.all, req) and quota_ok(n.own)

    for c in candidates:
        for node, g in c.frees_on():
            if node in done:
                continue
            acc = nodes.get(node)
            if acc is None:
                acc = nodes[node] = _NodeRoom(job.queue, pool.free[node])
            if not guard.allows(c, acc.taken):
                continue
            acc.gather(c, g)
            if not fits(acc):
                continue
            done.add(node)
            _drop_unneeded(acc, node, fits)
            _shrink_less_on(acc, node, fits)
            if best is None or (acc.cost, node) < (best[0], best[1]):
                best = (acc.cost, node, list(acc.chosen))
        if len(done) >= enough_nodes:
            break
    if best is None:
        return None, None
    return best[2], ((best[1], gpus),)


def _shrink_less_on(acc: _NodeRoom, node: int, fits: Callable[[_NodeRoom], bool]) -> None:
    """Shrink each chosen elastic job on `node` by no more than the fit there needs."""

    def account(c: Candidate, sign: int) -> None:
        acc.gather(c, sum(h for n, h in c.frees_on() if n == node), sign)

    chosen = list(acc.chosen)
    _take_less(chosen, account, lambda: fits(acc))


def _drop_unneeded(acc: _NodeRoom, node: int, fits: Callable[[_NodeRoom], bool]) -> None:
    """Drop, newest first, each victim on `node` without which the job still fits."""
    for victim in reversed(acc.chosen[:-1]):
        here = sum(h for n, h in victim.frees_on() if n == node)
        acc.gather(victim, here, -1)
        if not fits(acc):
            acc.gather(victim, here, +1)


def _whole_nodes(
    job: Job,
    candidates: Sequence[Candidate],
    free: Amounts,
    pool: NodePool | None,
    quota_ok: QuotaCheck,
    guard: _Borrowed,
    *,
    node_jobs: Sequence[set[str]],
) -> tuple[list[Candidate] | None, Placement | None]:
    """For a multi-node job: clear the cheapest nodes whose every job may be preempted."""
    assert pool is not None
    per = pool.gpus_per_node
    gpus = int(job.request.gpus)
    need = -(-gpus // per)  # a remainder takes a node of its own
    priced = _clearable_nodes(pool, candidates, node_jobs)
    if len(priced) < need:
        return None, None
    chosen: list[Candidate] = []
    seen: set[str] = set()
    nodes: list[int] = []
    taken: dict[str, Amounts] = {}
    for _, node, cands in sorted(priced, key=lambda p: (p[0], p[1])):
        new = [c for c in cands if c.running.job.id not in seen]
        trial = _all_allowed(guard, new, taken)
        if trial is None:
            continue
        taken = trial
        seen.update(c.running.job.id for c in new)
        chosen.extend(new)
        nodes.append(node)
        if len(nodes) == need:
            break
    else:
        return None, None
    freed = _Freed(job.queue)
    for c in chosen:
        freed.add(c)
    if not (_fits(free, freed.all, job.request) and quota_ok(freed.own)):
        return None, None
    nodes.sort()
    whole, rest = divmod(gpus, per)
    placement = [(n, per) for n in nodes[:whole]]
    if rest:
        placement.append((nodes[whole], rest))
    return chosen, tuple(placement)


def _clearable_nodes(
    pool: NodePool, candidates: Sequence[Candidate], node_jobs: Sequence[set[str]]
) -> list[tuple[float, int, list[Candidate]]]:
    """(price, node, victims) of every node that is empty or whose every job is a candidate."""
    per = pool.gpus_per_node
    by_id = {c.running.job.id: c for c in candidates if c.shrink is None}
    priced: list[tuple[float, int, list[Candidate]]] = []
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
            held = sum(g for c in cands for n, g in c.frees_on() if n == node)
            if free_gpus + held == per:
                # In price order: a node's jobs are a set, whose order changes with the hash
                # seed, and the victims' order decides what a straddling quota allows.
                cands.sort(key=lambda c: c.order)
                priced.append((sum(c.lost_gpu_s for c in cands), node, cands))
    return priced
