"""One `Policy` type for ours and the baselines, so that all run through the same cycle.

A policy is a set of switches over the cycle's phases (ordering, quota, preemption, backfill)
rather than a class per scheduler: the comparison in the simulator then measures the rules, not
five implementations. The baselines model the defaults of the systems they are named after:

- `fifo`: one line in submit order; the head blocks everyone (no quotas, no preemption).
- `priority`: tiers first, then submit order; strict head-of-line, no preemption.
- `kueue`: quota + borrowing + reclaim (`reclaimWithinCohort: Any`), preemption of lower
  priority within a queue, BestEffortFIFO (a blocked head does not block others), victims by
  lowest priority then most recently started, a fixed 30 s grace, no backfill.
- `slurm`: multifactor priority (QOS tier, fair share 2^(-usage/share), age), EASY backfill
  with a reservation for the blocked head; no quotas and no preemption (PreemptType=none).
- `preemptible` (ours): tiers, decayed weighted DRF fair share plus aging, quota + borrowing +
  reclaim, lower-tier preemption choosing the least lost work, negotiated grace and minimum
  runtime, anti-thrashing budgets, backfill with a reservation where work that would delay
  the reserved job still starts, on loan, when it checkpoints on notice, and idle capacity
  lent beyond the borrowing limit to work that checkpoints on notice.

Elastic jobs (`elastic.py`) are resized by `Policy.elastic`: ours prices a shrink against an
eviction; the baselines keep every job at its full size. A variant of a built-in policy is
named `NAME+elastic=MODE` (e.g. `preemptible+elastic=off`, `preemptible+elastic=priority`,
the latter the Kueue/KAI rule of shrinking the lowest priority first): `POLICIES` and
`get_policy` answer such names, while iterating `POLICIES` still gives only the built-ins, so
reports over "all" policies do not change.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from preemptible.errors import ConfigError


class Ordering(enum.StrEnum):
    """How pending jobs are ordered."""

    FIFO = "fifo"
    PRIORITY = "priority"
    KUEUE = "kueue"
    SLURM = "slurm"
    FAIR = "fair"


class VictimOrder(enum.StrEnum):
    """Which running jobs are preempted first."""

    LEAST_LOST_WORK = "least_lost_work"
    LOWEST_PRIORITY_NEWEST = "lowest_priority_newest"


class ElasticMode(enum.StrEnum):
    """What the core does with elastic jobs (`Job.min_gpus`)."""

    OFF = "off"
    """Ranges are ignored: every job runs at its full size and is evicted, as a rigid job."""
    PRICED = "priced"
    """Admit within the range; shrink instead of evicting when that loses less work than the
    cheapest eviction; grow when the rest of the run pays for the resize (`elastic.py`)."""
    PRIORITY = "priority"
    """The Kueue/KAI baseline: admit within the range; take GPUs from the lowest-priority
    elastic jobs first, down to their minimum, before evicting anyone, whatever either costs;
    grow whenever GPUs idle (no payback rule)."""

    @classmethod
    def parse(cls, value: str | ElasticMode) -> ElasticMode:
        """Read a mode from its name.

        Raises:
            ConfigError: not one of off, priced, priority.
        """
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ConfigError(
                f"unknown elastic mode {value!r}: use one of {', '.join(m.value for m in cls)}"
            ) from None


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """The switches that make a scheduler out of the shared cycle."""

    name: str
    """Name shown in reports."""
    ordering: Ordering
    """Order of pending jobs."""
    quotas: bool = False
    """Enforce nominal quota plus borrowing limit per queue."""
    reclaim: bool = False
    """A job within its queue's nominal quota may preempt work running on borrowed capacity."""
    tier_preemption: bool = False
    """A job may preempt lower-tier jobs."""
    tier_preemption_across_queues: bool = False
    """...also in other queues, where those run on borrowed capacity (else own queue only)."""
    victim_order: VictimOrder = VictimOrder.LEAST_LOST_WORK
    """How victims are chosen."""
    within_borrowed: bool = False
    """Victims of another queue come out of what it borrows when such a set frees enough
    (`victim_sets.py`); otherwise any victim of it while it still borrows, as kueue takes them."""
    backfill: bool = False
    """Reserve capacity for the first blocked job and backfill behind it."""
    loan_backfill: bool = False
    """A checkpoint-aware job that would delay the reservation starts anyway, on loan: the
    reserved job preempts it when its capacity is due (after the loaned job's minimum
    runtime), so GPUs do not idle while capacity drains for a big job."""
    reserve_only_starving: bool = False
    """Reserve only for a starving job (`ordering.py`); others skip ahead like kueue's
    BestEffortFIFO, so a big job blocks nobody until it starves."""
    head_of_line: bool = False
    """Stop at the first job that does not fit (strict order)."""
    protect_min_runtime: bool = False
    """Never preempt a job before its negotiated minimum runtime (reclaim aside)."""
    anti_thrashing: bool = False
    """Per-job cooldown and per-queue hourly preemption budget."""
    negotiated_grace: bool = False
    """Grace from the job's measured save cost; otherwise `fixed_grace_s`."""
    fixed_grace_s: float = 30.0
    """Grace when not negotiated (Kubernetes' default terminationGracePeriodSeconds)."""
    max_preemption_plans: int = 8
    """At most this many victim searches per cycle (each scans running jobs)."""
    nominal_first: bool = False
    """FAIR ordering: a borrower is ordered after other queues' pending work within their
    nominal quota of the same tier, or of a lower tier (then in that tier), as kueue orders
    work within nominal quota first. Capacity given to it first would be reclaimed at once,
    for a lost save and restore. A queue's own work does not demote its borrowers."""
    defragment: bool = False
    """With nodes, a blocked job ahead of the reservation that fits by count but finds no node
    block may move a few small checkpoint-aware jobs to other nodes to get one (`defrag.py`)."""
    patient_reclaim: bool = False
    """A job within nominal quota that could start only by reclaiming first waits for capacity
    to free on its own, for as long as the nominal guarantee leaves room (patience.py):
    every reclaim costs a save and a restore, and a job ends somewhere every few minutes."""
    patient_tier_preemption: bool = False
    """A job that could start only by preempting lower tiers first waits up to
    `preemption.tier_patience` after its submission for capacity to free on its own
    (patience.py): on a busy cluster some job ends every few minutes, and every preemption
    costs its victims a save and a restore."""
    beyond_limit: bool = False
    """Capacity the walk leaves idle goes to checkpoint-aware work over its queue's borrowing
    limit, which is then the first reclaimed: any job of another queue within its own limit
    may preempt it (`cycle.py`, `preemption.py`). The limit protects the other queues through
    reclaim, at the cost of a save and a restore, instead of through idle GPUs."""
    elastic: ElasticMode = ElasticMode.OFF
    """Whether and how elastic jobs are admitted smaller, shrunk and grown (`ElasticMode`);
    `[policy] elastic` may override it (`effective_elastic`)."""


