"""Policy export: one queue configuration as Kueue objects or as SLURM settings.

The same `queue.toml` drives the simulator, the reference queue manager and, through this module,
a cluster's own scheduler. These are pure functions from a `QueueConfig` to text; the CLI
(`preemptible queue export`) writes the text to files or stdout.

Neither scheduler can say everything the config says. Rather than drop a setting silently, each
output starts with comments that name what was not expressed and where it goes instead (the
negotiated grace, for example, becomes the pod's `terminationGracePeriodSeconds` or a SLURM
GraceTime that is an upper bound). docs/user-guide/schedulers.md explains the mapping.

Kueue: a ResourceFlavor, a Cohort holding the capacity that no queue is guaranteed, one
ClusterQueue per queue (nominal quota, borrowing limit, fair-sharing weight, preemption), a
LocalQueue per queue in its namespace, the Namespaces, and a WorkloadPriorityClass per tier.
SLURM: a `slurm.conf` fragment (a partition per tier, `preempt/partition_prio`, REQUEUE,
GraceTime, multifactor priority with the fair-share half-life) and a `sacctmgr` script (an
account per queue with its fair share and a GrpTRES cap). Partitions rather than QOS because
partition preemption works without slurmdbd (the accounts and their caps need it).
"""

from __future__ import annotations

import enum
import math
import re
import textwrap
from collections.abc import Iterable
from typing import Any

import yaml

from preemptible.errors import ConfigError
from preemptible.queue.core.config import QueueConfig
from preemptible.queue.core.model import Limits, Queue, Tier
from preemptible.queue.core.resources import values

__all__ = [
    "KUEUE_API_VERSIONS",
    "TIER_PRIORITY",
    "ExportTarget",
    "export_files",
    "kueue_objects",
    "kueue_yaml",
    "sacctmgr_script",
    "slurm_conf",
]

KUEUE_API_VERSIONS = ("v1beta2", "v1beta1")
"""Kueue API versions the export can write; v1beta2 is the storage version of current Kueue."""

TIER_PRIORITY: dict[Tier, int] = {
    Tier.LOW: -100,
    Tier.NORMAL: 0,
    Tier.HIGH: 100,
    Tier.CRITICAL: 200,
}
"""Kueue priority of each tier. `normal` is 0, the priority of a workload with no class, so an
unlabelled job ranks as our default tier does."""

_SLURM_PRIORITY_TIER = {Tier.LOW: 1, Tier.NORMAL: 2, Tier.HIGH: 3, Tier.CRITICAL: 4}
_TIERS = (Tier.CRITICAL, Tier.HIGH, Tier.NORMAL, Tier.LOW)
_GPU = "nvidia.com/gpu"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SLURM_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_PRIORITY_WEIGHT = 10000


class ExportTarget(enum.StrEnum):
    """The schedulers `queue export` writes for."""

    KUEUE = "kueue"
    SLURM = "slurm"


def export_files(config: QueueConfig, to: ExportTarget | str, **options: Any) -> dict[str, str]:
    """The files of one export, by name: `kueue.yaml`, or `slurm.conf` and `sacctmgr.sh`.

    Args:
        config: the parsed queue configuration.
        to: "kueue" or "slurm".
        **options: passed to `kueue_yaml` (namespace, cohort, flavor, api_version).

    Raises:
        ConfigError: the target is unknown or the config cannot be exported to it.
    """
    try:
        target = ExportTarget(to)
    except ValueError:
        raise ConfigError(f"unknown export target {to!r}; use kueue or slurm") from None
    if target is ExportTarget.KUEUE:
        return {"kueue.yaml": kueue_yaml(config, **options)}
    if options:
        raise ConfigError(f"the slurm export takes no options (got {', '.join(sorted(options))})")
    return {"slurm.conf": slurm_conf(config), "sacctmgr.sh": sacctmgr_script(config)}


# --- Kueue ---------------------------------------------------------------------------------------


