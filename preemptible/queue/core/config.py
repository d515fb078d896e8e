"""The queue configuration (docs/maintainers/design.md), parsed from TOML text or a dict.

Parsing is pure: the shell reads the file (and resolves `gpus = "auto"` and `env:` tokens), this
module only checks values and turns durations like "30s", "5m", "2h", "7d" into seconds. Every
problem raises `ConfigError` naming the key and the fix, so a typo never becomes a silent default;
parsed from text, the message also gives the file and the line of the key (`_KeyLines`).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preemptible.errors import ConfigError
from preemptible.queue.core.model import NO_LIMIT, Cluster, Limits, Queue
from preemptible.queue.core.policy import ElasticMode
from preemptible.queue.core.topology import Topology

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}
_RESOURCE_KEYS = ("gpus", "cpus", "memory_gb")
# A Unix user name (dots and capitals too, as directories such as LDAP have them); the shell
# checks that the user exists.
_USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*[$]?$")
_USER_NAME_MAX = 32


def parse_duration(value: Any, *, key: str = "duration") -> float:
    """Seconds from "30s", "5m", "2h", "7d", "1w" or a plain number of seconds.

    Args:
        value: the duration as written.
        key: what the value is (a key, a command-line option), named in the error message.

    Raises:
        ConfigError: the value is negative, infinite or not a duration.
    """
    try:
        return _seconds(value, (key,))
    except _Invalid as bad:
        raise ConfigError(f"{key}: {bad.message}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicySettings:
    """The `[policy]` table: how pending jobs are ordered and backfilled."""

    fair_share_half_life_s: float = 7 * 86400.0
    """Half-life of the decayed usage used for fair share."""
    aging_s: float = 3600.0
    """Waiting this long is worth one fair-share unit (a tier is never crossed)."""
    aging_max_units: float = 2.0
    """Aging credit stops growing at this many fair-share units (see
    docs/user-guide/scheduling.md).
    """
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
    beyond_limit: bool = True
    """Capacity nobody else can use may go to checkpoint-aware work over its queue's borrowing
    limit, the first reclaimed when another queue needs it (policies that have the rule)."""
    elastic: ElasticMode | None = None
    """How elastic jobs are resized (off, priced, priority); None: the policy's own mode.
    It never makes a policy that does not resize start to (`policy.effective_elastic`)."""
    grow_payback: float = 2.0
    """Grow a shrunk job only when the GPU-seconds it gains on GPUs nobody else is expected to
    want are at least this many times the resize's cost plus any expected shrink back
    (docs/internals/grow-when-it-pays.md)."""
    resize_interval_s: float = 60.0
    """No job is resized twice within this long, or within `resize_interval_multiple` times
    its save plus restore if that is longer."""
    resize_interval_multiple: float = 10.0
    """The minimum interval between two resizes of a job in units of its save plus restore."""


RECLAIM_WITHIN_GRACES = 3.0
"""`reclaim_within` by default, in units of `grace_max` (30 minutes with the defaults): time for
capacity to free on its own before a reclaim costs its victims a save and a restore; chosen on
the workload family (docs/internals/reclaim-within.md)."""

CLAIMED_RESTORE_GRACES = 3.0
"""`max_claimed_restore` by default, in units of `grace_max` (30 minutes with the defaults): a
restore may take longer than a save (start-up, loading, warm-up), but a claim beyond this buys
nothing (docs/internals/bounded-claims.md)."""


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
    reclaim_within_s: float | None = None
    """A job within its queue's nominal quota starts within this long of its submission (never
    less than `grace_max`, which its victims may need to save): it waits for capacity to free
    on its own before reclaiming while that still keeps the promise (policies that have
    patient reclaim). None: `RECLAIM_WITHIN_GRACES` times `grace_max` (`guarantee_s`)."""
    min_runtime_s: float = 300.0
    """No job is preempted before running this long (reclaim of borrowed capacity aside)."""
    min_runtime_multiple: float = 10.0
    """Minimum runtime is at least this multiple of (save p95 + restore)."""
    max_claimed_save_s: float | None = None
    """A job's claimed save cost counts as at most this much in its grace and minimum runtime.
    None: `grace_max` (`claimed_save_cap_s`)."""
    max_claimed_restore_s: float | None = None
    """A job's claimed restore cost counts as at most this much in its minimum runtime. None:
    `CLAIMED_RESTORE_GRACES` times `grace_max` (`claimed_restore_cap_s`)."""
    min_runtime_max_s: float | None = None
    """No claim buys a minimum runtime longer than this (never less than `min_runtime`). None:
    what the largest counted claims buy (`min_runtime_cap_s`)."""
    tier_patience_s: float = 600.0
    """A job that could start only by preempting lower tiers first waits this long after its
    submission for capacity to free on its own (policies that have the rule); 0 = at once."""
    cooldown_s: float = 1800.0
    """A job preempted less than this long ago is not preempted again."""
    queue_budget_per_hour: int = 20
    """No tier-preemption search takes victims from a queue that lost this many jobs in the
    rolling hour (checked before each search, which may take several)."""
    enabled: bool = True
    """False turns preemption off (reclaim included)."""

    @property
    def guarantee_s(self) -> float:
        """How long a job within nominal quota may wait for borrowers: `reclaim_within` as
        set, or its default, which follows `grace_max` (a longer grace needs a longer promise).
        A victim whose grace is the longest may need `EXIT_SLACK_S` (patience.py) more to exit
        and be seen gone."""
        if self.reclaim_within_s is not None:
            return self.reclaim_within_s
        return RECLAIM_WITHIN_GRACES * self.grace_max_s

    @property
    def claimed_save_cap_s(self) -> float:
        """The most a claimed save counts for: `max_claimed_save` as set, else `grace_max` (a
        longer save cannot be done within any grace the queue grants)."""
        if self.max_claimed_save_s is not None:
            return self.max_claimed_save_s
        return self.grace_max_s

    @property
    def claimed_restore_cap_s(self) -> float:
        """The most a claimed restore counts for: `max_claimed_restore` as set, else
        `CLAIMED_RESTORE_GRACES` times `grace_max`."""
        if self.max_claimed_restore_s is not None:
            return self.max_claimed_restore_s
        return CLAIMED_RESTORE_GRACES * self.grace_max_s

    @property
    def min_runtime_cap_s(self) -> float:
        """The longest minimum runtime any claim buys: `min_runtime_max` as set, else what the
        capped claims buy, `min_runtime_multiple * (save cap + restore cap)`, and never less than
        `min_runtime`. The default binds nothing the claim caps do not; set it lower to bound
        how long a higher tier may wait for a lower one."""
        if self.min_runtime_max_s is not None:
            return self.min_runtime_max_s
        counted = self.claimed_save_cap_s + self.claimed_restore_cap_s
        return max(self.min_runtime_s, self.min_runtime_multiple * counted)

    @property
    def nomination_window_s(self) -> float:
        """How long a preemptor keeps its claim on the capacity its victims free: the longest
        grace plus a minute for them to exit."""
        return self.grace_max_s + 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ServiceSettings:
    """The `[service]` table's limits: what the queue manager's HTTP side lets one caller take.

    Read by the queue manager alone (`preemptible queue serve`); the core and the simulator
    never look at them. The defaults are far above what a team, a dashboard or a job asks
    (docs/user-guide/queue-manager.md, "Limits")."""

    rate_per_s: float = 100.0
    """Requests a second each caller (the admin, a queue's token, a job's token) may make,
    on average; past its burst a caller is answered 429 with `Retry-After`."""
    burst: int = 400
    """Requests a caller may make at once before `rate_per_s` applies (its bucket's size)."""
    max_connections: int = 512
    """Open HTTP connections at most; more are answered 503 and closed. Lowered at start to fit
    under the process's file descriptor limit, so that the scheduling loop always has its own."""
    keep_alive_s: float = 5.0
    """A connection with no request for this long (a new one included) is closed."""
    backlog: int = 256
    """Connections the kernel may hold that the server has not accepted yet."""
    notice_polls: int = 4
    """Notice long-polls one caller (a job's token) may have waiting at once; more are 429."""
    in_flight: int = 2
    """Requests of one caller in progress at once (notice long-polls aside); more wait their
    turn, so that many clients of one token compete with the others as a few."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RestartSettings:
    """The `[restarts]` table: what the queue manager does when a job crashes or hangs.

    Read by the queue manager alone; a job's own `max_restarts` and `hang_after` are claims
    bounded by these (docs/user-guide/queue-manager.md, "Crashes and hangs")."""

    max_restarts: int = 3
    """A job that fails (exits non-zero or by a signal without a notice, or hangs) is requeued
    from its last checkpoint up to this many times; a queue's `max_restarts` overrides it, and
    a job may ask for fewer, never more."""
    backoff_s: float = 10.0
    """The wait before the first restart; it doubles with each failure in a row."""
    backoff_max_s: float = 300.0
    """The longest wait before a restart."""
    crash_loop_after: int = 3
    """Failures in a row that made no progress (no newer checkpoint, or the same failing step)
    after which the job is failed as a crash loop instead of restarted."""
    hang_after_s: float | None = None
    """A running job whose step has not advanced for this long is told to save and exit, then
    killed and restarted. None: learned per job (`hang_factor` times its slowest step, never
    less than `hang_min`), once it has reported a step."""
    hang_min_s: float = 600.0
    """The shortest learned hang bound."""
    hang_factor: float = 10.0
    """The learned hang bound is this many times the job's slowest step so far."""
    beat_s: float = 10.0
    """How often a job's SDK reports its step (`PREEMPTIBLE_BEAT_SECONDS`)."""

    def backoff(self, failures_in_a_row: int) -> float:
        """Seconds before the restart that follows the n-th failure in a row (n >= 1)."""
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** max(0, failures_in_a_row - 1))


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
    admin_token: str | None = None
    """`[service] admin_token` as written (e.g. "env:PREEMPTIBLE_ADMIN_TOKEN"); resolved by the
    queue manager, which alone reads the [service] table."""
    run_as: Mapping[str, str] = field(default_factory=dict)
    """Queue name -> the Unix user its jobs run as (`run_as = "alice"`); the queue manager
    looks the user up and switches to it (docs/user-guide/security.md)."""
    service: ServiceSettings = field(default_factory=ServiceSettings)
    """The rest of the `[service]` table: the HTTP side's limits."""
    restarts: RestartSettings = field(default_factory=RestartSettings)
    """The `[restarts]` table: crashes and hangs."""
    max_restarts: Mapping[str, int] = field(default_factory=dict)
    """Queue name -> its own `max_restarts` (`[[queues]] max_restarts`), over `restarts`'."""
    topology: Topology | None = None
    """`[cluster.topology]`: the GPUs' NVLink islands, PCIe switches and sockets, for
    placement (`topology.py`); None: every GPU alike, or `topology_auto`."""
    topology_auto: bool = False
    """True when the file says `topology = "auto"`: the queue manager asks NVML."""

    def restart_limit(self, queue: str) -> int:
        """The most restarts a job of `queue` gets (it may ask for fewer)."""
        return self.max_restarts.get(queue, self.restarts.max_restarts)

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