class _PolicyTable(dict[str, Policy]):
    """The built-in policies; also answers `NAME+elastic=MODE` variants without listing them."""

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or (
            isinstance(name, str) and _variant(self, name) is not None
        )

    def __missing__(self, name: str) -> Policy:
        variant = _variant(self, name)
        if variant is None:
            raise KeyError(name)
        return variant


def _variant(table: dict[str, Policy], name: str) -> Policy | None:
    """`preemptible+elastic=off` -> the `preemptible` policy with `elastic` off, or None."""
    base, sep, modifier = name.partition("+")
    key, eq, value = modifier.partition("=")
    if not sep or not eq or key != "elastic" or not dict.__contains__(table, base):
        return None
    try:
        mode = ElasticMode(value)
    except ValueError:
        return None
    return dataclasses.replace(dict.__getitem__(table, base), name=name, elastic=mode)


POLICIES: dict[str, Policy] = _PolicyTable(
    {
        "fifo": Policy(name="fifo", ordering=Ordering.FIFO, head_of_line=True),
        "priority": Policy(name="priority", ordering=Ordering.PRIORITY, head_of_line=True),
        "kueue": Policy(
            name="kueue",
            ordering=Ordering.KUEUE,
            quotas=True,
            reclaim=True,
            tier_preemption=True,
            victim_order=VictimOrder.LOWEST_PRIORITY_NEWEST,
        ),
        "slurm": Policy(name="slurm", ordering=Ordering.SLURM, backfill=True),
        "preemptible": Policy(
            name="preemptible",
            ordering=Ordering.FAIR,
            quotas=True,
            reclaim=True,
            tier_preemption=True,
            tier_preemption_across_queues=True,
            victim_order=VictimOrder.LEAST_LOST_WORK,
            within_borrowed=True,
            backfill=True,
            loan_backfill=True,
            protect_min_runtime=True,
            anti_thrashing=True,
            negotiated_grace=True,
            nominal_first=True,
            patient_reclaim=True,
            defragment=True,
            patient_tier_preemption=True,
            beyond_limit=True,
            elastic=ElasticMode.PRICED,
        ),
    }
)
"""The built-in policies by name; `preemptible` is ours, the others are baselines. Variants
`NAME+elastic=MODE` are answered too (the module docstring)."""

BASELINES = ("fifo", "priority", "kueue", "slurm")


def get_policy(name: str) -> Policy:
    """The built-in policy called `name`.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown policy {name!r}; choose one of {', '.join(POLICIES)} (or NAME+elastic=MODE, "
            "MODE one of off, priced, priority)"
        ) from None


def effective_elastic(policy: Policy, setting: ElasticMode | None) -> ElasticMode:
    """The elastic mode a cycle applies: the policy's, unless `[policy] elastic` says
    otherwise; the setting may change how a policy that resizes does it, or turn it off, but
    never makes a baseline that does not resize start to."""
    if setting is None or policy.elastic is ElasticMode.OFF:
        return policy.elastic
    return setting
