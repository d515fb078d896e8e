"""The queue configuration of DESIGN.md §4, parsed from TOML text or an already-loaded dict.

Parsing is pure: the shell reads the file (and resolves `gpus = "auto"` and `env:` tokens), this
module only checks values and turns durations like "30s", "5m", "2h", "7d" into seconds. Every
problem raises `ConfigError` naming the key and the fix, so a typo never becomes a silent default.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from preemptible.errors import ConfigError
from preemptible.queue.core.model import NO_LIMIT, Cluster, Limits, Queue

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}
_RESOURCE_KEYS = ("gpus", "cpus", "memory_gb")


def parse_duration(value: Any, *, key: str = "duration") -> float:
    """Seconds from "30s", "5m", "2h", "7d", "1w" or a plain number of seconds.

    Raises:
        ConfigError: the value is negative, infinite or not a duration.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration like '30s' or '5m', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(
                f"{key}: {value!r} is not a duration; write a number with a unit, "
                "e.g. '30s', '5m', '2h', '7d'"
            )
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not math.isfinite(seconds):
        raise ConfigError(f"{key}: must be a finite duration, got {value!r}")
    if seconds < 0:
        raise ConfigError(f"{key}: must not be negative, got {value!r}")
    return seconds


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicySettings:
    """The `[policy]` table: how pending jobs are ordered and backfilled."""

    fair_share_half_life_s: float = 7 * 86400.0
    """Half-life of the decayed usage used for fair share."""
    aging_s: float = 3600.0
    """Waiting this long is worth one fair-share unit (a tier is never crossed)."""
    aging_max_units: float = 2.0
    """Aging credit stops growing at this many fair-share units (see docs/scheduling.md)."""
    starvation_limit_s: float = 2 * 86400.0
    """Past this wait a job goes first in its tier whatever its queue's share; 0 = off."""
    backfill: bool = True
    """Start smaller jobs ahead of a blocked head job when they do not delay it."""
    default_estimate_s: float = 4 * 3600.0
    """Runtime assumed for jobs without an estimate when computing a reservation."""
    backfill_depth: int = 16
    """How many jobs of one shape a cycle looks at when searching for backfill."""
    defragment: bool = True
    """Move small checkpoint-aware jobs to other nodes so that a job blocked only by
    fragmentation gets a node block (`defrag.py`; policies that have the rule)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PreemptionSettings:
    """The `[preemption]` table: negotiation of grace and minimum runtime, anti-thrashing."""

    grace_safety: float = 1.5
    """Multiplier on the measured save p95."""
    grace_margin_s: float = 10.0
    """Seconds added to the scaled save p95."""
    grace_min_s: float = 30.0
    """Smallest grace period granted."""
    grace_max_s: float = 600.0
    """Largest grace period granted."""
    min_runtime_s: float = 300.0
    """No job is preempted before running this long (reclaim of borrowed capacity aside)."""
    min_runtime_multiple: float = 10.0
    """Minimum runtime is at least this multiple of (save p95 + restore)."""
    cooldown_s: float = 1800.0
    """A job preempted less than this long ago is not preempted again."""
    queue_budget_per_hour: int = 20
    """No tier-preemption search takes victims from a queue that lost this many jobs in the
    rolling hour (checked before each search, which may take several)."""
    enabled: bool = True
    """False turns preemption off (reclaim included)."""

    @property
    def nomination_window_s(self) -> float:
        """How long a preemptor keeps its claim on the capacity its victims free: the longest
        grace plus a minute for them to exit."""
        return self.grace_max_s + 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueConfig:
    """A whole parsed configuration."""

    cluster: Cluster
    """Capacity (gpus may be 0 with `gpus_auto` when the shell must detect it)."""
    policy: PolicySettings = field(default_factory=PolicySettings)
    """Ordering and backfill settings."""
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    """Preemption and negotiation settings."""
    queues: tuple[Queue, ...] = ()
    """The queues, in file order."""
    tokens: Mapping[str, str] = field(default_factory=dict)
    """Queue name -> token spec as written (e.g. "env:TEAM_A_TOKEN"); resolved by the shell."""
    gpus_auto: bool = False
    """True when the file says `gpus = "auto"`."""

    def queue(self, name: str) -> Queue:
        """The queue called `name`.

        Raises:
            ConfigError: there is no such queue.
        """
        for q in self.queues:
            if q.name == name:
                return q
        known = ", ".join(q.name for q in self.queues) or "none"
        raise ConfigError(f"no queue named {name!r} in the configuration (queues: {known})")


def parse_config_text(text: str) -> QueueConfig:
    """Parse TOML text in the DESIGN.md §4 format.

    Raises:
        ConfigError: the TOML is malformed or a value is invalid.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the configuration is not valid TOML: {exc}") from exc
    return parse_config(data)


