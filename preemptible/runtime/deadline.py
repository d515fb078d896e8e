"""How long a job has between its preemption notice and the kill: discovering the grace period.

A notice is only useful with a deadline: the training loop must know whether there is time for
one more step and a synchronous save. No scheduler hands that number to the job in a standard way,
so `discover_grace` looks in order at:

1. ``PREEMPTIBLE_GRACE_SECONDS``, set by the queue manager (the negotiated grace) or by the user.
   It wins because it is the only value that is exactly right by construction.
2. SLURM, when ``SLURM_JOB_ID`` is set. SLURM puts neither the partition's preemption
   ``GraceTime`` nor the job's ``--signal=...@N`` lead time in the environment, so we ask
   ``scontrol`` (once, with a short timeout) for the partition's GraceTime and the job's EndTime,
   and read the lead time from ``PREEMPTIBLE_SLURM_SIGNAL_SECONDS`` (the user mirrors their
   ``--signal``) or ``SBATCH_SIGNAL`` (which sbatch honours and the job can see). We do not know
   which of the two events a notice announces, so the shorter of the two is used: an early
   deadline costs a little work, a late one costs the checkpoint. The job's EndTime bounds every
   deadline (``Grace.not_after``). A missing or failing ``scontrol`` means "unknown", never a crash.
3. Kubernetes: ``PREEMPTIBLE_POD_GRACE_SECONDS``. Kubernetes does not tell a container its
   ``terminationGracePeriodSeconds``, so the pod spec sets this variable to the same number.
4. Otherwise unknown (``None``): callers must treat that as "save as soon as possible".

Each `Grace` also says which setting made it (`Grace.fix`), so that `GraceCheck` can tell
a job whose saves outgrew its grace exactly what to change, in the scheduler's own words.

The parsers of ``scontrol -o`` output are pure functions so that they are tested on real output.
"""

from __future__ import annotations

import math
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from preemptible._env_names import GRACE_ENV, POD_GRACE_ENV, SLURM_SIGNAL_ENV
from preemptible.errors import ConfigError
from preemptible.runtime.env import seconds_from_env

GRACE_SAFETY = 1.5
"""A grace shorter than this many saves (p95) is warned about: a save on a busy disk or a loaded
network is slower than the usual one, and the final save also waits for the step in progress."""

SCONTROL_TIMEOUT_SECS = 3.0
"""A slow slurmctld must not delay the start of training by more than this."""

SLURM_DEFAULT_SIGNAL_SECS = 60.0
"""``--signal=USR1`` without ``@N`` means 60 seconds before the end (sbatch man page)."""

_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][\w:/]*)=")
_SIGNAL_SPEC = re.compile(r"^(?:[RB]{1,2}:)?(?P<sig>[A-Za-z0-9]+)(?:@(?P<secs>\d+))?$")

