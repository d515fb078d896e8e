"""GPUs, CPUs and memory as one mutable amount, and the one tolerance used to compare amounts.

`model.Resources` is what a job asks for (frozen); `Amounts` is what the state and a cycle count
and change in place: what is free, what a queue holds, what jobs told to go still hold. Both,
and `model.Limits`, have the same three fields, so arithmetic takes any of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

TOLERANCE = 1e-9
"""Slack when comparing amounts: CPUs and memory are sums of fractional requests, and a sum
that should equal a limit may miss it by a rounding error."""

INF = float("inf")


class HasAmounts(Protocol):
    """Anything with the three amounts: `Amounts`, `model.Resources`, `model.Limits`."""

    @property
    def gpus(self) -> float: ...

    @property
    def cpus(self) -> float: ...

    @property
    def memory_gb(self) -> float: ...


class Amounts:
    """GPUs, CPUs and memory, changed in place as jobs start, leave and are held for."""

    __slots__ = ("cpus", "gpus", "memory_gb")

    def __init__(self, gpus: float = 0, cpus: float = 0.0, memory_gb: float = 0.0):
        self.gpus = gpus
        self.cpus = cpus
        self.memory_gb = memory_gb

    @classmethod
    def of(cls, amounts: HasAmounts) -> Amounts:
        """A mutable copy of a request, a limit or another amount."""
        return cls(amounts.gpus, amounts.cpus, amounts.memory_gb)

    def copy(self) -> Amounts:
        """An independent copy."""
        return Amounts(self.gpus, self.cpus, self.memory_gb)

    def add(self, other: HasAmounts, sign: int = 1) -> None:
        """Add `other` (sign 1) or take it away (sign -1), in place."""
        self.gpus += sign * other.gpus
        self.cpus += sign * other.cpus
        self.memory_gb += sign * other.memory_gb

    def plus(self, other: HasAmounts) -> Amounts:
        """A new amount: this one and `other` together."""
        return Amounts(
            self.gpus + other.gpus, self.cpus + other.cpus, self.memory_gb + other.memory_gb
        )

    def minus(self, other: HasAmounts) -> Amounts:
        """A new amount: this one without `other`."""
        return Amounts(
            self.gpus - other.gpus, self.cpus - other.cpus, self.memory_gb - other.memory_gb
        )

    def covers(self, need: HasAmounts) -> bool:
        """Whether this much is enough for `need`, each resource within the tolerance."""
        return (
            self.gpus + TOLERANCE >= need.gpus
            and self.cpus + TOLERANCE >= need.cpus
            and self.memory_gb + TOLERANCE >= need.memory_gb
        )

    def any_positive(self) -> bool:
        """Whether some resource is above zero by more than the tolerance."""
        return self.gpus > TOLERANCE or self.cpus > TOLERANCE or self.memory_gb > TOLERANCE

    def __iter__(self) -> Iterator[float]:
        yield self.gpus
        yield self.cpus
        yield self.memory_gb

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Amounts):
            return NotImplemented
        return tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # mutable: equal now, maybe not later

    def __repr__(self) -> str:
        return f"Amounts(gpus={self.gpus!r}, cpus={self.cpus!r}, memory_gb={self.memory_gb!r})"


def values(amounts: HasAmounts) -> tuple[float, float, float]:
    """The three amounts in a fixed order (GPUs, CPUs, memory), to walk them side by side."""
    return (amounts.gpus, amounts.cpus, amounts.memory_gb)


ZERO = Amounts()
"""Nothing; never change it in place."""
