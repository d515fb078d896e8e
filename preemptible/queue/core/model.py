"""The data the scheduling core reasons about: resources, queues, jobs, decisions.

Everything here is a frozen, slotted, keyword-only dataclass so that a snapshot handed to the
cycle cannot be changed behind its back, and so that the service and the simulator build the same
objects. Times are plain floats in seconds on whatever clock the shell uses; the core never reads
a clock itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from preemptible.errors import ConfigError


class Tier(enum.StrEnum):
    """Priority tier of a job. Higher tiers are ordered first and may preempt lower ones."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """0 for low up to 3 for critical; larger is more important."""
        return _TIER_RANK[self]

    @classmethod
    def parse(cls, value: str | Tier) -> Tier:
        """Read a tier from its name, case-insensitively.

        Raises:
            ConfigError: the name is not one of critical, high, normal, low.
        """
        if isinstance(value, Tier):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ConfigError(
                f"unknown tier {value!r}: use one of critical, high, normal, low"
            ) from None


_TIER_RANK = {Tier.LOW: 0, Tier.NORMAL: 1, Tier.HIGH: 2, Tier.CRITICAL: 3}


@dataclass(frozen=True, kw_only=True, slots=True)
class Resources:
    """An amount of GPUs, CPUs and memory (a request, a quota, a capacity)."""

    gpus: int = 0
    """Whole GPUs."""
    cpus: float = 0.0
    """CPU cores."""
    memory_gb: float = 0.0
    """Memory in GiB."""

    def as_tuple(self) -> tuple[float, float, float]:
        """The three amounts in a fixed order, for fast arithmetic in hot loops."""
        return (self.gpus, self.cpus, self.memory_gb)

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            gpus=self.gpus + other.gpus,
            cpus=self.cpus + other.cpus,
            memory_gb=self.memory_gb + other.memory_gb,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            gpus=self.gpus - other.gpus,
            cpus=self.cpus - other.cpus,
            memory_gb=self.memory_gb - other.memory_gb,
        )


NO_LIMIT = float("inf")


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """A per-resource limit; a missing resource is unlimited (infinity)."""

    gpus: float = NO_LIMIT
    """GPU limit."""
    cpus: float = NO_LIMIT
    """CPU limit."""
    memory_gb: float = NO_LIMIT
    """Memory limit in GiB."""

    def as_tuple(self) -> tuple[float, float, float]:
        """The three limits in the order of `Resources.as_tuple`."""
        return (self.gpus, self.cpus, self.memory_gb)


@dataclass(frozen=True, kw_only=True, slots=True)
class Queue:
    """One team's queue: its weight in fair share, guaranteed quota and how much it may borrow."""

    name: str
    """Unique queue name."""
    weight: float = 1.0
    """Relative fair-share weight (> 0)."""
    nominal: Limits = field(default_factory=lambda: Limits(gpus=0, cpus=NO_LIMIT))
    """Guaranteed capacity. Work within it is never reclaimed."""
    borrowing_limit: Limits = field(default_factory=Limits)
    """How far beyond `nominal` the queue may borrow idle capacity (reclaimable)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The capacity being scheduled, optionally as identical nodes for placement."""

    gpus: int
    """Total GPUs."""
    cpus: float = 0.0
    """Total CPUs; 0 means CPUs are not scheduled."""
    memory_gb: float = 0.0
    """Total memory; 0 means memory is not scheduled."""
    nodes: int | None = None
    """Number of nodes, or None for one flat pool."""
    gpus_per_node: int | None = None
    """GPUs on each node (with `nodes`)."""

    @property
    def capacity(self) -> Resources:
        """The whole cluster as `Resources`."""
        return Resources(gpus=self.gpus, cpus=self.cpus, memory_gb=self.memory_gb)


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """A job as the scheduler sees it, pending or running."""

    id: str
    """Unique id."""
    queue: str
    """Name of its queue."""
    request: Resources
    """What it asks for."""
    tier: Tier = Tier.NORMAL
    """Priority tier."""
    submitted_at: float = 0.0
    """Submission time; aging counts from here (kept across requeues)."""
    gang: bool | None = None
    """All-or-nothing; None means the default (true for more than one GPU)."""
    estimate_s: float | None = None
    """Runtime estimate for backfill, if the user gave one."""
    save_s: float = 0.0
    """Measured checkpoint save cost (p95), seconds."""
    restore_s: float = 0.0
    """Measured restore cost, seconds."""
    checkpoint_interval_s: float | None = None
    """Period of its regular checkpoints; None means it has none."""
    checkpoint_on_notice: bool = False
    """True when the job saves on a preemption notice (uses the SDK)."""
    last_preempted_at: float | None = None
    """When it was last preempted, for the anti-thrashing window."""
    preemptions: int = 0
    """How often it was preempted so far."""
    min_gpus: int | None = None
    """Smallest size it may run at (an elastic job); None: rigid, it runs at `request.gpus`."""
    gpus_multiple: int = 1
    """An elastic job's size is a multiple of this (e.g. 2 for pairs of tensor-parallel ranks)."""
    last_resized_at: float | None = None
    """When it was last resized, for the minimum interval between resizes (`elastic.py`)."""

    @property
    def is_gang(self) -> bool:
        """Whether the job needs all its GPUs at once."""
        return self.gang if self.gang is not None else self.request.gpus > 1

    def expected_runtime_s(self, default_estimate_s: float) -> float:
        """How long a run is expected to hold its resources: the estimate (or the default, as
        SLURM assumes a partition's time limit) plus the restore cost."""
        estimate = self.estimate_s if self.estimate_s is not None else default_estimate_s
        return estimate + self.restore_s

    @property
    def is_elastic(self) -> bool:
        """Whether it may run at fewer GPUs than it asks for."""
        return self.min_gpus is not None and self.min_gpus < self.request.gpus

    def sizes(self) -> tuple[int, ...]:
        """The sizes it may run at, largest (its request) first: multiples of `gpus_multiple`
        from `request.gpus` down to `min_gpus`; only its request when rigid."""
        full = self.request.gpus
        if self.min_gpus is None or self.min_gpus >= full:
            return (full,)
        step = max(self.gpus_multiple, 1)
        return tuple(g for g in range(full, self.min_gpus - 1, -step) if g % step == 0)

    def at_size(self, gpus: int) -> Resources:
        """Its request at `gpus` GPUs: CPUs and memory in proportion (they are per rank)."""
        full = self.request
        if gpus == full.gpus or not full.gpus:
            return full
        share = gpus / full.gpus
        return Resources(gpus=gpus, cpus=full.cpus * share, memory_gb=full.memory_gb * share)


