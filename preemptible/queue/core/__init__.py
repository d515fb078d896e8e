"""The pure scheduling core: snapshot + now -> decisions. No I/O, no clock, no threads.

Shared by the queue service and the simulator, so what the simulator shows is what the service
does. See `cycle.py` for the phases and `docs/user-guide/scheduling.md` for the policy.
"""

from preemptible.queue.core.config import (
    PolicySettings,
    PreemptionSettings,
    QueueConfig,
    RestartSettings,
    ServiceSettings,
    parse_config,
    parse_config_text,
    parse_duration,
)
from preemptible.queue.core.cycle import schedule
from preemptible.queue.core.fair_share import UsageTracker, dominant_share, fair_share_value
from preemptible.queue.core.model import (
    Admit,
    Cluster,
    CycleResult,
    Job,
    Limits,
    Preempt,
    PreemptKind,
    Queue,
    Reserve,
    Resize,
    ResizeKind,
    Resources,
    RunningJob,
    Tier,
    check_elastic_range,
)
from preemptible.queue.core.negotiation import Negotiated, negotiate
from preemptible.queue.core.policy import BASELINES, POLICIES, ElasticMode, Policy, get_policy
from preemptible.queue.core.state import ClusterState, Snapshot, build_snapshot

__all__ = [
    "BASELINES",
    "POLICIES",
    "Admit",
    "Cluster",
    "ClusterState",
    "CycleResult",
    "ElasticMode",
    "Job",
    "Limits",
    "Negotiated",
    "Policy",
    "PolicySettings",
    "Preempt",
    "PreemptKind",
    "PreemptionSettings",
    "Queue",
    "QueueConfig",
    "Reserve",
    "Resize",
    "ResizeKind",
    "Resources",
    "RestartSettings",
    "RunningJob",
    "ServiceSettings",
    "Snapshot",
    "Tier",
    "UsageTracker",
    "build_snapshot",
    "check_elastic_range",
    "dominant_share",
    "fair_share_value",
    "get_policy",
    "negotiate",
    "parse_config",
    "parse_config_text",
    "parse_duration",
    "schedule",
]
