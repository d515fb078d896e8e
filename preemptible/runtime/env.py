"""Where this process runs: rank and world size, torchrun, SLURM, Kubernetes, and their pitfalls.

`RunEnv` is read once from the environment (torchrun's, SLURM's and Kubernetes' variables)
and never changes. `check_signal_setup` turns known failure modes of these stacks into
warnings a human can act on, measured on our machines (`docs/user-guide/preemption.md`): torchrun
SIGKILLs its workers ``--shutdown-timeout`` seconds (30 by default) after forwarding a SIGTERM,
and dies of SIGUSR1 without forwarding it, which orphans the workers.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from preemptible._env_names import LAUNCH_ENV, LAUNCH_TRANSLATES_ENV
from preemptible.errors import ConfigError

TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT_SECS = 30.0
"""torchrun's ``--shutdown-timeout`` default (torch.distributed.launcher.api)."""

TORCHRUN_DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
)
"""What torchrun handles (and forwards) when ``--signals-to-handle`` is not given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnv:
    """What the environment says about how this process was launched."""

    rank: int = 0
    """Global rank (``RANK``); 0 when not distributed."""
    local_rank: int = 0
    """Rank on this node (``LOCAL_RANK``)."""
    world_size: int = 1
    """Number of ranks (``WORLD_SIZE``)."""
    local_world_size: int = 1
    """Ranks on this node (``LOCAL_WORLD_SIZE``)."""
    restart_count: int = 0
    """torchrun restarts of the worker group (``TORCHELASTIC_RESTART_COUNT``)."""
    run_id: str | None = None
    """``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; the string "none" without one)."""
    under_torchrun: bool = False
    """Started by torchrun (``TORCHELASTIC_RUN_ID`` or ``TORCHELASTIC_RESTART_COUNT`` present)."""
    torchrun_shutdown_timeout: float | None = None
    """Seconds torchrun waits after forwarding a signal before SIGKILLing the workers.

    From ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` if set, else torchrun's default of 30 s. The
    ``--shutdown-timeout`` flag is not visible to workers, so a value passed that way is not seen
    here. None when not under torchrun.
    """
    torchrun_handled_signals: tuple[signal.Signals, ...] = ()
    """Signals torchrun catches and forwards (``TORCHELASTIC_SIGNALS_TO_HANDLE``); any other
    signal kills torchrun outright. Empty when not under torchrun."""
    slurm_job_id: str | None = None
    """``SLURM_JOB_ID``."""
    slurm_restart_count: int = 0
    """Requeues of the SLURM job (``SLURM_RESTART_COUNT``)."""
    under_slurm: bool = False
    """Running inside a SLURM allocation."""
    on_kubernetes: bool = False
    """Running in a Kubernetes pod (``KUBERNETES_SERVICE_HOST``)."""
    under_launch: bool = False
    """Started (directly or through torchrun) by ``preemptible launch``."""
    launch_translates: tuple[signal.Signals, ...] = ()
    """Signals ``preemptible launch`` translates into SIGTERM for its child."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RunEnv:
        """Read the environment (``os.environ`` by default).

        Raises:
            ConfigError: A variable that must be an integer or a duration is not.
        """
        env = os.environ if env is None else env
        under_torchrun = "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env
        shutdown: float | None = None
        handled: tuple[signal.Signals, ...] = ()
        if under_torchrun:
            shutdown = seconds_from_env(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
            if shutdown is None:
                shutdown = TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT_SECS
            raw = env.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
            handled = (
                parse_signal_list(raw, "TORCHELASTIC_SIGNALS_TO_HANDLE")
                if raw
                else TORCHRUN_DEFAULT_SIGNALS
            )
        slurm_job_id = env.get("SLURM_JOB_ID") or None
        translates = env.get(LAUNCH_TRANSLATES_ENV)
        return cls(
            rank=_int(env, "RANK", 0),
            local_rank=_int(env, "LOCAL_RANK", 0),
            world_size=_int(env, "WORLD_SIZE", 1),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1),
            restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            run_id=env.get("TORCHELASTIC_RUN_ID"),
            under_torchrun=under_torchrun,
            torchrun_shutdown_timeout=shutdown,
            torchrun_handled_signals=handled,
            slurm_job_id=slurm_job_id,
            slurm_restart_count=_int(env, "SLURM_RESTART_COUNT", 0),
            under_slurm=slurm_job_id is not None,
            on_kubernetes=bool(env.get("KUBERNETES_SERVICE_HOST")),
            under_launch=bool(env.get(LAUNCH_ENV)),
            launch_translates=(
                parse_signal_list(translates, LAUNCH_TRANSLATES_ENV) if translates else ()
            ),
        )


def parse_signal_list(raw: str, name: str = "signal list") -> tuple[signal.Signals, ...]:
    """Parse ``"SIGTERM,SIGINT,USR1,15"`` into signals, in order, without duplicates.

    Raises:
        ConfigError: An entry is not a known signal; the message names the variable.
    """
    result: list[signal.Signals] = []
    for item in raw.split(","):
        token = item.strip().upper()
        if not token:
            continue
        try:
            sig = signal.Signals(int(token)) if token.isdigit() else signal.Signals[_sig(token)]
        except (KeyError, ValueError):
            raise ConfigError(f"{name}: {item.strip()!r} is not a signal name or number") from None
        if sig not in result:
            result.append(sig)
    return tuple(result)


def check_signal_setup(run_env: RunEnv, save_seconds_p95: float | None) -> list[str]:
    """Warn about launch setups that lose the final checkpoint; each warning says how to fix it.

    Whether the grace period fits a save is `preemptible.runtime.deadline.GraceCheck`'s job.

    Args:
        run_env: The environment, from `RunEnv.from_env`.
        save_seconds_p95: Measured p95 of a synchronous save, if known.

    Returns:
        Human-readable warnings; empty when nothing is known to be wrong.
    """
    warnings: list[str] = []
    timeout = run_env.torchrun_shutdown_timeout if run_env.under_torchrun else None
    save = save_seconds_p95
    if timeout is not None and save is not None and timeout < save:
        suggested = math.ceil(1.5 * save + 10)
        warnings.append(
            f"torchrun SIGKILLs the workers {timeout:g}s after forwarding a SIGTERM, but a "
            f"save takes {save:.1f}s (p95): the final checkpoint would be cut "
            f"off. Raise it with `torchrun --shutdown-timeout={suggested}` or "
            f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={suggested} (the flag is invisible to workers, "
            "so this warning may be stale if you already passed it)."
        )
    if run_env.under_torchrun and signal.SIGTERM not in run_env.torchrun_handled_signals:
        warnings.append(
            "torchrun does not handle SIGTERM (TORCHELASTIC_SIGNALS_TO_HANDLE="
            f"{_names(run_env.torchrun_handled_signals)}): a SIGTERM kills torchrun at once and "
            "orphans the workers. Add SIGTERM to --signals-to-handle."
        )
    usr1_covered = (
        signal.SIGUSR1 in run_env.torchrun_handled_signals
        or signal.SIGUSR1 in run_env.launch_translates
    )
    if run_env.under_torchrun and run_env.under_slurm and not usr1_covered:
        warnings.append(
            "Under SLURM, `--signal=B:USR1@N` sends SIGUSR1, which torchrun does not handle: it "
            "dies at once and orphans its workers, which never see the notice. Start it as "
            "`preemptible launch -- torchrun ...` (translates USR1 into SIGTERM, which torchrun "
            "forwards), or use `--signal=B:USR1` with a batch script that traps USR1 and sends "
            "SIGTERM to torchrun."
        )
    return warnings


def _sig(token: str) -> str:
    return token if token.startswith("SIG") else f"SIG{token}"


def _names(signals: tuple[signal.Signals, ...]) -> str:
    return ",".join(s.name for s in signals) or "(none)"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def seconds_from_env(env: Mapping[str, str], name: str) -> float | None:
    """A duration in seconds from ``env[name]`` (None if unset or blank).

    Raises:
        ConfigError: the value is not a finite number >= 0; the message names the variable.
    """
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds (e.g. {name}=120)") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}={raw!r} must be a finite number of seconds >= 0")
    return value
