"""Placing GPU jobs on nodes, best fit first, and measuring fragmentation.

A job of up to one node's GPUs lands on a single node: the fullest node that still has room
(best fit), which keeps whole nodes free for gang jobs. A larger job takes whole free nodes plus,
for a remainder, the best-fitting partial node; it waits until such a block exists instead of
scattering over many half-used nodes. Without nodes the cluster is one flat pool and placement
is only a count. Free nodes are kept in buckets by free-GPU count, each bucket a sorted list, so
a placement reads the first node of at most `gpus_per_node` buckets (skipping the nodes it must
avoid) rather than visiting every node: at 100,000 running jobs a cycle places thousands.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Collection, Iterable
from itertools import islice

Placement = tuple[tuple[int, int], ...]


class NodePool:
    """Free GPUs per node, with buckets by free count. Mutable; copy() before speculating."""

    __slots__ = ("by_free", "free", "gpus_per_node")

    def __init__(self, nodes: int, gpus_per_node: int):
        self.gpus_per_node = gpus_per_node
        self.free = [gpus_per_node] * nodes
        self.by_free: list[list[int]] = [[] for _ in range(gpus_per_node + 1)]
        """Per free-GPU count, the nodes with that many free, in index order."""
        self.by_free[gpus_per_node] = list(range(nodes))

    def copy(self) -> NodePool:
        """An independent copy."""
        other = NodePool.__new__(NodePool)
        other.gpus_per_node = self.gpus_per_node
        other.free = list(self.free)
        other.by_free = [list(b) for b in self.by_free]
        return other

    @property
    def total_free(self) -> int:
        """Free GPUs over all nodes."""
        return sum(k * len(b) for k, b in enumerate(self.by_free))

    def _set(self, node: int, free: int) -> None:
        bucket = self.by_free[self.free[node]]
        del bucket[bisect_left(bucket, node)]
        self.free[node] = free
        insort(self.by_free[free], node)

    def find(self, gpus: int, *, avoid: Collection[int] = ()) -> Placement | None:
        """Where a job of `gpus` GPUs would go now, or None if no block is free.

        `avoid`: nodes not to use (those a reservation holds).
        """
        per = self.gpus_per_node
        if gpus <= 0:
            return ()
        if gpus <= per:
            node = self._partial(gpus, avoid)
            return None if node is None else ((node, gpus),)
        whole, rest = divmod(gpus, per)
        empty = self.by_free[per]
        chosen = (
            list(islice((n for n in empty if n not in avoid), whole)) if avoid else empty[:whole]
        )
        if len(chosen) < whole:
            return None
        placement = [(n, per) for n in chosen]
        if rest:
            node = self._partial(rest, {*chosen, *avoid})
            if node is None:
                return None
            placement.append((node, rest))
        return tuple(placement)

    def _partial(self, gpus: int, exclude: Collection[int]) -> int | None:
        """The fullest node with room for `gpus` (lowest index first), outside `exclude`."""
        for k in range(gpus, self.gpus_per_node + 1):
            bucket = self.by_free[k]
            if not bucket:
                continue
            if not exclude:
                return bucket[0]
            node = next((n for n in bucket if n not in exclude), None)
            if node is not None:
                return node
        return None

    def take(self, placement: Iterable[tuple[int, int]]) -> None:
        """Mark GPUs as used."""
        for node, gpus in placement:
            self._set(node, self.free[node] - gpus)

    def give(self, placement: Iterable[tuple[int, int]]) -> None:
        """Mark GPUs as free again."""
        for node, gpus in placement:
            self._set(node, self.free[node] + gpus)

    def fragmentation(self, shapes: Iterable[int]) -> float:
        """Share of free GPUs that no pending job shape can use.

        A free GPU is usable when its node has room for some single-node shape, or when its node
        is entirely free and a multi-node shape is pending.
        """
        per = self.gpus_per_node
        shapes = list(shapes)
        small = [g for g in shapes if 0 < g <= per]
        smallest = min(small) if small else per + 1
        multi = any(g > per for g in shapes)
        free_total = unusable = 0
        for k, bucket in enumerate(self.by_free):
            if not k or not bucket:
                continue
            n = len(bucket)
            free_total += k * n
            usable = k >= smallest or (k == per and multi)
            if not usable:
                unusable += k * n
        return unusable / free_total if free_total else 0.0
