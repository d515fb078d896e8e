"""torch.distributed glue: agreeing on the stop step, and the process groups checkpoints use.

Every rank must stop (and save) at the same step, or the checkpoint mixes steps and the
collectives of the next step hang. A notice may reach one rank only (SLURM signals one task,
torchrun forwards to its own workers), and time-based saves read a clock that differs per rank,
so at each step boundary the ranks all-reduce two flags with MAX: "stop?" and "save?".

The flags travel on a dedicated gloo group: it works whatever the training backend is (no GPU
sync for NCCL), and it keeps these collectives from interleaving with the model's. Background
saves use yet another gloo group, because they run collectives from a thread while the main
thread runs its own. Groups are created lazily, in the main thread, at points every rank reaches
in the same order (the first step boundary, the first save).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

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
    client = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_seconds),
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"preemptible/attempt_{attempt}", client),
        rank=int(env["RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout_seconds),
        **kwargs,
    )


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gloo_group(purpose: str) -> Any:
    """A gloo process group over all ranks, one per ``purpose``, created once (collectively)."""
    group = _groups.get(purpose)
    if group is None:
        group = dist.new_group(backend="gloo")
        _groups[purpose] = group
    return group


def forget_groups() -> None:
    """Drop cached groups (after ``destroy_process_group``)."""
    _groups.clear()


class StepAgreement:
    """One small all-reduce per step boundary; a no-op without torch.distributed."""

    def agree(self, stop: bool, save: bool) -> tuple[bool, bool]:
        if not is_distributed():
            return stop, save
        flags = torch.tensor([int(stop), int(save)], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=gloo_group("agreement"))
        return bool(flags[0]), bool(flags[1])

    def same_step(self, step: int | None) -> int | None:
        """The step every rank can restore: the minimum over ranks (None if any has none)."""
        if not is_distributed():
            return step
        value = torch.tensor([-1 if step is None else step], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=gloo_group("agreement"))
        agreed = int(value.item())
        return None if agreed < 0 else agreed