def kueue_objects(
    config: QueueConfig,
    *,
    namespace: str | None = None,
    cohort: str = "preemptible",
    flavor: str = "default-flavor",
    api_version: str = "v1beta2",
) -> list[dict[str, Any]]:
    """Kueue objects (and the Namespaces of the LocalQueues) for `config`.

    Args:
        config: the parsed queue configuration; `[cluster] gpus` must be a number.
        namespace: the namespace of every LocalQueue; None puts each in a namespace named
            after its queue.
        cohort: the name of the Cohort that all ClusterQueues join.
        flavor: the name of the one ResourceFlavor.
        api_version: "v1beta2" (Kueue's storage version) or "v1beta1".

    Raises:
        ConfigError: a value has no Kueue form (`gpus = "auto"`, fractional GPUs, a name that is
            not a DNS label, nominal quotas above the cluster).
    """
    if api_version not in KUEUE_API_VERSIONS:
        raise ConfigError(
            f"unknown Kueue API version {api_version!r}; use {' or '.join(KUEUE_API_VERSIONS)}"
        )
    if config.gpus_auto:
        raise ConfigError(
            'cluster.gpus = "auto" cannot be exported to Kueue: its quotas are numbers; '
            "give the cluster's GPU count"
        )
    for what, name in (("cohort", cohort), ("flavor", flavor)):
        _check_dns_label(name, what)
    for queue in config.queues:
        _check_dns_label(queue.name, "queue name")
    if namespace is not None:
        _check_dns_label(namespace, "namespace")
    api = f"kueue.x-k8s.io/{api_version}"
    resources = _kueue_resources(config)
    objects: list[dict[str, Any]] = [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": flavor}, "spec": {}},
        _cohort(config, api, cohort, flavor, resources),
    ]
    for queue in config.queues:
        objects.append(_cluster_queue(config, queue, api, api_version, cohort, flavor, resources))
    namespaces = [namespace] if namespace else [q.name for q in config.queues]
    for name in dict.fromkeys(namespaces):
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    for queue in config.queues:
        objects.append(
            {
                "apiVersion": api,
                "kind": "LocalQueue",
                "metadata": {"name": queue.name, "namespace": namespace or queue.name},
                "spec": {"clusterQueue": queue.name},
            }
        )
    for tier in _TIERS:
        objects.append(
            {
                "apiVersion": api,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": tier.value},
                "value": TIER_PRIORITY[tier],
                "description": f"preemptible tier {tier.value}",
            }
        )
    return objects


def kueue_yaml(config: QueueConfig, **options: Any) -> str:
    """`kueue_objects` as multi-document YAML, after a comment on what Kueue cannot express.

    Raises:
        ConfigError: as `kueue_objects`.
    """
    objects = kueue_objects(config, **options)
    header = _comment(_kueue_notes(config))
    body = yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, width=100)
    return f"{header}---\n{body}"


def _check_dns_label(name: str, what: str) -> None:
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ConfigError(
            f"{what} {name!r} is not a valid Kubernetes name: use at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit"
        )


# (resource name, Limits attribute, cluster amount); only the resources the cluster schedules.
_Resource = tuple[str, str, float]


def _kueue_resources(config: QueueConfig) -> list[_Resource]:
    cluster = config.cluster
    out: list[_Resource] = [(_GPU, "gpus", float(cluster.gpus))]
    if cluster.cpus > 0:
        out.append(("cpu", "cpus", cluster.cpus))
    if cluster.memory_gb > 0:
        out.append(("memory", "memory_gb", cluster.memory_gb))
    return out


def _quantity(attr: str, amount: float, where: str) -> int | str:
    """A Kubernetes quantity: whole GPUs, CPUs (millicores when fractional), memory in Gi/Mi."""
    if attr == "gpus":
        if amount != int(amount):
            raise ConfigError(f"{where}: {amount:g} GPUs is not a whole number; Kueue counts GPUs")
        return int(amount)
    if attr == "cpus":
        return int(amount) if amount == int(amount) else f"{round(amount * 1000)}m"
    if amount == int(amount):
        return f"{int(amount)}Gi"
    return f"{round(amount * 1024)}Mi"