def parse_config_text(text: str, *, path: str | Path | None = None) -> QueueConfig:
    """Parse TOML text in the format of docs/maintainers/design.md.

    Args:
        text: the TOML text.
        path: the file the text was read from, named in error messages.

    Raises:
        ConfigError: the TOML is malformed or a value is invalid; the message names the file,
            the line and the key.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(_syntax_message(exc, text, path)) from exc
    try:
        return _parse(data)
    except _Invalid as bad:
        raise ConfigError(bad.describe(path=path, lines=_KeyLines(text))) from None


def parse_config(data: Mapping[str, Any]) -> QueueConfig:
    """Check and convert an already-loaded configuration mapping.

    Raises:
        ConfigError: a key is unknown or missing, or a value is invalid (the message names the
            key; there is no line to name).
    """
    try:
        return _parse(data)
    except _Invalid as bad:
        raise ConfigError(bad.describe()) from None


# --- where a problem is --------------------------------------------------------------------------

Key = tuple[str | int, ...]
"""A key as a path from the top of the file: ("queues", 1, "nominal", "gpus")."""

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_TOML_POSITION = re.compile(
    r"^(?P<what>.*) \(at (?:line (?P<line>\d+), column (?P<col>\d+)|end of document)\)$"
)


class _Invalid(Exception):
    """A problem with one key. Raised inside this module, where the text is not at hand; the
    public entry points turn it into a `ConfigError` that also says where the key is."""

    def __init__(self, key: Key, message: str, *, missing: bool = False):
        super().__init__(message)
        self.key = key
        self.message = message
        self.missing = missing  # absent: point at the table that should hold it

    def describe(self, *, path: str | Path | None = None, lines: _KeyLines | None = None) -> str:
        line = None
        if lines is not None:
            # An absent key is pointed at by its table's header; a key at the top by nothing.
            key = self.key[:-1] if self.missing else self.key
            while key and line is None:
                line = lines.line_of(key)
                key = key[:-1]
        return f"{_where(path, line)}{_dotted(self.key)}: {self.message}"


def _dotted(key: Key) -> str:
    """A key as written in messages: `queues[1].nominal.gpus`."""
    out = ""
    for part in key:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if _BARE_KEY.match(part) else json.dumps(part)
            out += f".{name}" if out else name
    return out or "the top level"


def _where(path: str | Path | None, line: int | None) -> str:
    if path is not None and line is not None:
        return f"{path}:{line}: "
    if path is not None:
        return f"{path}: "
    if line is not None:
        return f"line {line}: "
    return ""


class _KeyLines:
    """Finds the line that defines a key in TOML text.

    tomllib reports no positions, and a scanner of our own would have to repeat TOML's quoting,
    dotted keys, inline tables and arrays of tables to get them right. Instead this parses
    prefixes of the text with tomllib itself: the shortest prefix that holds the key ends on the
    line where its definition starts. Prefixes only grow, so a bisection needs about log2(lines)
    parses. A prefix cut inside a multi-line value does not parse and counts as the next one
    that does, so a key inside a multi-line array is placed on the line where the array starts.
    Only ever run on the error path.
    """

    def __init__(self, text: str):
        self._lines = text.split("\n")

    def line_of(self, key: Key) -> int | None:
        """1-based line where `key` is defined, or None when the text does not hold it."""
        lo, hi = 1, len(self._lines)
        if not self._holds_from(hi, key):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self._holds_from(mid, key):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _holds_from(self, count: int, key: Key) -> bool:
        """Whether the first prefix of at least `count` lines that parses holds `key`."""
        for end in range(count, len(self._lines) + 1):
            try:
                # The newline keeps a CRLF file's last "\r" from standing alone (invalid TOML).
                data = tomllib.loads("\n".join(self._lines[:end]) + "\n")
            except tomllib.TOMLDecodeError:
                continue
            return _holds(data, key)
        return False


def _holds(data: Any, key: Key) -> bool:
    node = data
    for part in key:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return False
        elif not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _syntax_message(exc: tomllib.TOMLDecodeError, text: str, path: str | Path | None) -> str:
    match = _TOML_POSITION.match(str(exc))
    if match is None:
        line, what = None, str(exc)
    elif match["line"] is None:  # "at end of document": an unclosed string or bracket
        line, what = len(text.rstrip().split("\n")), f"{match['what']} at the end of the file"
    else:
        line, what = int(match["line"]), f"{match['what']} (column {match['col']})"
    return f"{_where(path, line)}the configuration is not valid TOML: {what}"


# --- the tables ----------------------------------------------------------------------------------


def _parse(data: Mapping[str, Any]) -> QueueConfig:
    _only(data, {"cluster", "policy", "preemption", "queues", "service", "restarts"}, ())
    cluster, gpus_auto = _cluster(data.get("cluster"))
    policy = _policy(data.get("policy", {}))
    preemption = _preemption(data.get("preemption", {}))
    raw_queues = data.get("queues", [])
    if not isinstance(raw_queues, list):
        raise _Invalid(("queues",), "write each queue as a [[queues]] table")
    queues: list[Queue] = []
    tokens: dict[str, str] = {}
    run_as: dict[str, str] = {}
    max_restarts: dict[str, int] = {}
    for i, raw in enumerate(raw_queues):
        queue, token, user = _queue(raw, i)
        if isinstance(raw, Mapping) and "max_restarts" in raw:
            max_restarts[queue.name] = _count(raw["max_restarts"], ("queues", i, "max_restarts"))
        for j, other in enumerate(queues):
            if other.name == queue.name:
                raise _Invalid(
                    ("queues", i, "name"),
                    f"the name {queue.name!r} is used twice (also by queues[{j}]); "
                    "give each queue its own name",
                )
        queues.append(queue)
        if token is not None:
            tokens[queue.name] = token
        if user is not None:
            run_as[queue.name] = user
    if not gpus_auto:
        nominal = sum(q.nominal.gpus for q in queues if q.nominal.gpus != NO_LIMIT)
        if nominal > cluster.gpus:
            raise _Invalid(
                ("cluster", "gpus"),
                f"the queues' nominal quotas add up to {nominal:g} GPUs but the cluster has "
                f"{cluster.gpus}; lower a nominal quota or raise cluster.gpus",
            )
    admin_token, service = _service(data.get("service", {}))
    restarts = _restarts(data.get("restarts", {}))
    topology, topology_auto = _topology(data["cluster"].get("topology"), cluster, gpus_auto)
    return QueueConfig(
        cluster=cluster,
        policy=policy,
        preemption=preemption,
        queues=tuple(queues),
        tokens=tokens,
        gpus_auto=gpus_auto,
        admin_token=admin_token,
        run_as=run_as,
        service=service,
        restarts=restarts,
        max_restarts=max_restarts,
        topology=topology,
        topology_auto=topology_auto,
    )


def _topology(raw: Any, cluster: Cluster, gpus_auto: bool) -> tuple[Topology | None, bool]:
    """`[cluster.topology]` (islands, pcie, sockets: lists of GPU ids), and whether it says
    "auto" instead."""
    key = ("cluster", "topology")
    if raw is None or raw == "auto":
        return None, raw == "auto"
    if not isinstance(raw, Mapping):
        raise _Invalid(
            key,
            f'expected "auto" or a table of islands, pcie and sockets (lists of GPU ids), got '
            f"{raw!r}",
        )
    if gpus_auto:
        raise _Invalid(
            key,
            "a topology names GPU ids: give cluster.gpus as a number with it, or write "
            'topology = "auto" to read both from NVML',
        )
    if cluster.nodes is not None:
        raise _Invalid(key, "a topology describes one machine's GPUs: not with `nodes`")
    try:
        return Topology.from_groups(cluster.gpus, raw), False
    except ConfigError as exc:
        raise _Invalid(key, str(exc)) from None


def _restarts(raw: Any) -> RestartSettings:
    """The [restarts] table: crash restarts, their back-off, crash loops and hangs."""
    durations = {
        "backoff": "backoff_s",
        "backoff_max": "backoff_max_s",
        "hang_after": "hang_after_s",
        "hang_min": "hang_min_s",
        "beat": "beat_s",
    }
    counts = ("max_restarts", "crash_loop_after")
    _only(raw, {*durations, *counts, "hang_factor"}, ("restarts",))
    kwargs: dict[str, Any] = {}
    for key, attr in durations.items():
        if key in raw:
            kwargs[attr] = _positive_seconds(raw[key], ("restarts", key))
    for key in counts:
        if key in raw:
            kwargs[key] = _count(raw[key], ("restarts", key))
    if kwargs.get("crash_loop_after") == 0:
        raise _Invalid(
            ("restarts", "crash_loop_after"),
            "must be at least 1 (a failure without progress); to never restart a job, set "
            "max_restarts = 0",
        )
    if "hang_factor" in raw:
        kwargs["hang_factor"] = _number(raw["hang_factor"], ("restarts", "hang_factor"), minimum=1)
    settings = RestartSettings(**kwargs)
    if settings.backoff_max_s < settings.backoff_s:
        raise _Invalid(
            ("restarts", "backoff_max" if "backoff_max" in raw else "backoff"),
            f"backoff_max ({settings.backoff_max_s:g}s) is shorter than backoff "
            f"({settings.backoff_s:g}s); set backoff_max to backoff or more",
        )
    return settings


def _count(value: Any, key: Key) -> int:
    return int(_number(value, key, integer=True))


_SERVICE_COUNTS = ("burst", "max_connections", "backlog", "notice_polls", "in_flight")


def _service(raw: Any) -> tuple[str | None, ServiceSettings]:
    """The [service] table of the reference queue manager: its admin token's spec and limits."""
    allowed = {"admin_token", "rate", "keep_alive", *_SERVICE_COUNTS}
    _only(raw, allowed, ("service",))
    token = raw.get("admin_token")
    if token is not None and not isinstance(token, str):
        raise _Invalid(
            ("service", "admin_token"), "expected a string such as 'env:PREEMPTIBLE_ADMIN_TOKEN'"
        )
    kwargs: dict[str, Any] = {}
    if "rate" in raw:
        rate = _number(raw["rate"], ("service", "rate"))
        if rate <= 0:
            raise _Invalid(("service", "rate"), "must be more than 0 requests a second")
        kwargs["rate_per_s"] = rate
    if "keep_alive" in raw:
        kwargs["keep_alive_s"] = _positive_seconds(raw["keep_alive"], ("service", "keep_alive"))
    for key in _SERVICE_COUNTS:
        if key in raw:
            kwargs[key] = int(_number(raw[key], ("service", key), minimum=1, integer=True))
    return token, ServiceSettings(**kwargs)


