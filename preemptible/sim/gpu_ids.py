"""Which GPU ids of its nodes a job gets in the simulator, and what a split placement costs.

The scheduling core places a job by count: (node, GPUs) pairs. On one machine the queue manager
then picks the GPU ids (`preemptible.queue.core.topology`): inside one NVLink island when one
fits, else over the fewest islands; before it knew the topology it took the lowest free ids.
Given each node's islands (`NodeTopology`, `--node-topology 2x4`), the simulator picks ids on
every node of a placement the same way (`PlacementMode.TOPOLOGY`), or the lowest free ids
(`PlacementMode.LOWEST`), keeps them while the job runs, grows and shrinks them as the manager
does (`Topology.grow`, `Topology.keep`), and gives them back when the job leaves. Among victims
that lose as much, the core then takes first one whose going frees a whole island, as the
manager ranks them (`ClusterState.victim_rank`); with the lowest ids nothing is ranked, as
before.

A job whose GPUs on some node span more than one island runs `1 + split_slowdown` times slower
for that run: its all-reduce leaves NVLink. One factor for every job is the simplest model that
shows what placement buys; how much a real job loses depends on how much it communicates.

Island fragmentation is measured as the share of idle GPU-hours that sat in partly used islands
(some GPUs of the island busy, some free): a free GPU there serves a job that needs no more than
the island has free, and a larger one only split. Idle GPUs in whole free islands do not count.

Rejected: the ids in the core's `NodePool`. The core decides by count and stays pure; ids are
the shell's, as in the queue manager.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from preemptible.errors import ConfigError
from preemptible.queue.core import Cluster
from preemptible.queue.core.placement import Placement
from preemptible.queue.core.topology import Topology

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class PlacementMode(StrEnum):
    """How a job gets GPU ids within a node."""

    TOPOLOGY = "topology"
    """As the queue manager places by topology: one island when one fits (`Topology.pick`)."""
    LOWEST = "lowest"
    """The lowest free ids, what the manager did before it knew the topology."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeTopology:
    """Each node's NVLink islands, how jobs get GPU ids in them, and what a split costs (no
    islands, the default: placement is by count only, as before)."""

    islands: int = 0
    """NVLink islands per node (0: no topology modelled)."""
    gpus_per_island: int = 0
    """GPUs in each island."""
    placement: PlacementMode = PlacementMode.TOPOLOGY
    """How a job gets its ids within a node."""
    split_slowdown: float = 0.0
    """A job whose GPUs on some node span islands runs `1 + split_slowdown` times slower."""

    def __post_init__(self) -> None:
        if (
            self.islands < 0
            or self.gpus_per_island < 0
            or (self.islands > 0) != (self.gpus_per_island > 0)
        ):
            raise ConfigError(
                "--node-topology takes ISLANDSxGPUS, both 1 or more (islands per node x GPUs "
                f"per island, e.g. 2x4), not {self.islands}x{self.gpus_per_island}"
            )
        if not (math.isfinite(self.split_slowdown) and self.split_slowdown >= 0):
            raise ConfigError(
                "--split-slowdown must be 0 or more (0: a split job runs as fast; 0.3: 1.3 "
                f"times slower), not {self.split_slowdown}"
            )
        if not self.on and self.placement is PlacementMode.LOWEST:
            raise ConfigError("--placement needs --node-topology (each node's islands)")
        if not self.on and self.split_slowdown:
            raise ConfigError("--split-slowdown needs --node-topology (each node's islands)")

    @classmethod
    def parse(
        cls, shape: str | None, placement: str | None = None, split_slowdown: float = 0.0
    ) -> NodeTopology:
        """From the command line: `shape` "2x4" (islands per node x GPUs per island),
        `placement` "topology" (the default with a shape) or "lowest".

        Raises:
            ConfigError: a shape or placement not of that form, or a knob without a shape.
        """
        mode = PlacementMode.TOPOLOGY
        if placement is not None:
            try:
                mode = PlacementMode(placement)
            except ValueError:
                raise ConfigError(
                    f"--placement must be topology or lowest, not {placement!r}"
                ) from None
            if shape is None:
                raise ConfigError("--placement needs --node-topology (each node's islands)")
        if shape is None:
            return cls(split_slowdown=split_slowdown)
        match = _SHAPE.match(shape)
        if match is None:
            raise ConfigError(
                "--node-topology takes ISLANDSxGPUS (islands per node x GPUs per island, "
                f"e.g. 2x4), not {shape!r}"
            )
        islands, per_island = int(match[1]), int(match[2])
        return cls(
            islands=islands,
            gpus_per_island=per_island,
            placement=mode,
            split_slowdown=split_slowdown,
        )

    @property
    def on(self) -> bool:
        """Whether GPU ids and islands are modelled."""
        return self.islands > 0

    @property
    def shape(self) -> str:
        """ "2x4": islands per node x GPUs per island."""
        return f"{self.islands}x{self.gpus_per_island}"

    def check(self, cluster: Cluster) -> None:
        """Refuse a cluster these islands do not describe.

        Raises:
            ConfigError: the cluster has no nodes, or its nodes have another number of GPUs.
        """
        if cluster.nodes is None or cluster.gpus_per_node is None:
            raise ConfigError(
                "--node-topology describes each node's GPUs: give a configuration with nodes "
                "(cluster.nodes and cluster.gpus_per_node)"
            )
        per_node = self.islands * self.gpus_per_island
        if per_node != cluster.gpus_per_node:
            raise ConfigError(
                f"--node-topology {self.shape} makes {per_node} GPUs per node, but the "
                f"configuration's nodes have {cluster.gpus_per_node} (cluster.gpus_per_node); "
                "islands x GPUs per island must equal it"
            )

    def topology(self) -> Topology:
        """One node's islands (no PCIe switches or sockets)."""
        size = self.gpus_per_island
        islands = [list(range(k * size, (k + 1) * size)) for k in range(self.islands)]
        return Topology.from_groups(self.islands * size, {"islands": islands})