def parse_config(data: Mapping[str, Any]) -> QueueConfig:
    """Check and convert an already-loaded configuration mapping.

    Raises:
        ConfigError: a key is unknown or missing, or a value is invalid.
    """
    _only(data, {"cluster", "policy", "preemption", "queues"}, "top level")
    cluster, gpus_auto = _cluster(data.get("cluster"))
    policy = _policy(data.get("policy", {}))
    preemption = _preemption(data.get("preemption", {}))
    raw_queues = data.get("queues", [])
    if not isinstance(raw_queues, list):
        raise ConfigError("queues: write each queue as a [[queues]] table")
    queues: list[Queue] = []
    tokens: dict[str, str] = {}
    for i, raw in enumerate(raw_queues):
        queue, token = _queue(raw, i)
        if any(q.name == queue.name for q in queues):
            raise ConfigError(f"queues: the name {queue.name!r} is used twice")
        queues.append(queue)
        if token is not None:
            tokens[queue.name] = token
    if not gpus_auto:
        nominal = sum(q.nominal.gpus for q in queues if q.nominal.gpus != NO_LIMIT)
        if nominal > cluster.gpus:
            raise ConfigError(
                f"queues: nominal quotas add up to {nominal:g} GPUs but the cluster has "
                f"{cluster.gpus}; lower a nominal quota or raise cluster.gpus"
            )
    return QueueConfig(
        cluster=cluster,
        policy=policy,
        preemption=preemption,
        queues=tuple(queues),
        tokens=tokens,
        gpus_auto=gpus_auto,
    )


def _only(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {type(table).__name__}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; allowed keys are {', '.join(sorted(allowed))}"
        )


