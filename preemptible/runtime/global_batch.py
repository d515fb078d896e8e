"""A global batch that stays the same on any number of ranks, so a resize keeps the math.

An optimizer step sees ``size`` samples whatever the world size: each rank runs
``accumulation_steps = size / (micro_batch * world_size)`` forward and backward passes of
``micro_batch`` samples and sums their gradients before the step. A job resized from 4 ranks
to 2 then accumulates twice as many micro-batches, and its steps average the same samples
(`ResumableSampler` deals them) with the same learning rate.

Rejected: scaling the learning rate with the world size (the linear rule is a heuristic and
changes the trajectory), and growing the micro-batch as ranks leave (it may not fit in memory).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from preemptible.errors import ConfigError
from preemptible.runtime.env import RunEnv


class GlobalBatch:
    """Gradient accumulation derived from the world size, for a constant global batch.

    Args:
        size: samples per optimizer step, over all ranks.
        micro_batch: samples per forward/backward pass on one rank (the DataLoader's
            ``batch_size``).
        world_size: ranks (default: torch.distributed's world size, else ``WORLD_SIZE``).

    Raises:
        ConfigError: a size is not positive, or ``size`` is not a multiple of
            ``micro_batch * world_size`` (the message lists the world sizes and micro-batches
            that would work).

    In the loop, sum the per-sample losses of each micro-batch and pass them through
    `scale` before ``backward``: summed over the micro-batches of a rank and averaged over the
    ranks (as DistributedDataParallel averages gradients), the gradient is the mean gradient
    over the global batch::

        gb = GlobalBatch(64, micro_batch=4)
        for step in ctx.steps(total):
            opt.zero_grad()
            for i in range(gb.accumulation_steps):
                x, y = next(batches)
                sync = i == gb.accumulation_steps - 1  # all-reduce once, on the last
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    gb.scale(loss_fn(ddp(x), y, reduction="sum")).backward()
            opt.step()
    """

    __slots__ = ("accumulation_steps", "micro_batch", "size", "world_size")

    size: int
    micro_batch: int
    world_size: int
    accumulation_steps: int

    def __init__(self, size: int, *, micro_batch: int, world_size: int | None = None):
        if world_size is None:
            initialized = dist.is_available() and dist.is_initialized()
            world_size = dist.get_world_size() if initialized else RunEnv.from_env().world_size
        sizes = {"size": size, "micro_batch": micro_batch, "world_size": world_size}
        for name, value in sizes.items():
            if type(value) is not int or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        per_pass = micro_batch * world_size
        if size % per_pass:
            raise ConfigError(_not_divisible(size, micro_batch, world_size))
        self.size = size
        self.micro_batch = micro_batch
        self.world_size = world_size
        self.accumulation_steps = size // per_pass  # micro-batches per rank per step

    @property
    def per_rank(self) -> int:
        """Samples one rank sees per optimizer step (``micro_batch * accumulation_steps``)."""
        return self.micro_batch * self.accumulation_steps

    def scale(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss summed over its samples, divided by `per_rank`: what to call
        ``backward`` on so that the gradient, averaged over the ranks, is the global batch's
        mean. (For a loss that is already a mean over the micro-batch, divide it by
        `accumulation_steps` instead; it is the same when every micro-batch is full.)"""
        return loss_sum / self.per_rank

    def __repr__(self) -> str:
        return (
            f"GlobalBatch(size={self.size}, micro_batch={self.micro_batch}, "
            f"world_size={self.world_size}, accumulation_steps={self.accumulation_steps})"
        )


def _not_divisible(size: int, micro_batch: int, world_size: int) -> str:
    """The error for a global batch the ranks cannot split evenly, with the sizes that can."""
    worlds = [w for w in range(1, size + 1) if size % (micro_batch * w) == 0]
    micros = [m for m in range(1, size + 1) if size % (m * world_size) == 0]
    works = f"world sizes that work with micro_batch {micro_batch}: {_listed(worlds)}"
    fits = f"micro-batches that work on {world_size} ranks: {_listed(micros)}"
    return (
        f"a global batch of {size} does not split into micro-batches of {micro_batch} on "
        f"{world_size} ranks ({size} is not a multiple of {micro_batch} x {world_size} = "
        f"{micro_batch * world_size}); {works}; {fits}"
    )


def _listed(values: list[int]) -> str:
    return ", ".join(map(str, values)) if values else "none"