def _pool(config: QueueConfig, resources: list[_Resource]) -> list[tuple[_Resource, float]]:
    """What no queue is guaranteed, per resource: the cluster minus the finite nominal quotas."""
    out = []
    for resource in resources:
        _, attr, total = resource
        guaranteed = sum(
            getattr(q.nominal, attr)
            for q in config.queues
            if math.isfinite(getattr(q.nominal, attr))
        )
        if guaranteed > total:
            raise ConfigError(
                f"the queues' nominal {attr} add up to {guaranteed:g} but the cluster has "
                f"{total:g}; lower a nominal quota or raise cluster.{attr}"
            )
        out.append((resource, total - guaranteed))
    return out


def _group(flavor: str, amounts: list[tuple[_Resource, dict[str, int | str]]]) -> dict[str, Any]:
    return {
        "coveredResources": [name for (name, _, _), _ in amounts],
        "flavors": [
            {
                "name": flavor,
                "resources": [{"name": name, **quota} for (name, _, _), quota in amounts],
            }
        ],
    }


def _cohort(
    config: QueueConfig, api: str, name: str, flavor: str, resources: list[_Resource]
) -> dict[str, Any]:
    # The unguaranteed capacity belongs to the cohort, which lends it to every member: in Kueue
    # the cohort's capacity is the sum of its members' quotas and its own.
    pool = [
        (resource, {"nominalQuota": _quantity(resource[1], left, f"cohort {name}")})
        for resource, left in _pool(config, resources)
        if left > 0
    ]
    spec: dict[str, Any] = {"resourceGroups": [_group(flavor, pool)]} if pool else {}
    return {"apiVersion": api, "kind": "Cohort", "metadata": {"name": name}, "spec": spec}


def _cluster_queue(
    config: QueueConfig,
    queue: Queue,
    api: str,
    api_version: str,
    cohort: str,
    flavor: str,
    resources: list[_Resource],
) -> dict[str, Any]:
    amounts = []
    for resource in resources:
        _, attr, _ = resource
        where = f"queue {queue.name}"
        nominal = getattr(queue.nominal, attr)
        borrowing = getattr(queue.borrowing_limit, attr)
        quota: dict[str, int | str] = {}
        if math.isfinite(nominal):
            quota["nominalQuota"] = _quantity(attr, nominal, where)
            if math.isfinite(borrowing):
                quota["borrowingLimit"] = _quantity(attr, borrowing, where)
        else:
            # Unlimited nominal: nothing guaranteed, everything borrowable (see the notes).
            quota["nominalQuota"] = _quantity(attr, 0, where)
        amounts.append((resource, quota))
    enabled = config.preemption.enabled
    spec: dict[str, Any] = {
        ("cohortName" if api_version == "v1beta2" else "cohort"): cohort,
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO" if config.policy.backfill else "StrictFIFO",
        "resourceGroups": [_group(flavor, amounts)],
        "preemption": {
            # Borrowed work is reclaimed whatever its tier; a queue's own lower tiers may be
            # preempted; while borrowing, lower tiers on other queues' borrowed capacity too.
            "reclaimWithinCohort": "Any" if enabled else "Never",
            "borrowWithinCohort": {"policy": "LowerPriority" if enabled else "Never"},
            "withinClusterQueue": "LowerPriority" if enabled else "Never",
        },
        "fairSharing": {"weight": _weight(queue.weight)},
    }
    return {
        "apiVersion": api,
        "kind": "ClusterQueue",
        "metadata": {"name": queue.name},
        "spec": spec,
    }


def _weight(weight: float) -> int | str:
    return int(weight) if weight == int(weight) else f"{weight:g}"