def _number(value: Any, key: str, *, minimum: float = 0.0, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if integer and int(value) != value:
        raise ConfigError(f"{key}: expected a whole number, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{key}: must be at least {minimum:g}, got {value!r}")
    return float(value)


def _cluster(raw: Any) -> tuple[Cluster, bool]:
    if raw is None:
        raise ConfigError("[cluster] is missing; add at least `gpus = N`")
    _only(raw, {"gpus", "cpus", "memory_gb", "nodes", "gpus_per_node"}, "cluster")
    if "gpus" not in raw:
        raise ConfigError('cluster.gpus is missing; give a number or "auto"')
    gpus_auto = raw["gpus"] == "auto"
    gpus = 0 if gpus_auto else int(_number(raw["gpus"], "cluster.gpus", integer=True))
    nodes = raw.get("nodes")
    per_node = raw.get("gpus_per_node")
    if (nodes is None) != (per_node is None):
        raise ConfigError("cluster: give both `nodes` and `gpus_per_node`, or neither")
    if nodes is not None:
        nodes = int(_number(nodes, "cluster.nodes", minimum=1, integer=True))
        per_node = int(_number(per_node, "cluster.gpus_per_node", minimum=1, integer=True))
        if gpus_auto:
            gpus = nodes * per_node
            gpus_auto = False
        elif nodes * per_node != gpus:
            raise ConfigError(
                f"cluster: nodes * gpus_per_node = {nodes * per_node} but gpus = {gpus}; "
                "make them agree"
            )
    return (
        Cluster(
            gpus=gpus,
            cpus=_number(raw.get("cpus", 0), "cluster.cpus"),
            memory_gb=_number(raw.get("memory_gb", 0), "cluster.memory_gb"),
            nodes=nodes,
            gpus_per_node=per_node,
        ),
        gpus_auto,
    )


def _policy(raw: Any) -> PolicySettings:
    keys = {
        "fair_share_half_life",
        "aging",
        "aging_max_units",
        "starvation_limit",
        "backfill",
        "default_estimate",
        "backfill_depth",
        "defragment",
    }
    _only(raw, keys, "policy")
    out = PolicySettings()
    kwargs: dict[str, Any] = {}
    if "fair_share_half_life" in raw:
        kwargs["fair_share_half_life_s"] = parse_duration(
            raw["fair_share_half_life"], key="policy.fair_share_half_life"
        )
        if kwargs["fair_share_half_life_s"] <= 0:
            raise ConfigError("policy.fair_share_half_life: must be longer than 0s")
    if "aging" in raw:
        kwargs["aging_s"] = parse_duration(raw["aging"], key="policy.aging")
        if kwargs["aging_s"] <= 0:
            raise ConfigError("policy.aging: must be longer than 0s")
    if "aging_max_units" in raw:
        kwargs["aging_max_units"] = _number(raw["aging_max_units"], "policy.aging_max_units")
    if "starvation_limit" in raw:
        kwargs["starvation_limit_s"] = parse_duration(
            raw["starvation_limit"], key="policy.starvation_limit"
        )
    for switch in ("backfill", "defragment"):
        if switch in raw:
            if not isinstance(raw[switch], bool):
                raise ConfigError(f"policy.{switch}: expected true or false, got {raw[switch]!r}")
            kwargs[switch] = raw[switch]
    if "default_estimate" in raw:
        kwargs["default_estimate_s"] = parse_duration(
            raw["default_estimate"], key="policy.default_estimate"
        )
    if "backfill_depth" in raw:
        kwargs["backfill_depth"] = int(
            _number(raw["backfill_depth"], "policy.backfill_depth", minimum=1, integer=True)
        )
    return PolicySettings(**{**_fields(out), **kwargs})


def _preemption(raw: Any) -> PreemptionSettings:
    durations = {
        "grace_margin": "grace_margin_s",
        "grace_min": "grace_min_s",
        "grace_max": "grace_max_s",
        "min_runtime": "min_runtime_s",
        "cooldown": "cooldown_s",
    }
    numbers = {"grace_safety": "grace_safety", "min_runtime_multiple": "min_runtime_multiple"}
    _only(raw, {*durations, *numbers, "queue_budget_per_hour", "enabled"}, "preemption")
    kwargs: dict[str, Any] = {}
    for key, attr in durations.items():
        if key in raw:
            kwargs[attr] = parse_duration(raw[key], key=f"preemption.{key}")
    for key, attr in numbers.items():
        if key in raw:
            kwargs[attr] = _number(raw[key], f"preemption.{key}")
    if "queue_budget_per_hour" in raw:
        kwargs["queue_budget_per_hour"] = int(
            _number(raw["queue_budget_per_hour"], "preemption.queue_budget_per_hour", integer=True)
        )
    if "enabled" in raw:
        if not isinstance(raw["enabled"], bool):
            raise ConfigError("preemption.enabled: expected true or false")
        kwargs["enabled"] = raw["enabled"]
    settings = PreemptionSettings(**{**_fields(PreemptionSettings()), **kwargs})
    if settings.grace_min_s > settings.grace_max_s:
        raise ConfigError(
            f"preemption: grace_min ({settings.grace_min_s:g}s) is larger than grace_max "
            f"({settings.grace_max_s:g}s); swap them"
        )
    return settings


def _limits(raw: Any, key: str, *, default: float) -> Limits:
    if raw is None:
        return Limits(gpus=default)
    _only(raw, set(_RESOURCE_KEYS), key)
    values = {name: _number(raw[name], f"{key}.{name}") for name in _RESOURCE_KEYS if name in raw}
    return Limits(**values)


def _queue(raw: Any, index: int) -> tuple[Queue, str | None]:
    where = f"queues[{index}]"
    _only(raw, {"name", "weight", "nominal", "borrowing_limit", "token"}, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: every queue needs a non-empty `name`")
    where = f"queue {name!r}"
    weight = _number(raw.get("weight", 1.0), f"{where}.weight")
    if weight <= 0:
        raise ConfigError(f"{where}.weight: must be greater than 0, got {weight:g}")
    token = raw.get("token")
    if token is not None and not isinstance(token, str):
        raise ConfigError(f"{where}.token: expected a string such as 'env:TEAM_A_TOKEN'")
    queue = Queue(
        name=name,
        weight=weight,
        nominal=_limits(raw.get("nominal"), f"{where}.nominal", default=0),
        borrowing_limit=_limits(
            raw.get("borrowing_limit"), f"{where}.borrowing_limit", default=NO_LIMIT
        ),
    )
    return queue, token


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}
