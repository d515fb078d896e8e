"""Moving small jobs off a node so that a blocked job gets a node block. Chooses; moves nothing.

With nodes, enough GPUs can be free by count while no node has the block a job needs: 3 free on
one node and 5 on another do not start an 8-GPU job, and the GPUs idle until enough jobs on one
node end (hours, on a busy cluster). When the job at the head of the line is blocked only by
that, a few small jobs on the node it would use can move instead: each saves on notice, exits,
and restarts at once on GPUs held for it on another node. A move costs the moved job a save and
a restore (as a preemption does), and buys the blocked job its start now.

Only jobs that save on notice within their grace move (a move loses nothing else), once they
have run their minimum runtime, outside the cooldown and within their queue's hourly budget,
and never a higher tier than the job they make room for. Together they may hold at most half
the GPUs the blocked job needs: moving more costs more than it wins, and every moved job must
fit, best fit, on the GPUs free elsewhere now.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from preemptible.queue.core.config import PreemptionSettings
from preemptible.queue.core.model import Job, RunningJob
from preemptible.queue.core.placement import NodePool, Placement
from preemptible.queue.core.policy import Policy
from preemptible.queue.core.preemption import (
    in_cooldown,
    min_runtime_end,
    queue_budget_left,
    saves_within_grace,
    victim_grace_s,
)
from preemptible.queue.core.state import ClusterState


@dataclass(frozen=True, kw_only=True, slots=True)
class Move:
    """One job to move: where it restarts, and what the move costs."""

    running: RunningJob
    restart_on: Placement
    lost_gpu_s: float
    grace_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class MovePlan:
    """Jobs whose move gives the blocked job `placement`."""

    moves: tuple[Move, ...]
    placement: Placement


def find_moves(
    job: Job,
    *,
    now: float,
    state: ClusterState,
    pool: NodePool,
    policy: Policy,
    settings: PreemptionSettings,
    taken: set[str],
    budget_used: Mapping[str, int],
    movers: dict[int, list[RunningJob]] | None = None,
) -> MovePlan | None:
    """The cheapest moves that give `job` a node block now, or None when there are none.

    `pool`: free GPUs per node after this cycle's decisions so far (read, not changed).
    `taken`: jobs already chosen as victims in this cycle.
    `movers`: per node, the jobs there that could move for any job (`_movers_on`), kept by
    the caller for the rest of its cycle: a cycle may search many times over the same state.
    Valid only while `state`, `now`, `policy` and `settings` stay the same.
    """
    per = pool.gpus_per_node
    gpus = int(job.request.gpus)
    if gpus > per and gpus % per:
        return None  # a remainder beside whole nodes: rare, and left to wait
    need = min(gpus, per)
    nodes_wanted = max(1, gpus // per)
    limit = gpus // 2
    shortfalls = _shortfalls(pool, state, need=need, limit=limit, nodes_wanted=nodes_wanted)
    if not shortfalls:
        return None
    options = _MoveOptions(
        job,
        now=now,
        state=state,
        policy=policy,
        settings=settings,
        taken=taken,
        budget_used=budget_used,
        movers={} if movers is None else movers,
        limit=limit,
    )
    empty = sorted(pool.by_free[per])
    targets = {n: need for n in empty[: nodes_wanted - 1]} if nodes_wanted > 1 else {}
    return _assemble(
        pool,
        _cheapest_first(shortfalls, options.option),
        targets,
        need=need,
        nodes_wanted=nodes_wanted,
        limit=limit,
        policy=policy,
        settings=settings,
    )


def _shortfalls(
    pool: NodePool, state: ClusterState, *, need: int, limit: int, nodes_wanted: int
) -> list[tuple[int, int]]:
    """(GPUs short of `need`, node) of the nodes short by at most `limit`, fewest short first:
    what each must move. Empty when no move is needed, enough nodes being free or about to be."""
    draining = {  # nodes that will have room once jobs already told to go have exited
        node
        for node, leaving in state.node_leaving.items()
        if pool.free[node] < need <= pool.free[node] + leaving
    }
    if len(pool.by_free[pool.gpus_per_node]) + len(draining) >= nodes_wanted:
        return []
    return sorted(
        (need - free, node)
        for free in range(max(0, need - limit), need)
        for node in pool.by_free[free]
        if node not in draining
    )


class _MoveOptions:
    """Per node, which of its jobs would move for one blocked job, fewest GPUs first."""

    def __init__(
        self,
        job: Job,
        *,
        now: float,
        state: ClusterState,
        policy: Policy,
        settings: PreemptionSettings,
        taken: set[str],
        budget_used: Mapping[str, int],
        movers: dict[int, list[RunningJob]],
        limit: int,
    ):
        self.job = job
        self.now = now
        self.state = state
        self.policy = policy
        self.settings = settings
        self.taken = taken
        self.budget_used = budget_used
        self.movers = movers
        self.limit = limit
        self.budgets: dict[str, int] = {}

    def may_move(self, rj: RunningJob) -> bool:
        """What `_movers_on` leaves to the asker: its tier, this cycle's choices, budgets."""
        vjob = rj.job
        if vjob.id in self.taken or vjob.tier.rank > self.job.tier.rank:
            return False
        if self.policy.anti_thrashing:
            q = vjob.queue
            if q not in self.budgets:
                used = self.budget_used.get(q, 0)
                self.budgets[q] = queue_budget_left(self.state, q, self.now, self.settings, used)
            if self.budgets[q] <= 0:
                return False
        return True

    def option(self, node: int, short: int) -> tuple[int, int, list[RunningJob]] | None:
        """The jobs to move off `node` to free `short` more GPUs there, fewest GPUs first."""
        if node not in self.movers:
            self.movers[node] = _movers_on(node, self.now, self.state, self.policy, self.settings)
        chosen = _fewest_gpus([rj for rj in self.movers[node] if self.may_move(rj)], short)
        if chosen is None:
            return None
        moved = sum(int(rj.job.request.gpus) for rj in chosen)
        return (moved, node, chosen) if moved <= self.limit else None