def _kueue_notes(config: QueueConfig) -> list[str]:
    p, pre = config.policy, config.preemption
    notes = [
        "Kueue objects generated by `preemptible queue export --to kueue` from a preemptible "
        "queue config. Do not edit: change the config and export again.",
        "",
        "Preemption, with Kueue's classic algorithm: borrowed work is reclaimed whatever its "
        "tier (reclaimWithinCohort: Any); lower tiers are preempted in the same queue "
        "(withinClusterQueue) and, by a borrowing queue, on other queues' borrowed capacity "
        "(borrowWithinCohort)."
        if config.preemption.enabled
        else "Preemption is off.",
        "",
        "Not expressed here (Kueue has no equivalent):",
        f"- Negotiated grace per job, clamp({pre.grace_safety:g} * save_p95 + "
        f"{_dur(pre.grace_margin_s)}, {_dur(pre.grace_min_s)}, {_dur(pre.grace_max_s)}): "
        "set each pod's terminationGracePeriodSeconds from the job's measured cost (at most "
        f"{pre.grace_max_s:g}); the SDK reads it as PREEMPTIBLE_POD_GRACE_SECONDS.",
        f"- Minimum runtime before preemption (max({_dur(pre.min_runtime_s)}, "
        f"{pre.min_runtime_multiple:g} * (save_p95 + restore))), the cooldown "
        f"({_dur(pre.cooldown_s)}), the budget of {pre.queue_budget_per_hour} preemptions "
        f"per queue per hour, the wait of {_dur(pre.tier_patience_s)} before a higher tier "
        "preempts a lower one, and the wait for capacity to free before a reclaim"
        + (
            f" (work within nominal quota starts within {_dur(pre.guarantee_s)})"
            if pre.enabled
            else ""
        )
        + ": Kueue may preempt a workload at any time, and reclaims at once.",
        "- Victims chosen by least lost work (GPU-seconds since the last checkpoint): Kueue "
        "prefers borrowing queues, then the lowest priority, then the most recently admitted; "
        "it does not read the cost annotations.",
        f"- Fair share on usage decayed with a half-life of {_dur(p.fair_share_half_life_s)}: "
        "the ClusterQueues carry fairSharing.weight from each queue's weight, which Kueue uses "
        "only when its Configuration has `fairSharing: {enable: true}`, and then on current "
        "usage, preempting across the cohort by share instead of by the classic rules of "
        "`preemption`. (Kueue's admission fair sharing has a half-life but orders LocalQueues "
        "within one ClusterQueue.)",
        f"- Aging ({_dur(p.aging_s)} per fair-share unit) and the starvation limit "
        f"({_dur(p.starvation_limit_s)}): Kueue orders by priority, then creation time.",
    ]
    if p.backfill:
        notes.append(
            "- Backfill without delaying the head job: BestEffortFIFO lets smaller workloads "
            "start ahead of one that does not fit, but keeps no reservation for it."
        )
    if config.cluster.nodes is not None:
        notes.append(
            "- Nodes and defragmentation: one flat ResourceFlavor (add nodeLabels or a "
            "topology to place by node)."
        )
    if p.beyond_limit and _has_borrowing_limit(config):
        notes.append(
            "- Idle capacity lent beyond a borrowing limit to work that saves on notice, the "
            "first reclaimed: Kueue admits nothing past borrowingLimit, so those GPUs idle."
        )
    unlimited = sorted(
        {
            f"{q.name} ({attr})"
            for q in config.queues
            for _, attr, _ in _kueue_resources(config)
            if not math.isfinite(getattr(q.nominal, attr))
        }
    )
    if unlimited:
        notes.append(
            "- Unlimited nominal quotas, for " + ", ".join(unlimited) + ": Kueue quotas are "
            "finite, so these get nominalQuota 0 and borrow from the Cohort's pool without "
            "limit; Kueue counts that usage as borrowed (reclaimable), our manager does not."
        )
    uncovered = [
        key
        for key, amount in (("cpu", config.cluster.cpus), ("memory", config.cluster.memory_gb))
        if amount <= 0
    ]
    if uncovered:
        notes.append(
            f"- {' and '.join(uncovered)} (not scheduled: 0 in [cluster]): not covered; list "
            "them in resources.excludeResourcePrefixes of Kueue's Configuration, or Kueue "
            "will not admit pods that request them."
        )
    notes += [
        "- Tokens and [service]: Kubernetes RBAC decides who may use each LocalQueue.",
        "",
        "Tiers are WorkloadPriorityClasses: label a job with kueue.x-k8s.io/priority-class: "
        "<tier>; a workload without one has priority 0, the same as normal.",
    ]
    return notes


# --- SLURM ---------------------------------------------------------------------------------------


