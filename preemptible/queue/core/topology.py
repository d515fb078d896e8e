"""Which of a machine's GPUs a job gets: inside one NVLink island when one fits, then under one
PCIe switch, then on one socket (NUMA node), else over the fewest islands.

A 4-GPU job on an 8-GPU machine of two NVLink islands runs its all-reduce over NVLink when its
GPUs share an island, and over PCIe and the CPU interconnect when they do not, several times
slower. Counting GPUs is not enough; the lowest free ids, which is what placement took before,
split a job whenever an earlier one left a hole.

Each level is a partition of the GPU ids (a GPU a level leaves out is a group of its own). At
each level, from the closest, the group that fits the job with the fewest GPUs to spare takes it
(best fit, as nodes are chosen in `placement.py`), which keeps whole islands free for the next
large job; within a level's group, and when nothing fits whole, the job takes the islands with
the most free GPUs first, so it spans as few as it can.

Rejected: scoring every subset by its links' bandwidth (NVIDIA's `nvidia-smi topo -m` matrix):
exponential in the job's size, and what jobs lose comes from crossing a boundary at all, which
the levels say.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from preemptible.errors import ConfigError

LEVELS = ("islands", "pcie", "sockets")
"""Closest first: NVLink islands, PCIe switches, sockets (NUMA nodes)."""


@dataclass(frozen=True, slots=True)
class Topology:
    """A machine's GPUs grouped at each level, closest first; each level a partition of
    `range(gpus)` (singletons for GPUs it does not list)."""

    gpus: int
    islands: tuple[frozenset[int], ...]
    pcie: tuple[frozenset[int], ...]
    sockets: tuple[frozenset[int], ...]

    @classmethod
    def from_groups(cls, gpus: int, groups: Mapping[str, Any]) -> Topology:
        """From lists of GPU ids per level ({"islands": [[0, 1, 2, 3], [4, 5, 6, 7]]}).

        Raises:
            ConfigError: an unknown level, an id out of range, or a GPU in two groups of one
                level; the message says which.
        """
        unknown = set(groups) - set(LEVELS)
        if unknown:
            raise ConfigError(
                f"unknown level {sorted(unknown)[0]!r}; levels are "
                f"{', '.join(LEVELS)} (each a list of lists of GPU ids)"
            )
        levels = {level: _partition(level, groups.get(level, ()), gpus) for level in LEVELS}
        return cls(gpus=gpus, **levels)

    @classmethod
    def flat(cls, gpus: int) -> Topology:
        """Every GPU alike (no level known): placement takes the lowest free ids."""
        single = tuple(frozenset({g}) for g in range(gpus))
        return cls(gpus=gpus, islands=single, pcie=single, sockets=single)

    @property
    def known(self) -> bool:
        """Whether any level groups GPUs together."""
        return any(len(g) > 1 for level in (self.islands, self.pcie, self.sockets) for g in level)

    def describe(self) -> str:
        """ "2 NVLink islands of 4, 2 sockets of 4" (what `queue serve` logs at start)."""
        words = {"islands": "NVLink islands", "pcie": "PCIe switches", "sockets": "sockets"}
        parts = []
        for level in LEVELS:
            sizes = sorted({len(g) for g in getattr(self, level) if len(g) > 1})
            count = sum(1 for g in getattr(self, level) if len(g) > 1)
            if count:
                parts.append(f"{count} {words[level]} of {'/'.join(map(str, sizes))}")
        return ", ".join(parts) or "no topology (every GPU alike)"

    def pick(self, free: Collection[int], count: int) -> list[int]:
        """`count` GPUs of `free` for a job: inside the closest group that fits (best fit),
        else over the fewest islands. The lowest ids when the machine has no known topology.

        Raises:
            ValueError: fewer than `count` GPUs are free (the caller counted wrong).
        """
        available = set(free)
        if count > len(available):
            raise ValueError(f"{count} GPUs asked for, {len(available)} free")
        if count <= 0:
            return []
        if not self.known:
            return sorted(available)[:count]
        for level in LEVELS:
            fits = [g for g in getattr(self, level) if len(g & available) >= count]
            if fits:
                best = min(fits, key=lambda g: (len(g & available), min(g)))
                return self._fewest_islands(best & available, count)
        return self._fewest_islands(available, count)

    def _fewest_islands(self, available: set[int], count: int) -> list[int]:
        """`count` of `available`, the islands with the most of them first (then lowest id)."""
        by_island = sorted(
            (sorted(g & available) for g in self.islands if g & available),
            key=lambda ids: (-len(ids), ids[0]),
        )
        return sorted([g for ids in by_island for g in ids][:count])

    def grow(self, held: Collection[int], free: Collection[int], count: int) -> list[int]:
        """`count` more of `free` for a job that holds `held`: in its islands first, then its
        PCIe switches, then its sockets, then the rest (lowest ids first at each step)."""
        mine = set(held)

        def distance(gpu: int) -> tuple[int, int]:
            for k, level in enumerate(LEVELS):
                group = next(g for g in getattr(self, level) if gpu in g)
                if group & mine:
                    return k, gpu
            return len(LEVELS), gpu

        return sorted(sorted(free, key=distance)[:count])

    def keep(self, held: Sequence[int], count: int) -> list[int]:
        """The `count` of `held` a shrinking job keeps: those in the islands where it holds the
        most, so that what it gives up leaves whole islands where it can."""
        by_island = sorted(
            (sorted(g & set(held)) for g in self.islands if g & set(held)),
            key=lambda ids: (-len(ids), ids[0]),
        )
        return sorted([g for ids in by_island for g in ids][:count])

    def island_of(self, gpu: int) -> frozenset[int]:
        return next(g for g in self.islands if gpu in g)

    def islands_spanned(self, gpus: Iterable[int]) -> int:
        """How many islands a job's GPUs touch (1: all its traffic stays on NVLink)."""
        return len({self.island_of(g) for g in gpus})

    def frees_an_island(self, held: Collection[int], free: Collection[int]) -> bool:
        """Whether `held` going would leave a whole island of more than one GPU free."""
        after = set(free) | set(held)
        return any(len(g) > 1 and g & set(held) and g <= after for g in self.islands)


def _partition(level: str, groups: Any, gpus: int) -> tuple[frozenset[int], ...]:
    """A level's groups as written (checked: a list of lists of this machine's GPU ids, each
    id in one group at most), with a group of its own for each GPU left out."""
    if not isinstance(groups, Sequence) or isinstance(groups, str):
        raise ConfigError(f"{level}: expected a list of lists of GPU ids, got {groups!r}")
    seen: dict[int, int] = {}
    found: list[frozenset[int]] = []
    for k, group in enumerate(groups):
        if not isinstance(group, Sequence) or isinstance(group, str) or not group:
            raise ConfigError(f"{level}[{k}]: expected a non-empty list of GPU ids")
        for gpu in group:
            if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpus:
                raise ConfigError(
                    f"{level}[{k}]: {gpu!r} is not a GPU of this machine (0 to {gpus - 1})"
                )
            if gpu in seen:
                raise ConfigError(
                    f"{level}: GPU {gpu} is in groups {seen[gpu]} and {k}; a GPU "
                    "belongs to one group of each level"
                )
            seen[gpu] = k
        found.append(frozenset(group))
    found += [frozenset({g}) for g in range(gpus) if g not in seen]
    return tuple(sorted(found, key=min))