def _assemble(
    pool: NodePool,
    options: Iterator[tuple[int, int, list[RunningJob]]],
    targets: dict[int, int],
    *,
    need: int,
    nodes_wanted: int,
    limit: int,
    policy: Policy,
    settings: PreemptionSettings,
) -> MovePlan | None:
    """Take options cheapest first while each moved job finds a place elsewhere, until
    `nodes_wanted` nodes have `need` GPUs for the blocked job (`targets` holds empty ones)."""
    test = pool.copy()
    moves: list[Move] = []
    moved_gpus = 0
    for gpus_moved, node, chosen in options:
        if moved_gpus + gpus_moved > limit:
            break  # and so would every later option, which moves as many or more
        if test.free[node] != pool.free[node]:
            continue  # an earlier move's job lands on this node
        trial = test.copy()
        avoid = {*targets, node}
        planned = []
        for rj in sorted(chosen, key=lambda r: (-r.job.request.gpus, r.job.id)):
            where = trial.find(int(rj.job.request.gpus), avoid=avoid)
            if where is None:
                break
            trial.take(where)
            planned.append(_move(rj, where, policy, settings))
        else:
            test = trial
            targets[node] = need
            moves.extend(planned)
            moved_gpus += gpus_moved
            if len(targets) == nodes_wanted:
                break
    if len(targets) < nodes_wanted or not moves:
        return None
    return MovePlan(moves=tuple(moves), placement=tuple(sorted(targets.items())))


def _movers_on(
    node: int, now: float, state: ClusterState, policy: Policy, settings: PreemptionSettings
) -> list[RunningJob]:
    """The jobs on `node` that may move whoever asks, smallest first: on this node only, not
    leaving already, saving on notice within their grace, past their minimum runtime and
    outside the cooldown. Who asks (its tier) and this cycle's choices are checked apart."""
    found = []
    for job_id in state.node_jobs[node]:
        rj = state.running[job_id]
        vjob = rj.job
        if rj.terminating or len(rj.placement) != 1:
            continue
        if rj.gpus is not None or job_id in state.shrinking:
            continue  # an elastic job below its size restarts by a resize, not a move
        if not saves_within_grace(vjob, policy, settings):
            continue
        if policy.protect_min_runtime and now < min_runtime_end(rj, settings):
            continue
        if policy.anti_thrashing and in_cooldown(vjob, now, settings):
            continue
        found.append(rj)
    found.sort(key=lambda rj: (rj.job.request.gpus, rj.job.id))
    return found


def _cheapest_first(
    shortfalls: list[tuple[int, int]],
    option: Callable[[int, int], tuple[int, int, list[RunningJob]] | None],
) -> Iterator[tuple[int, int, list[RunningJob]]]:
    """Each node's option in (GPUs moved, node) order, finding a node's option only once it
    could come next: a node moves at least its shortfall, so a found option that sorts before
    the next node's (shortfall, node) sorts before everything not yet found. The first few
    options usually make the plan, and a cycle may search many times."""
    # A heap of the options found; nodes differ, so their job lists are never compared.
    found: list[tuple[int, int, list[RunningJob]]] = []
    i = 0
    while True:
        while i < len(shortfalls) and (not found or found[0][:2] > shortfalls[i]):
            short, node = shortfalls[i]
            i += 1
            if (o := option(node, short)) is not None:
                heapq.heappush(found, o)
        if not found:
            return
        yield heapq.heappop(found)


def _move(rj: RunningJob, where: Placement, policy: Policy, settings: PreemptionSettings) -> Move:
    vjob = rj.job
    lost = max(vjob.request.gpus, 1) * (vjob.save_s + vjob.restore_s)
    grace = victim_grace_s(vjob, policy, settings)
    return Move(running=rj, restart_on=where, lost_gpu_s=lost, grace_s=grace)


def _fewest_gpus(jobs: list[RunningJob], short: int) -> list[RunningJob] | None:
    """Jobs (sorted smallest first) freeing at least `short` GPUs, few GPUs moved: the smallest
    first until enough, or one job alone if that moves fewer. None if all of them fall short."""
    chosen: list[RunningJob] = []
    room = 0
    for rj in jobs:
        if room >= short:
            break
        chosen.append(rj)
        room += int(rj.job.request.gpus)
    if room < short:
        return None
    alone = next((rj for rj in jobs if rj.job.request.gpus >= short), None)
    if alone is not None and alone.job.request.gpus < room:
        return [alone]
    return chosen