def elastic_range_problem(
    gpus: int, min_gpus: int | None, gpus_multiple: int, cluster_gpus: int
) -> str | None:
    """What is wrong with a size range `min_gpus`..`gpus` on `gpus_multiple` on a cluster of
    `cluster_gpus`, with what to change; None when nothing is. (For a submission, a trace row
    or a `Job`: each caller says whose range it is.)"""
    low, step = min_gpus, gpus_multiple
    if step < 1:
        return f"gpus_multiple must be 1 or more, not {step}"
    if low is None:
        if step != 1 and gpus % step:
            return (
                f"gpus_multiple {step} does not divide gpus {gpus}; give a multiple that divides it"
            )
        return None
    if low < 1:
        return f"min_gpus must be 1 or more, not {low}"
    if low > gpus:
        return f"min_gpus {low} is more than gpus {gpus}; give min_gpus <= gpus"
    if gpus % step or low % step:
        return f"gpus_multiple {step} must divide both gpus {gpus} and min_gpus {low}"
    if low > cluster_gpus:
        return (
            f"even its smallest size, {low} GPUs, is more than the cluster's {cluster_gpus}; "
            "lower min_gpus"
        )
    return None


def check_elastic_range(job: Job, cluster: Cluster) -> None:
    """Check a job's size range (`elastic_range_problem`).

    Raises:
        ConfigError: `min_gpus` below 1 or above `request.gpus`, a `gpus_multiple` below 1 or
            that does not divide both ends of the range, or a range whose smallest size does
            not fit the cluster.
    """
    problem = elastic_range_problem(job.request.gpus, job.min_gpus, job.gpus_multiple, cluster.gpus)
    if problem is not None:
        raise ConfigError(f"job {job.id!r}: {problem}")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunningJob:
    """A job that holds resources, with the facts that price preempting it."""

    job: Job
    """The job."""
    started_at: float
    """When this run (after the latest admission) started."""
    placement: tuple[tuple[int, int], ...] = ()
    """(node index, GPUs) pairs when the cluster has nodes; empty for a flat pool."""
    last_checkpoint_at: float | None = None
    """Last completed checkpoint, if known; otherwise derived from the interval."""
    terminating: bool = False
    """A preemption notice was sent; it still holds its resources until it exits."""
    loan_for: str | None = None
    """The reserved job it started ahead of although it may delay it: that job may preempt it
    once it has run its minimum runtime (`Policy.loan_backfill`); None when not on loan."""
    gpus: int | None = None
    """GPUs it holds now, fewer than its request when an elastic job runs smaller; None: its
    request. Everything that counts capacity counts `held`, never the request."""

    @property
    def size(self) -> int:
        """GPUs it holds now."""
        return self.job.request.gpus if self.gpus is None else self.gpus

    @property
    def held(self) -> Resources:
        """What it holds now: its request at its current size."""
        return self.job.request if self.gpus is None else self.job.at_size(self.gpus)

    def checkpoint_time(self, now: float) -> float:
        """The latest time at which this run's progress was saved (the run start if never)."""
        if self.last_checkpoint_at is not None:
            return self.last_checkpoint_at
        interval = self.job.checkpoint_interval_s
        begin = self.started_at + self.job.restore_s
        if not interval or now <= begin:
            return self.started_at
        return begin + ((now - begin) // interval) * interval


# --- decisions -------------------------------------------------------------------------------


class SearchKey(NamedTuple):
    """The kind of job a victim search was for; a failed search backs off this kind."""

    queue: str
    tier_rank: int
    gpus: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Admit:
    """Start `job_id` now, on `placement` (node, GPUs) pairs if the cluster has nodes."""

    job_id: str
    placement: tuple[tuple[int, int], ...] = ()
    borrowing: bool = False
    """True when part of it runs on borrowed (reclaimable) capacity."""
    backfill: bool = False
    """True when it was started ahead of a reserved head job."""
    loan_for: str | None = None
    """The reserved job it may delay and so may be preempted by (`RunningJob.loan_for`)."""
    reason: str = ""
    gpus: int | None = None
    """GPUs it starts with: fewer than its request for an elastic job admitted at what fits
    now (`RunningJob.gpus`); None: its request."""


VictimKind = Literal["tier", "reclaim", "beyond_limit", "loan"]
"""Why a running job may be a victim (`preemption.py`'s module docstring)."""

PreemptKind = Literal[VictimKind, "move"]
"""Which rule sent a notice, so that what each rule costs can be counted apart:

- "tier": a higher tier preempts a lower one;
- "reclaim": a queue within its nominal quota takes back capacity another queue borrowed;
- "beyond_limit": capacity lent past a borrowing limit is taken back (`Policy.beyond_limit`);
- "loan": a reserved job takes back capacity lent to work that started ahead of it;
- "move": the job restarts at once on another node so that a blocked job gets a node block.
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Preempt:
    """Send `job_id` a preemption notice with `grace_s` seconds to save and exit."""

    job_id: str
    grace_s: float
    for_job: str
    """The job the capacity is freed for."""
    lost_gpu_s: float
    """Estimated GPU-seconds this preemption costs (lost work plus restore)."""
    kind: PreemptKind
    """The rule that sent it."""
    for_nodes: tuple[tuple[int, int], ...] = ()
    """(node, GPUs) where `for_job` is to start once its victims exit, when the cluster has
    nodes: held for it meanwhile, so that a third job cannot take them."""
    restart_on: tuple[tuple[int, int], ...] = ()
    """A move (`defrag.py`): (node, GPUs) where this job restarts at once after it has saved,
    held for it meanwhile. Empty for every other preemption."""
    reason: str = ""

    @property
    def reclaim(self) -> bool:
        """True when it takes back borrowed capacity rather than serving a higher tier."""
        return self.kind in ("reclaim", "beyond_limit")

    @property
    def loan(self) -> bool:
        """True when the job it is freed for takes back capacity lent to it
        (`RunningJob.loan_for`)."""
        return self.kind == "loan"


ResizeKind = Literal["shrink", "grow"]
"""A shrink gives GPUs to another job instead of an eviction; a grow takes idle ones."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Resize:
    """Tell the elastic job `job_id` to save at its next step and restart at `gpus` GPUs.

    A shrink keeps holding its GPUs until it has saved (within `grace_s`), then restarts on
    `placement`; what it gives up goes first to `for_job` (nominated, as for a `Preempt`). A
    grow holds its new GPUs from the notice on.
    """

    job_id: str
    gpus: int
    """Its size after the resize."""
    grace_s: float
    """Seconds to save before the restart (a shrink's victim gets what an eviction would)."""
    kind: ResizeKind
    for_job: str | None = None
    """The job a shrink frees GPUs for; None for a grow."""
    lost_gpu_s: float = 0.0
    """Estimated GPU-seconds the resize costs: the save on its current GPUs plus the restore
    on its new ones (`elastic.resize_lost_gpu_s`)."""
    placement: tuple[tuple[int, int], ...] = ()
    """(node, GPUs) it holds after the resize, when the cluster has nodes."""
    for_nodes: tuple[tuple[int, int], ...] = ()
    """As `Preempt.for_nodes`: where `for_job` is to start, held for it meanwhile."""
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class GrowPrice:
    """What growing a job gains and costs, in GPU-seconds (docs/internals/grow-when-it-pays.md)."""

    gained_gpu_s: float
    """The added GPUs over the part of its remaining run they would otherwise idle."""
    resize_gpu_s: float
    """What the grow itself loses: a save on the GPUs it holds, a restore on all after."""
    back_gpu_s: float
    """What shrinking it back loses, when that is expected (0 when it is not)."""
    idle_s: float
    """How long the added GPUs are expected to stay unwanted by others (`idle_horizon_s`)."""
    payback: float
    """The gain must be at least this many times the cost (`grow_payback`)."""

    @property
    def cost_gpu_s(self) -> float:
        """The grow and the expected shrink back."""
        return self.resize_gpu_s + self.back_gpu_s

    @property
    def pays(self) -> bool:
        """gained >= payback x (grow + expected shrink back)."""
        return self.gained_gpu_s >= self.payback * self.cost_gpu_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Reserve:
    """Capacity is held for the blocked head job `job_id`, expected to start at `start_at`."""

    job_id: str
    start_at: float
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class CycleResult:
    """What one cycle decided, with a readable reason for every job it looked at."""

    admit: tuple[Admit, ...]
    preempt: tuple[Preempt, ...]
    reserve: tuple[Reserve, ...]
    pending: dict[str, str]
    """job id -> why it is still pending, for every pending job the cycle examined."""
    default_reason: str
    """Why pending jobs not in `pending` wait (the cycle stopped before them)."""
    fragmentation: float
    """Share of free GPUs that no pending job shape can use (0 without nodes)."""
    examined: int
    """How many pending jobs the cycle looked at."""
    failed_preemptions: tuple[SearchKey, ...] = ()
    """(queue, tier rank, gpus) whose victim search found nothing; the shell may back off."""
    rerun: bool = False
    """A job within nominal quota found no victims although jobs were admitted in this cycle
    (they may be reclaimable once started): the shell should run another cycle right away."""
    wake_at: float | None = None
    """The shell should run a cycle by then even if nothing happens: a job that waits before
    reclaiming (`Policy.patient_reclaim`) reclaims at that time if still blocked."""
    resize: tuple[Resize, ...] = ()
    """Elastic jobs to shrink (instead of evicting) or grow (`elastic.py`)."""

    def reason_for(self, job_id: str) -> str:
        """Why a job is pending (or what happened to it) after this cycle."""
        decisions: tuple[Admit | Preempt | Resize | Reserve, ...] = (
            *self.admit,
            *self.preempt,
            *self.resize,
            *self.reserve,
        )
        for decision in decisions:
            if decision.job_id == job_id:
                return decision.reason
        return self.pending.get(job_id, self.default_reason)
