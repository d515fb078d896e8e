"""Durations as people read them, shared by the CLI's tables and the simulator's report.

A module of its own, importing nothing: `preemptible queue` prints waits with it, and importing
it from the simulator's package would load the scheduling core on every CLI start.
"""

from __future__ import annotations


def fmt_duration(seconds: float) -> str:
    """'42s', '7.5m', '3.2h', '2.1d'."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
