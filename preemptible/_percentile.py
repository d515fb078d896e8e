"""The one percentile of the package: nearest rank, so that every number is one that was seen.

The checkpoint costs, the queue manager's four signals and its cycle quantiles, and the
simulator's KPIs all use it, so the same samples give the same p95 wherever they are shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def nearest_rank(values: Sequence[float], fraction: float, *, empty: float = 0.0) -> float:
    """The smallest value with at least `fraction` (0..1) of `values` at or below it.

    `values` need not be sorted; `empty` is the answer for no values.
    """
    if not values:
        return empty
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]