def slurm_conf(config: QueueConfig) -> str:
    """A `slurm.conf` fragment: preemption, priority and one partition per tier.

    Append it to a slurm.conf that defines the nodes (NodeName) and GresTypes=gpu; the
    partitions use `Nodes=ALL`.

    Raises:
        ConfigError: a queue name cannot be a SLURM account (see `sacctmgr_script`).
    """
    _check_slurm_names(config.queues)
    p, pre = config.policy, config.preemption
    grace = math.ceil(pre.grace_max_s)
    notes = [
        "slurm.conf fragment generated by `preemptible queue export --to slurm`. Append it to "
        "a slurm.conf that defines the nodes and GresTypes=gpu; do not edit: change the queue "
        "config and export again.",
        "",
        "One partition per tier: a job picks its tier with -p <tier>. A higher PriorityTier "
        "is scheduled first and preempts lower ones (requeue after GraceTime).",
        "",
        "At preemption the batch shell gets the job's --signal at once "
        "(preempt_send_user_signal; merge it into an existing SlurmctldParameters line), and "
        "a job that exits 85 after saving is requeued (RequeueExit); one that exits 0 in its "
        "grace would be COMPLETED. integrations/slurm/train.sbatch does both.",
        "",
        "Not expressed here:",
        f"- The negotiated grace: GraceTime is the largest grant ({grace}s = grace_max); a job "
        "that saved sooner exits sooner.",
        f"- The per-job minimum runtime (multiple {pre.min_runtime_multiple:g} of save + "
        "restore): PreemptExemptTime is the flat min_runtime. The cooldown, the "
        f"per-queue preemption budget and the {_dur(pre.tier_patience_s)} a higher tier waits "
        "before it preempts: none.",
        "- Nominal quotas and reclaim: SLURM guarantees no share; each queue's account is "
        "capped at nominal + borrowing limit (sacctmgr.sh) and fair share orders the rest. "
        "A cap is hard: nothing is lent beyond it, however idle the GPUs (beyond_limit).",
        "- Victims by least lost work: SLURM preempts by partition tier, then its own order.",
        f"- Aging ({_dur(p.aging_s)} per fair-share unit, at most {p.aging_max_units:g}): the "
        "age factor grows to PriorityMaxAge, set where our aging credit stops growing, with "
        "the same weight as fair share. The starvation limit: none.",
        "- Tokens and [service]: SLURM users and accounts decide who may submit where.",
        "",
        "Accounts, fair share and the caps need slurmdbd: uncomment the accounting lines "
        "below and run sacctmgr.sh. Without it, preemption by tier still works.",
    ]
    if not pre.enabled:
        preempt = ["PreemptType=preempt/none", "PreemptMode=OFF"]
    else:
        preempt = [
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            f"PreemptExemptTime={_slurm_time(pre.min_runtime_s)}",
            "SlurmctldParameters=preempt_send_user_signal",
            "JobRequeue=1",
            "RequeueExit=85",
        ]
    lines = [
        _comment(notes, prefix="#"),
        f"SchedulerType=sched/{'backfill' if p.backfill else 'builtin'}",
        *preempt,
        "PriorityType=priority/multifactor",
        f"PriorityDecayHalfLife={_slurm_time(p.fair_share_half_life_s)}",
        f"PriorityWeightFairshare={_PRIORITY_WEIGHT}",
        f"PriorityWeightAge={_PRIORITY_WEIGHT}",
        f"PriorityMaxAge={_slurm_time(p.aging_s * p.aging_max_units)}",
        "PriorityWeightPartition=0",
        "PriorityWeightJobSize=0",
        "PriorityWeightQOS=0",
        "# With slurmdbd (for sacctmgr.sh):",
        "#AccountingStorageType=accounting_storage/slurmdbd",
        "#AccountingStorageEnforce=associations,limits",
        "#AccountingStorageTRES=gres/gpu",
    ]
    for tier in sorted(_TIERS, key=lambda t: t.rank):
        # Nothing ranks above critical, so nothing may preempt it.
        mode = "OFF" if tier is Tier.CRITICAL or not pre.enabled else "REQUEUE"
        grace_part = f" GraceTime={grace}" if mode == "REQUEUE" else ""
        default = "YES" if tier is Tier.NORMAL else "NO"
        lines.append(
            f"PartitionName={tier.value} Nodes=ALL Default={default} "
            f"PriorityTier={_SLURM_PRIORITY_TIER[tier]} PreemptMode={mode}{grace_part} "
            "MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def sacctmgr_script(config: QueueConfig) -> str:
    """A shell script that creates one SLURM account per queue, with its fair share and cap.

    Raises:
        ConfigError: a queue name is not a valid SLURM account name, or a cap is not whole.
    """
    _check_slurm_names(config.queues)
    shares = _fair_shares([q.weight for q in config.queues])
    lines = [
        "#!/bin/sh",
        _comment(
            [
                "SLURM accounts for the queues, generated by `preemptible queue export --to "
                "slurm`. Needs slurmdbd and the accounting lines of slurm.conf. Idempotent.",
                "Fairshare is the queue's weight (scaled to whole numbers); GrpTRES caps the "
                "account at nominal + borrowing limit (-1: no cap, where either is unlimited; "
                "mem in MB).",
                "Add users with: sacctmgr -i add user NAME account=QUEUE",
            ],
            prefix="#",
        ),
        "set -eu",
    ]
    for queue, share in zip(config.queues, shares, strict=True):
        lines.append(
            f'sacctmgr -i add account {queue.name} Description="preemptible queue {queue.name}" '
            ">/dev/null 2>&1 || true"
        )
        lines.append(
            f"sacctmgr -i modify account {queue.name} set Fairshare={share} "
            f"GrpTRES={_grp_tres(queue)}"
        )
    return "\n".join(lines) + "\n"


def _has_borrowing_limit(config: QueueConfig) -> bool:
    return any(math.isfinite(v) for q in config.queues for v in values(q.borrowing_limit))


def _check_slurm_names(queues: Iterable[Queue]) -> None:
    for queue in queues:
        if not _SLURM_NAME.match(queue.name):
            raise ConfigError(
                f"queue name {queue.name!r} cannot be a SLURM account: use lowercase letters, "
                "digits, '-' and '_', starting with a letter or digit"
            )


def _grp_tres(queue: Queue) -> str:
    """gres/gpu, cpu and mem (MB) caps; -1 clears a cap, so that a rerun removes old ones."""
    caps = _caps(queue.nominal, queue.borrowing_limit)
    gpus = caps.get("gpus", -1)
    if gpus != int(gpus):
        raise ConfigError(f"queue {queue.name}: {gpus:g} GPUs is not a whole number")
    cpus = math.ceil(caps["cpus"]) if "cpus" in caps else -1
    mem = math.ceil(caps["memory_gb"] * 1024) if "memory_gb" in caps else -1
    return f"gres/gpu={int(gpus)},cpu={cpus},mem={mem}"


def _caps(nominal: Limits, borrowing: Limits) -> dict[str, float]:
    out = {}
    for attr in ("gpus", "cpus", "memory_gb"):
        total = getattr(nominal, attr) + getattr(borrowing, attr)
        if math.isfinite(total):
            out[attr] = total
    return out


def _fair_shares(weights: list[float]) -> list[int]:
    """Whole-number shares in the ratio of the weights (SLURM's Fairshare is an integer)."""
    if all(w == int(w) for w in weights):
        return [int(w) for w in weights]
    return [max(1, round(w * 100)) for w in weights]


# --- text helpers --------------------------------------------------------------------------------


def _comment(lines: list[str], prefix: str = "#") -> str:
    out = []
    for line in lines:
        if not line:
            out.append(prefix)
            continue
        indent = "  " if line.startswith("- ") else ""
        for part in textwrap.wrap(line, width=96, subsequent_indent=indent, break_on_hyphens=False):
            out.append(f"{prefix} {part}")
    return "\n".join(out) + "\n"


def _dur(seconds: float) -> str:
    """A duration as the config writes it: 30s, 10m, 2h, 7d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _slurm_time(seconds: float) -> str:
    """SLURM's days-hours:minutes:seconds."""
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
