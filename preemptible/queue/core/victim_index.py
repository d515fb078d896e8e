"""What pricing a running job as a victim needs that stays the same while it runs, kept between
cycles.

Every victim search visits the running jobs of the queues it may take from, and at 10,000
running jobs recomputing each one's grace, minimum runtime and counted restore on every cycle
was most of a cycle's time. These depend only on the `RunningJob` (frozen: any change replaces
it) and on the preemption settings and policy, so `ClusterState` keeps them here: an entry is
computed the first time a search meets the job, reused while the same object runs, and dropped
when it finishes. A price that does not depend on the time (a job that saves on notice within
its grace loses its save and restore, whenever it goes) is kept too, with the rank and shrink it
was computed for. Settings or a policy that differ from the last search's start the index over.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from preemptible.queue.core.config import PreemptionSettings
from preemptible.queue.core.model import RunningJob
from preemptible.queue.core.negotiation import counted_restore_s, grace_seconds, min_runtime_seconds
from preemptible.queue.core.policy import Policy, VictimOrder

__all__ = ["Price", "VictimFacts", "VictimIndex"]


class Price(NamedTuple):
    """What preempting a running job now costs; the same whoever the preemptor is."""

    order: tuple[float | str, ...]
    lost_gpu_s: float
    grace_s: float
    shrinking_to: int | None = None
    """The size a shrink under way takes it to (`Candidate.shrinking_to`); None: none is."""


class VictimFacts(NamedTuple):
    """One running job's price terms that do not change while it runs."""

    running: RunningJob
    """The run they were computed for (a replaced run gets new facts)."""
    grace_s: float
    """The grace it would get (`victim_grace_s`)."""
    min_runtime_end: float
    """When it has run its negotiated minimum runtime (`min_runtime_end`)."""
    restore_s: float
    """Its restore as counted (at most `max_claimed_restore`)."""
    on_notice: bool
    """It saves on notice within its grace: a notice costs it only its save and restore,
    whenever it comes."""
    fixed: Price | None = None
    """Its price when `on_notice`, for the rank and shrink in `fixed_for`."""
    fixed_for: tuple[int, int | None] = (0, None)


class VictimIndex:
    """Per running job, its `VictimFacts` for one policy and one set of preemption settings."""

    __slots__ = ("_facts", "_policy", "_settings")

    def __init__(self) -> None:
        self._facts: dict[str, VictimFacts] = {}
        self._policy: Policy | None = None
        self._settings: PreemptionSettings | None = None

    def facts(self, rj: RunningJob, policy: Policy, settings: PreemptionSettings) -> VictimFacts:
        """`rj`'s facts, computed now unless they were for this very run."""
        if policy is not self._policy or settings is not self._settings:
            self._use(policy, settings)
        known = self._facts.get(rj.job.id)
        if known is not None and known.running is rj:
            return known
        job = rj.job
        grace = (
            grace_seconds(job.save_s, settings)
            if policy.negotiated_grace
            else (policy.fixed_grace_s)
        )
        facts = self._facts[job.id] = VictimFacts(
            running=rj,
            grace_s=grace,
            min_runtime_end=rj.started_at
            + min_runtime_seconds(job.save_s, job.restore_s, settings),
            restore_s=counted_restore_s(job.restore_s, settings),
            on_notice=job.checkpoint_on_notice and job.save_s <= grace,
        )
        return facts

    def price(
        self,
        rj: RunningJob,
        now: float,
        rank: int,
        shrinking_to: int | None,
        policy: Policy,
        settings: PreemptionSettings,
    ) -> Price:
        """The price of preempting `rj` at `now` (`lost_gpu_seconds`, in the policy's order)."""
        facts = self.facts(rj, policy, settings)
        if facts.fixed is not None and facts.fixed_for == (rank, shrinking_to):
            return facts.fixed
        job = rj.job
        gpus = max(rj.size, 1)
        if facts.on_notice:
            lost = gpus * (job.save_s + facts.restore_s)
        else:
            lost = gpus * (max(0.0, now - rj.checkpoint_time(now)) + facts.restore_s)
        order: tuple[float | str, ...]
        if policy.victim_order is VictimOrder.LOWEST_PRIORITY_NEWEST:
            order = (job.tier.rank, rank, -rj.started_at, job.id)
        else:
            freed = rj.size if shrinking_to is None else shrinking_to
            order = (lost / max(freed, 1), lost, rank, -rj.started_at, job.id)
        price = Price(order, lost, facts.grace_s, shrinking_to)
        if facts.on_notice:
            self._facts[job.id] = facts._replace(fixed=price, fixed_for=(rank, shrinking_to))
        return price

    def priced(
        self,
        runs: Iterable[RunningJob],
        now: float,
        ranks: Mapping[str, int],
        shrinking: Mapping[str, tuple[int, Any, Any]],
        policy: Policy,
        settings: PreemptionSettings,
        cache: dict[str, Price],
    ) -> Iterator[tuple[RunningJob, VictimFacts, Price]]:
        """Each of `runs` with its facts and its price at `now` (`price`; the rank and the size
        of a shrink under way from `ranks` and `shrinking`), through `cache`, the prices of this
        `now`: a victim search prices thousands of jobs, so the lookups are inline."""
        if policy is not self._policy or settings is not self._settings:
            self._use(policy, settings)
        known = self._facts
        for rj in runs:
            jid = rj.job.id
            facts = known.get(jid)
            if facts is None or facts.running is not rj:
                facts = self.facts(rj, policy, settings)
            price = cache.get(jid)
            if price is None:
                rank, under_way = ranks.get(jid, 0), shrinking.get(jid)
                to = None if under_way is None else under_way[0]
                if facts.fixed is not None and facts.fixed_for == (rank, to):
                    price = facts.fixed
                else:
                    price = self.price(rj, now, rank, to, policy, settings)
                cache[jid] = price
            yield rj, facts, price

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._facts

    def __len__(self) -> int:
        return len(self._facts)

    def drop(self, job_id: str) -> None:
        """The job no longer runs."""
        self._facts.pop(job_id, None)

    def _use(self, policy: Policy, settings: PreemptionSettings) -> None:
        """Searches now run under `policy` and `settings`: facts for others no longer hold
        (equal ones, as a shell that rebuilds its configuration passes, keep them)."""
        if policy != self._policy or settings != self._settings:
            self._facts.clear()
        self._policy, self._settings = policy, settings
