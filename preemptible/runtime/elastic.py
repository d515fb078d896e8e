"""torch.distributed glue: agreeing on the stop step.

Every rank must stop (and save) at the same step, or the checkpoint mixes steps and the
collectives of the next step hang. A notice may reach one rank only (SLURM signals one task,
torchrun forwards to its own workers), and time-based saves read a clock that differs per rank,
so at each step boundary the ranks all-reduce two flags with MAX: "stop?" and "save?". A third
number rides along: the size a resize notice asks for (0: none), which only rank 0 hears of
(it alone talks to the queue manager) and every rank may want to log or act on.

The flags travel on a gloo group of their own (`preemptible.distributed` says why).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from preemptible.distributed import gloo_group, is_distributed


class Agreed(NamedTuple):
    """What all ranks decided at one step boundary."""

    stop: bool
    save: bool
    resize_to: int | None
    """The world size a resize notice asked for (None: no resize notice)."""


class StepAgreement:
    """One small all-reduce per step boundary; a no-op without torch.distributed."""

    def agree(self, stop: bool, save: bool, resize_to: int | None = None) -> Agreed:
        if not is_distributed():
            return Agreed(stop, save, resize_to)
        flags = torch.tensor([int(stop), int(save), resize_to or 0], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=gloo_group("agreement"))
        return Agreed(bool(flags[0]), bool(flags[1]), int(flags[2]) or None)

    def most_cautious(self, choice: int) -> int:
        """The smallest of every rank's `choice` (the last save all ranks can make)."""
        if not is_distributed():
            return choice
        value = torch.tensor([choice], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=gloo_group("agreement"))
        return int(value[0])

    def restored(self, step: int | None, none_valid: bool) -> tuple[int | None, int | None, bool]:
        """What the ranks restored, in one all-reduce: the step every rank can restore (the
        oldest; None if any rank has none), the newest, and whether any rank found committed
        checkpoints of which none was valid."""
        if not is_distributed():
            return step, step, none_valid
        mine = -1 if step is None else step
        value = torch.tensor([mine, -mine, -int(none_valid)], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=gloo_group("agreement"))
        oldest, newest = int(value[0]), -int(value[1])
        return (
            None if oldest < 0 else oldest,
            None if newest < 0 else newest,
            bool(value[2] < 0),
        )
