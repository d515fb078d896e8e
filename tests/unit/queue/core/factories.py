"""Small builders with keyword defaults, so each table row states only what it is about."""

from __future__ import annotations

from preemptible.queue.core import (
    Cluster,
    Job,
    Queue,
    QueueConfig,
    Resources,
    RunningJob,
    Tier,
    build_snapshot,
    parse_config,
)
from preemptible.queue.core.config import PreemptionSettings
from preemptible.queue.core.model import NO_LIMIT, Limits


def job(
    id: str,
    *,
    queue: str = "a",
    gpus: int = 1,
    tier: str = "normal",
    at: float = 0.0,
    estimate: float | None = None,
    save: float = 10.0,
    restore: float = 10.0,
    aware: bool = True,
    interval: float | None = 600.0,
    preempted_at: float | None = None,
) -> Job:
    return Job(
        id=id,
        queue=queue,
        request=Resources(gpus=gpus),
        tier=Tier(tier),
        submitted_at=at,
        estimate_s=estimate,
        save_s=save,
        restore_s=restore,
        checkpoint_interval_s=interval,
        checkpoint_on_notice=aware,
        last_preempted_at=preempted_at,
    )


def running(
    j: Job,
    *,
    started: float = 0.0,
    ckpt: float | None = None,
    loan_for: str | None = None,
    node: int | None = None,
    terminating: bool = False,
) -> RunningJob:
    """`node`: the whole job on that node (clusters described as nodes)."""
    return RunningJob(
        job=j,
        started_at=started,
        last_checkpoint_at=ckpt,
        loan_for=loan_for,
        placement=((node, j.request.gpus),) if node is not None else (),
        terminating=terminating,
    )


def config(
    *,
    gpus: int = 8,
    queues: dict[str, tuple[float, float, float]] | None = None,
    nodes: int | None = None,
    policy: dict | None = None,
    preemption: dict | None = None,
) -> QueueConfig:
    """queues: name -> (weight, nominal gpus, borrowing limit gpus (inf = unlimited))."""
    queues = queues if queues is not None else {"a": (1.0, 4, NO_LIMIT), "b": (1.0, 4, NO_LIMIT)}
    cluster: dict = {"gpus": gpus}
    if nodes:
        cluster.update(nodes=nodes, gpus_per_node=gpus // nodes)
    # Tier preemption at once, and reclaim within one grace, unless a test is about patience:
    # the other tests are about which victims a preemption takes, not about when.
    given = preemption or {}
    preemption = {
        "tier_patience": "0s",
        "reclaim_within": given.get("grace_max", PreemptionSettings().grace_max_s),
        **given,
    }
    data: dict = {"cluster": cluster, "policy": policy or {}, "preemption": preemption}
    data["queues"] = []
    for name, (weight, nominal, borrow) in queues.items():
        q: dict = {"name": name, "weight": weight, "nominal": {"gpus": nominal}}
        if borrow != NO_LIMIT:
            q["borrowing_limit"] = {"gpus": borrow}
        data["queues"].append(q)
    return parse_config(data)


def snapshot(cfg: QueueConfig, *, pending=(), running_jobs=(), usage=None, **kw):
    return build_snapshot(
        cfg.cluster, cfg.queues, pending=pending, running=running_jobs, usage=usage, **kw
    )


def flat_cluster(gpus: int) -> Cluster:
    return Cluster(gpus=gpus)


def queue(name: str, *, weight: float = 1.0, nominal: float = 0, borrow: float = NO_LIMIT) -> Queue:
    return Queue(
        name=name, weight=weight, nominal=Limits(gpus=nominal), borrowing_limit=Limits(gpus=borrow)
    )