@dataclass(slots=True)
class JobGpus:
    """The GPU ids a job holds on each node, and how its runs were placed."""

    ids: dict[int, list[int]] = field(default_factory=dict)
    """Node -> the GPU ids it holds there now (empty while it does not run)."""
    split: bool = False
    """Whether its GPUs now span islands on some node."""
    split_gpu_s: float = 0.0
    """GPU-seconds it held while split."""
    placements: int = 0
    """Placements it ran on: starts and resizes."""
    split_placements: int = 0
    """Of those, how many spanned islands on some node."""
    needless_placements: int = 0
    """Of those, how many spanned more islands on some node than its GPUs there need."""
    slowdown_lost_gpu_s: float = 0.0
    """GPU-seconds its split runs spent on their slowdown, for the work they kept."""
    slowdown_log: list[tuple[float, float]] = field(default_factory=list)
    """(time, GPU-seconds) of that loss, charged when the work was kept."""


class GpuIds:
    """Which GPU ids of each node are free; picks, grows, shrinks and frees jobs' ids.

    Mutated by the simulator in step with the core's `ClusterState`: every change of a job's
    placement there is mirrored here with the same counts per node.
    """

    def __init__(self, nodes: int, layout: NodeTopology, *, start_s: float):
        self.layout = layout
        self.topology = layout.topology()
        """The real islands: what counts as split."""
        self.placer = (
            self.topology
            if layout.placement is PlacementMode.TOPOLOGY
            else Topology.flat(self.topology.gpus)
        )
        """What picks ids: the islands, or none (the lowest free ids)."""
        self.free: list[set[int]] = [set(range(self.topology.gpus)) for _ in range(nodes)]
        self.dirty: set[int] = set()
        """Nodes whose free ids changed since the victims were last ranked."""
        self._island_free = [[len(g) for g in self.topology.islands] for _ in range(nodes)]
        self._free_total = nodes * self.topology.gpus
        self._free_partial = 0
        """Free GPUs in partly used islands, kept as ids change."""
        self._since = start_s
        self.idle_gpu_s = 0.0
        self.idle_partial_gpu_s = 0.0

    # --- a job's ids ------------------------------------------------------------------------

    def place(self, job: JobGpus, placement: Placement, now: float) -> None:
        """A run starts on `placement`: pick its ids on each node."""
        for node, count in placement:
            ids = self.placer.pick(self.free[node], count)
            self._take(node, ids, now)
            job.ids[node] = ids
        self._placed(job)

    def release(self, job: JobGpus, now: float) -> None:
        """The job left: all its ids are free."""
        for node, ids in job.ids.items():
            self._give(node, ids, now)
        job.ids = {}
        job.split = False

    def resize(self, job: JobGpus, placement: Placement, now: float) -> None:
        """The job holds `placement` from now (a grow sent, or a shrink saved): keep, grow and
        give up ids node by node as the queue manager does."""
        target = dict(placement)
        for node in [n for n in job.ids if n not in target]:
            self._give(node, job.ids.pop(node), now)
        for node, count in target.items():
            held = job.ids.get(node, [])
            if count < len(held):
                kept = self.placer.keep(held, count)
                self._give(node, sorted(set(held) - set(kept)), now)
                job.ids[node] = kept
            elif count > len(held):
                more = (
                    self.placer.grow(held, self.free[node], count - len(held))
                    if held
                    else self.placer.pick(self.free[node], count)
                )
                self._take(node, more, now)
                job.ids[node] = sorted([*held, *more])
        self._placed(job)

    def kept_split(self, job: JobGpus, placement: Placement) -> bool:
        """Whether the job would be split on `placement` after a shrink (it keeps its ids
        until it has saved, but its restart's speed is known at the notice)."""
        kept = {n: self.placer.keep(job.ids.get(n, []), count) for n, count in placement}
        return self._spans(kept)

    def _placed(self, job: JobGpus) -> None:
        job.split = self._spans(job.ids)
        job.placements += 1
        job.split_placements += job.split
        job.needless_placements += self._needless(job.ids)

    def _spans(self, ids: Mapping[int, Iterable[int]]) -> bool:
        return any(self.topology.islands_spanned(g) > 1 for g in ids.values())

    def _needless(self, ids: Mapping[int, Collection[int]]) -> bool:
        """Whether some node's ids span more islands than that many GPUs need."""
        size = self.layout.gpus_per_island
        return any(self.topology.islands_spanned(g) > -(-len(g) // size) for g in ids.values() if g)

    # --- victims ----------------------------------------------------------------------------

    def frees_an_island(self, job: JobGpus) -> bool:
        """Whether the job going would leave a whole island free on one of its nodes."""
        return any(self.topology.frees_an_island(g, self.free[n]) for n, g in job.ids.items())

    # --- free ids and fragmentation -----------------------------------------------------------

    def _take(self, node: int, ids: Iterable[int], now: float) -> None:
        self._advance(now)
        for gpu in ids:
            self.free[node].remove(gpu)
            self._count(node, gpu, -1)
        self.dirty.add(node)

    def _give(self, node: int, ids: Iterable[int], now: float) -> None:
        self._advance(now)
        for gpu in ids:
            if gpu in self.free[node]:
                raise AssertionError(f"GPU {gpu} of node {node} freed twice")
            self.free[node].add(gpu)
            self._count(node, gpu, +1)
        self.dirty.add(node)

    def _count(self, node: int, gpu: int, step: int) -> None:
        """Keep the free counts of `gpu`'s island and of partly used islands."""
        k = gpu // self.layout.gpus_per_island
        size = self.layout.gpus_per_island
        before = self._island_free[node][k]
        after = before + step
        self._island_free[node][k] = after
        self._free_total += step
        self._free_partial += _partial(after, size) - _partial(before, size)

    def _advance(self, now: float) -> None:
        span = now - self._since
        if span > 0:
            self.idle_gpu_s += span * self._free_total
            self.idle_partial_gpu_s += span * self._free_partial
            self._since = now

    def fragmentation(self, now: float) -> float:
        """Share of the idle GPU-seconds up to `now` that sat in partly used islands."""
        self._advance(now)
        return self.idle_partial_gpu_s / self.idle_gpu_s if self.idle_gpu_s else 0.0


def _partial(free: int, size: int) -> int:
    """Free GPUs of an island that count as fragmented: those of a partly used one."""
    return free if 0 < free < size else 0