# (argv, timeout) -> stdout, or None when the command is missing, fails or times out.
CommandRunner = Callable[[list[str], float], str | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Grace:
    """The grace period a notice gives, and where that number came from."""

    seconds: float | None
    """Seconds from a notice to the kill; None when unknown."""
    source: str
    """One of "argument", "PREEMPTIBLE_GRACE_SECONDS", "slurm", "kubernetes", "queue manager",
    "unknown"."""
    not_after: float | None = None
    """Wall-clock time (epoch seconds) no deadline can pass: the SLURM job's EndTime."""
    fix: str = field(default="", compare=False)
    """The setting that gives this grace, as advice with ``{n}`` for the seconds wanted."""

    def advice(self, seconds: int) -> str:
        """What to set so that the grace becomes ``seconds``."""
        return self.fix.format(n=seconds) if self.fix else f"a grace period of {seconds} s"


def _fix_for(source: str) -> str:
    return {
        GRACE_ENV: f"{GRACE_ENV}={{n}} (and the scheduler's real grace period to match)",
        "kubernetes": (
            "terminationGracePeriodSeconds: {n} in the pod spec, with the "
            f"preemptible.dev/grace-seconds annotation ({POD_GRACE_ENV}) to match"
        ),
    }.get(source, "")


def discover_grace(env: Mapping[str, str], *, runner: CommandRunner | None = None) -> Grace:
    """Find the grace period of this job, from the most to the least authoritative source.

    Args:
        env: The environment to read (usually ``os.environ``).
        runner: Runs ``scontrol``; injected by tests. Defaults to a subprocess with a timeout.

    Returns:
        The grace period and its source; ``Grace(seconds=None, source="unknown")`` if none.

    Raises:
        ConfigError: A ``PREEMPTIBLE_*`` variable is set to something that is not a duration.
    """
    explicit = seconds_from_env(env, GRACE_ENV)
    pod = seconds_from_env(env, POD_GRACE_ENV)  # validated even when unused: a typo fails early
    if explicit is not None:
        return Grace(seconds=explicit, source=GRACE_ENV, fix=_fix_for(GRACE_ENV))
    if env.get("SLURM_JOB_ID"):
        grace = _slurm_grace(env, runner or _run)
        if grace.seconds is not None or grace.not_after is not None:
            return grace
    if pod is not None:
        return Grace(seconds=pod, source="kubernetes", fix=_fix_for("kubernetes"))
    return Grace(seconds=None, source="unknown")


class GraceCheck:
    """Warns when the grace period is shorter than ``safety`` saves, and says what to change.

    Called at start (with the save time of the checkpoint restored) and after each measured
    save. It warns once per problem: again only when the grace changed or the time wanted grew
    by more than a quarter, so a job whose saves slowly grow does not log every save.
    """

    def __init__(self, safety: float = GRACE_SAFETY):
        if not (math.isfinite(safety) and safety >= 1):
            raise ConfigError(f"grace safety must be a finite number >= 1, got {safety!r}")
        self.safety = safety
        self._warned: tuple[float, str, int] | None = None

    def __call__(self, grace: Grace, save_seconds: float, *, measured: str) -> str | None:
        """A warning, or None when the grace is enough, unknown or already warned about.

        Args:
            grace: the grace period the job has.
            save_seconds: how long a save takes.
            measured: what `save_seconds` is, for the message ("p95 of 12 saves").
        """
        wanted = self.safety * save_seconds
        if grace.seconds is None or grace.seconds >= wanted:
            self._warned = None
            return None
        n = math.ceil(wanted)
        if self._warned is not None:
            seconds, source, warned_n = self._warned
            if (seconds, source) == (grace.seconds, grace.source) and n <= 1.25 * warned_n:
                return None
        self._warned = (grace.seconds, grace.source, n)
        return (
            f"The grace period is {grace.seconds:g} s (from {grace.source}), but a save takes "
            f"{save_seconds:.1f} s ({measured}) and a notice should leave {self.safety:g} times "
            f"that, {n} s: a notice now could cut off the final checkpoint. Set "
            f"{grace.advice(n)}, or make saves cheaper."
        )


def parse_scontrol_record(text: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` record (``Key=Value`` pairs on one line) into a dict.

    Values may hold ``=`` (``TRES=cpu=4,node=1``) and spaces (``Comment=two words``); a key starts
    after whitespace and is made of letters, digits, ``_``, ``:`` and ``/`` (``AllocNode:Sid``,
    ``CPUs/Task``). Only the first line is read.
    """
    line = text.strip().splitlines()[0] if text.strip() else ""
    matches = list(_KEY.finditer(line))
    record: dict[str, str] = {}
    for index, match in enumerate(matches):
        following = matches[index + 1] if index + 1 < len(matches) else None
        end = following.start() if following is not None else len(line)
        record.setdefault(match.group(1), line[match.end() : end].strip())
    return record


def parse_grace_time(partition_text: str) -> float | None:
    """GraceTime (seconds) from ``scontrol show partition -o NAME``; None when absent or zero.

    Zero means "no grace": the job is signalled and killed KillWait later, which we do not read.
    """
    value = parse_scontrol_record(partition_text).get("GraceTime")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def parse_end_time(job_text: str) -> float | None:
    """The job's EndTime from ``scontrol show job -o ID`` as epoch seconds; None if unknown.

    SLURM prints local time without a zone (``2026-11-29T10:15:00``), or ``Unknown``/``None``
    for jobs without a time limit.
    """
    value = parse_scontrol_record(job_text).get("EndTime", "")
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def parse_signal_spec(spec: str) -> float | None:
    """Lead time in seconds of a ``--signal`` value such as ``B:USR1@120``; None if unparsable."""
    match = _SIGNAL_SPEC.match(spec.strip())
    if match is None or not _is_signal_name(match.group("sig")):
        return None
    secs = match.group("secs")
    return float(secs) if secs is not None else SLURM_DEFAULT_SIGNAL_SECS


def _is_signal_name(name: str) -> bool:
    if name.isdigit():
        return 0 < int(name) < signal.NSIG
    upper = name.upper()
    return hasattr(signal, upper if upper.startswith("SIG") else f"SIG{upper}")


def _slurm_grace(env: Mapping[str, str], runner: CommandRunner) -> Grace:
    candidates: list[tuple[float, str]] = []
    lead = _slurm_signal_seconds(env)
    if lead is not None:
        candidates.append(
            (lead, "sbatch --signal=B:USR1@{n} (with SBATCH_SIGNAL=B:USR1@{n}, so the job sees it)")
        )
    job_id = env["SLURM_JOB_ID"]
    job_text = runner(["scontrol", "show", "job", "-o", job_id], SCONTROL_TIMEOUT_SECS)
    job = parse_scontrol_record(job_text) if job_text else {}
    end_at = parse_end_time(job_text) if job_text else None
    partition = env.get("SLURM_JOB_PARTITION") or job.get("Partition")
    if partition:
        argv = ["scontrol", "show", "partition", "-o", partition]
        part_text = runner(argv, SCONTROL_TIMEOUT_SECS)
        grace_time = parse_grace_time(part_text) if part_text else None
        if grace_time is not None:
            candidates.append(
                (
                    grace_time,
                    f"GraceTime={{n}} on partition {partition} (slurm.conf, or `scontrol update "
                    f"PartitionName={partition} GraceTime={{n}}`)",
                )
            )
    if not candidates:
        return Grace(seconds=None, source="slurm", not_after=end_at)
    seconds, fix = min(candidates)
    return Grace(seconds=seconds, source="slurm", not_after=end_at, fix=fix)


def _slurm_signal_seconds(env: Mapping[str, str]) -> float | None:
    raw = env.get(SLURM_SIGNAL_ENV)
    if raw is None or not raw.strip():
        sbatch = env.get("SBATCH_SIGNAL")
        return parse_signal_spec(sbatch) if sbatch else None
    try:
        float(raw)
    except ValueError:
        lead = parse_signal_spec(raw)
        if lead is None:
            raise ConfigError(
                f"{SLURM_SIGNAL_ENV}={raw!r} is neither a number of seconds nor a --signal "
                "value such as 'B:USR1@120'"
            ) from None
        return lead
    return seconds_from_env(env, SLURM_SIGNAL_ENV)


def _run(argv: list[str], timeout: float) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None
