"""Resumable data order for a plain DataLoader: same samples, same order, after a preemption.

`ResumableSampler` shuffles with ``(seed, epoch)``, shards across ranks like
``DistributedSampler``, and remembers how many samples the training loop has *taken*. Counting
in the sampler itself would be wrong with worker processes: the DataLoader draws indices ahead of
the loop (prefetch), so the sampler would be ahead of what was trained on. The loop therefore
takes batches through ``sampler.batches(loader)``, which counts a batch when the loop receives
it. (``torchdata``'s ``StatefulDataLoader`` solves the same problem inside the loader; register
it directly instead if you use it.)

The position is saved as a *global* count, so a run resumed on a different number of ranks
continues with the samples not yet seen: after ``k`` samples per rank on ``W`` ranks, the first
``k * W`` of the epoch's permutation are done, and the rest is dealt out over the new ranks.
Ranks deal round-robin (rank ``r`` takes positions ``r, r + W, ...`` of what remains), so
whatever the sizes, ``k`` batches on every rank are exactly the next ``k * batch * W``
positions: across any sequence of world sizes, stopped at any batch boundary, each sample of an
epoch is seen once.

The one exception is the end of an epoch whose remainder ``R`` is not a multiple of the world
size: like ``DistributedSampler``, the last round is padded with the epoch's first remaining
samples, so that every rank runs as many batches (a rank with fewer would hang its peers'
collectives); ``(-R) % W`` samples are then seen twice. An epoch whose length is a multiple of
the global batch (`GlobalBatch.size`) is never padded, at any world size that batch allows.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from preemptible.errors import ConfigError, PreemptibleWarning


class ResumableSampler(Sampler[int]):
    """A shuffling, rank-sharding sampler whose position survives a restart.

    Args:
        data: the dataset (anything with ``len``) or its length.
        shuffle: a new permutation each epoch, from ``seed + epoch``.
        seed: the base seed; every rank must use the same one.
        num_replicas: ranks sharing the data (default: the torch.distributed world size).
        rank: this rank (default: the torch.distributed rank).
    """

    def __init__(
        self,
        data: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
    ):
        self.length = data if isinstance(data, int) else len(data)
        if self.length < 0:
            raise ConfigError(f"dataset length must be >= 0, got {self.length}")
        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        self.num_replicas = num_replicas or (dist.get_world_size() if initialized else 1)
        self.rank = rank if rank is not None else (dist.get_rank() if initialized else 0)
        if not 0 <= self.rank < self.num_replicas:
            raise ConfigError(f"rank {self.rank} is outside 0..{self.num_replicas - 1}")
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.consumed = 0  # global samples of this epoch that the loop has taken

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        remaining = self._order()[self.consumed :]
        padding = -len(remaining) % self.num_replicas  # pad like DistributedSampler
        if remaining and padding:  # cycle: fewer samples left than ranks must still pad them all
            remaining += (remaining * -(-padding // len(remaining)))[:padding]
        return iter(remaining[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        return -(-(self.length - self.consumed) // self.num_replicas)

    def batches(self, loader: DataLoader[Any]) -> Iterator[Any]:
        """Endless batches from ``loader`` across epochs, counting what the loop takes."""
        if loader.batch_size is None:
            raise ConfigError("batches() needs a DataLoader with batch_size set")
        if loader.generator is None:
            warnings.warn(
                "this DataLoader has no generator of its own, so each new iterator draws a seed "
                "from the global torch RNG; a resumed run draws it at another moment and will "
                "not be bit-exact. Pass generator=torch.Generator() to the DataLoader",
                PreemptibleWarning,
                stacklevel=2,
            )
        while True:
            for batch in loader:
                self.consumed = min(
                    self.length, self.consumed + loader.batch_size * self.num_replicas
                )
                yield batch
            self.set_epoch(self.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "length": self.length,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["length"] != self.length or state["seed"] != self.seed:
            raise ConfigError(
                f"sampler checkpoint is for {state['length']} samples with seed {state['seed']}, "
                f"this sampler has {self.length} with seed {self.seed}; data order cannot resume"
            )
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed"])