def _only(table: Any, allowed: set[str], key: Key) -> None:
    if not isinstance(table, Mapping):
        raise _Invalid(key, f"expected a table, got {type(table).__name__}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _Invalid(
            (*key, unknown[0]),
            f"unknown key {unknown[0]!r}; allowed keys are {', '.join(sorted(allowed))}",
        )


def _seconds(value: Any, key: Key) -> float:
    if isinstance(value, bool):
        raise _Invalid(key, f"expected a duration like '30s' or '5m', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise _Invalid(
                key,
                f"{value!r} is not a duration; write a number with a unit, "
                "e.g. '30s', '5m', '2h', '7d'",
            )
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not math.isfinite(seconds):
        raise _Invalid(key, f"must be a finite duration, got {value!r}")
    if seconds < 0:
        raise _Invalid(key, f"must not be negative, got {value!r}")
    return seconds


def _positive_seconds(value: Any, key: Key) -> float:
    seconds = _seconds(value, key)
    if seconds <= 0:
        raise _Invalid(key, "must be longer than 0s")
    return seconds


def _number(value: Any, key: Key, *, minimum: float = 0.0, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(key, f"expected a number, got {value!r}")
    if integer and int(value) != value:
        raise _Invalid(key, f"expected a whole number, got {value!r}")
    if value < minimum:
        raise _Invalid(key, f"must be at least {minimum:g}, got {value!r}")
    return float(value)


def _switch(value: Any, key: Key) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(key, f"expected true or false, got {value!r}")
    return value


def _cluster(raw: Any) -> tuple[Cluster, bool]:
    if raw is None:
        raise _Invalid(
            ("cluster",), "[cluster] is missing; add it with at least `gpus = N`", missing=True
        )
    _only(raw, {"gpus", "cpus", "memory_gb", "nodes", "gpus_per_node", "topology"}, ("cluster",))
    if "gpus" not in raw:
        raise _Invalid(
            ("cluster", "gpus"), 'missing from [cluster]; give a number or "auto"', missing=True
        )
    gpus_auto = raw["gpus"] == "auto"
    gpus = 0 if gpus_auto else int(_number(raw["gpus"], ("cluster", "gpus"), integer=True))
    nodes = raw.get("nodes")
    per_node = raw.get("gpus_per_node")
    if (nodes is None) != (per_node is None):
        given, absent = (
            ("nodes", "gpus_per_node") if per_node is None else ("gpus_per_node", "nodes")
        )
        raise _Invalid(
            ("cluster", given),
            f"cluster.{absent} is missing; give both `nodes` and `gpus_per_node`, or neither",
        )
    if nodes is not None:
        nodes = int(_number(nodes, ("cluster", "nodes"), minimum=1, integer=True))
        per_node = int(_number(per_node, ("cluster", "gpus_per_node"), minimum=1, integer=True))
        if gpus_auto:
            gpus = nodes * per_node
            gpus_auto = False
        elif nodes * per_node != gpus:
            raise _Invalid(
                ("cluster", "nodes"),
                f"nodes * gpus_per_node = {nodes * per_node} but gpus = {gpus}; make them agree",
            )
    return (
        Cluster(
            gpus=gpus,
            cpus=_number(raw.get("cpus", 0), ("cluster", "cpus")),
            memory_gb=_number(raw.get("memory_gb", 0), ("cluster", "memory_gb")),
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
        "beyond_limit",
        "elastic",
        "grow_payback",
        "resize_interval",
        "resize_interval_multiple",
    }
    _only(raw, keys, ("policy",))
    kwargs: dict[str, Any] = {}
    if "fair_share_half_life" in raw:
        kwargs["fair_share_half_life_s"] = _positive_seconds(
            raw["fair_share_half_life"], ("policy", "fair_share_half_life")
        )
    if "aging" in raw:
        kwargs["aging_s"] = _positive_seconds(raw["aging"], ("policy", "aging"))
    if "aging_max_units" in raw:
        kwargs["aging_max_units"] = _number(raw["aging_max_units"], ("policy", "aging_max_units"))
    if "starvation_limit" in raw:
        kwargs["starvation_limit_s"] = _seconds(
            raw["starvation_limit"], ("policy", "starvation_limit")
        )
    for switch in ("backfill", "defragment", "beyond_limit"):
        if switch in raw:
            kwargs[switch] = _switch(raw[switch], ("policy", switch))
    if "default_estimate" in raw:
        kwargs["default_estimate_s"] = _seconds(
            raw["default_estimate"], ("policy", "default_estimate")
        )
    if "backfill_depth" in raw:
        kwargs["backfill_depth"] = int(
            _number(raw["backfill_depth"], ("policy", "backfill_depth"), minimum=1, integer=True)
        )
    if "elastic" in raw:
        kwargs["elastic"] = _elastic(raw["elastic"])
    for name in ("grow_payback", "resize_interval_multiple"):
        if name in raw:
            kwargs[name] = _number(raw[name], ("policy", name))
    if "resize_interval" in raw:
        kwargs["resize_interval_s"] = _seconds(
            raw["resize_interval"], ("policy", "resize_interval")
        )
    return PolicySettings(**{**_fields(PolicySettings()), **kwargs})


def _elastic(value: Any) -> ElasticMode:
    modes = ", ".join(f'"{m.value}"' for m in ElasticMode)
    if not isinstance(value, str):
        raise _Invalid(("policy", "elastic"), f"must be one of {modes}, not {value!r}")
    try:
        return ElasticMode(value.strip().lower())
    except ValueError:
        raise _Invalid(("policy", "elastic"), f"must be one of {modes}, not {value!r}") from None


def _preemption(raw: Any) -> PreemptionSettings:
    durations = {
        "grace_margin": "grace_margin_s",
        "grace_min": "grace_min_s",
        "grace_max": "grace_max_s",
        "min_runtime": "min_runtime_s",
        "cooldown": "cooldown_s",
        "tier_patience": "tier_patience_s",
        "reclaim_within": "reclaim_within_s",
        "max_claimed_save": "max_claimed_save_s",
        "max_claimed_restore": "max_claimed_restore_s",
        "min_runtime_max": "min_runtime_max_s",
    }
    numbers = {"grace_safety": "grace_safety", "min_runtime_multiple": "min_runtime_multiple"}
    _only(raw, {*durations, *numbers, "queue_budget_per_hour", "enabled"}, ("preemption",))
    kwargs: dict[str, Any] = {}
    for key, attr in durations.items():
        if key in raw:
            kwargs[attr] = _seconds(raw[key], ("preemption", key))
    for key, attr in numbers.items():
        if key in raw:
            kwargs[attr] = _number(raw[key], ("preemption", key))
    if "queue_budget_per_hour" in raw:
        kwargs["queue_budget_per_hour"] = int(
            _number(
                raw["queue_budget_per_hour"], ("preemption", "queue_budget_per_hour"), integer=True
            )
        )
    if "enabled" in raw:
        kwargs["enabled"] = _switch(raw["enabled"], ("preemption", "enabled"))
    settings = PreemptionSettings(**{**_fields(PreemptionSettings()), **kwargs})
    if settings.grace_min_s > settings.grace_max_s:
        both = "grace_min" in raw and "grace_max" in raw
        default_min = "" if "grace_min" in raw else ", the default"
        default_max = "" if "grace_max" in raw else ", the default"
        raise _Invalid(
            ("preemption", "grace_min" if "grace_min" in raw else "grace_max"),
            f"grace_min ({settings.grace_min_s:g}s{default_min}) is larger than grace_max "
            f"({settings.grace_max_s:g}s{default_max}); "
            + ("swap them" if both else "set both so that grace_min <= grace_max"),
        )
    within = settings.reclaim_within_s
    if within is not None and within < settings.grace_max_s:
        raise _Invalid(
            ("preemption", "reclaim_within"),
            f"reclaim_within ({within:g}s) is shorter than grace_max "
            f"({settings.grace_max_s:g}s{'' if 'grace_max' in raw else ', the default'}): a "
            "reclaimed job may take up to grace_max to save; set reclaim_within to grace_max "
            "or more",
        )
    ceiling = settings.min_runtime_max_s
    if ceiling is not None and ceiling < settings.min_runtime_s:
        raise _Invalid(
            ("preemption", "min_runtime_max"),
            f"min_runtime_max ({ceiling:g}s) is shorter than min_runtime "
            f"({settings.min_runtime_s:g}s{'' if 'min_runtime' in raw else ', the default'}): "
            "every job runs at least min_runtime; set min_runtime_max to min_runtime or more",
        )
    return settings


def _limits(raw: Any, key: Key, *, default: float) -> Limits:
    if raw is None:
        return Limits(gpus=default)
    _only(raw, set(_RESOURCE_KEYS), key)
    values = {name: _number(raw[name], (*key, name)) for name in _RESOURCE_KEYS if name in raw}
    return Limits(**values)


def _queue(raw: Any, index: int) -> tuple[Queue, str | None, str | None]:
    """The queue, its token spec and the user its jobs run as, as written."""
    where: Key = ("queues", index)
    allowed = {"name", "weight", "nominal", "borrowing_limit", "token", "run_as", "max_restarts"}
    _only(raw, allowed, where)
    name = raw.get("name")
    if name is None:
        raise _Invalid((*where, "name"), "missing; every queue needs a `name`", missing=True)
    if not isinstance(name, str) or not name.strip():
        raise _Invalid((*where, "name"), f"every queue needs a non-empty `name`, got {name!r}")
    weight = _number(raw.get("weight", 1.0), (*where, "weight"))
    if weight <= 0:
        raise _Invalid((*where, "weight"), f"must be greater than 0, got {weight:g}")
    token = raw.get("token")
    if token is not None and not isinstance(token, str):
        raise _Invalid((*where, "token"), "expected a string such as 'env:TEAM_A_TOKEN'")
    user = raw.get("run_as")
    if user is not None and (
        not isinstance(user, str) or not _USER_NAME.match(user) or len(user) > _USER_NAME_MAX
    ):
        raise _Invalid(
            (*where, "run_as"),
            f"expected the name of a Unix user such as 'alice', got {user!r}",
        )
    queue = Queue(
        name=name,
        weight=weight,
        nominal=_limits(raw.get("nominal"), (*where, "nominal"), default=0),
        borrowing_limit=_limits(
            raw.get("borrowing_limit"), (*where, "borrowing_limit"), default=NO_LIMIT
        ),
    )
    return queue, token, user


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}
