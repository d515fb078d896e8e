"""The queue configuration as Kueue objects.

A ResourceFlavor, a Cohort holding the capacity that no queue is guaranteed, one ClusterQueue
per queue (nominal quota, borrowing limit, fair-sharing weight, preemption), a LocalQueue per
queue in its namespace, the Namespaces, and a WorkloadPriorityClass per tier. What Kueue cannot
say is named in the comments at the top of the YAML (docs/user-guide/schedulers.md).
"""

from __future__ import annotations

import math
import re
from typing import Any

from preemptible._extras import require
from preemptible.errors import ConfigError
from preemptible.queue.core.config import QueueConfig
from preemptible.queue.core.model import Queue, Tier
from preemptible.queue.core.resources import values
from preemptible.queue.export.text import TIERS_HIGH_FIRST, as_comment, dur

__all__ = ["KUEUE_API_VERSIONS", "TIER_PRIORITY", "kueue_objects", "kueue_yaml"]

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
_GPU = "nvidia.com/gpu"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


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
    for tier in TIERS_HIGH_FIRST:
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
        BackendNotInstalledError: PyYAML is not installed (the k8s extra).
    """
    require("k8s", "the Kueue export", modules=("yaml",))
    import yaml

    objects = kueue_objects(config, **options)
    header = as_comment(_kueue_notes(config))
    body = yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, width=100)
    return f"{header}---\n{body}"


def _check_dns_label(name: str, what: str) -> None:
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ConfigError(
            f"{what} {name!r} is not a valid Kubernetes name: use at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit"
        )


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
        f"{dur(pre.grace_margin_s)}, {dur(pre.grace_min_s)}, {dur(pre.grace_max_s)}): "
        "set each pod's terminationGracePeriodSeconds from the job's measured cost (at most "
        f"{pre.grace_max_s:g}); the SDK reads it as PREEMPTIBLE_POD_GRACE_SECONDS.",
        f"- Minimum runtime before preemption (min(max({dur(pre.min_runtime_s)}, "
        f"{pre.min_runtime_multiple:g} * (save_p95 + restore)), "
        f"{dur(pre.min_runtime_cap_s)}), each claim counted as at most "
        f"{dur(pre.claimed_save_cap_s)} of save and {dur(pre.claimed_restore_cap_s)} of "
        "restore), the cooldown "
        f"({dur(pre.cooldown_s)}), the budget of {pre.queue_budget_per_hour} preemptions "
        f"per queue per hour, the wait of {dur(pre.tier_patience_s)} before a higher tier "
        "preempts a lower one, and the wait for capacity to free before a reclaim"
        + (
            f" (work within nominal quota starts within {dur(pre.guarantee_s)})"
            if pre.enabled
            else ""
        )
        + ": Kueue may preempt a workload at any time, and reclaims at once.",
        "- Victims chosen by least lost work (GPU-seconds since the last checkpoint): Kueue "
        "prefers borrowing queues, then the lowest priority, then the most recently admitted; "
        "it does not read the cost annotations.",
        f"- Fair share on usage decayed with a half-life of {dur(p.fair_share_half_life_s)}: "
        "the ClusterQueues carry fairSharing.weight from each queue's weight, which Kueue uses "
        "only when its Configuration has `fairSharing: {enable: true}`, and then on current "
        "usage, preempting across the cohort by share instead of by the classic rules of "
        "`preemption`. (Kueue's admission fair sharing has a half-life but orders LocalQueues "
        "within one ClusterQueue.)",
        f"- Aging ({dur(p.aging_s)} per fair-share unit) and the starvation limit "
        f"({dur(p.starvation_limit_s)}): Kueue orders by priority, then creation time.",
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
    notes.append(
        "- Elastic ranges (min_gpus, gpus_multiple) and shrinking a job instead of evicting "
        "it: with v1beta1 (Kueue before v0.18) they cannot be expressed, and every job runs "
        "at its full size. Kueue's elastic jobs (workload slices, beta since v0.18 behind a "
        "feature gate, API v1beta2) let a job's owner scale it within the quota, but Kueue "
        "still evicts whole workloads to make room, by priority, and never weighs a shrink "
        "against an eviction; the range is not written into these objects."
    )
    notes += [
        "- Tokens and [service]: Kubernetes RBAC decides who may use each LocalQueue.",
        "",
        "Tiers are WorkloadPriorityClasses: label a job with kueue.x-k8s.io/priority-class: "
        "<tier>; a workload without one has priority 0, the same as normal.",
    ]
    return notes


def _has_borrowing_limit(config: QueueConfig) -> bool:
    return any(math.isfinite(v) for q in config.queues for v in values(q.borrowing_limit))
