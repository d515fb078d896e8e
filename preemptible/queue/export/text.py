"""What both exports share: the tiers in order, comments, durations as the config writes them."""

from __future__ import annotations

import textwrap

from preemptible.queue.core.model import Tier

TIERS_HIGH_FIRST = (Tier.CRITICAL, Tier.HIGH, Tier.NORMAL, Tier.LOW)


def as_comment(lines: list[str], prefix: str = "#") -> str:
    """`lines` as comment lines wrapped at 96 columns; a "- " item keeps its hanging indent."""
    out = []
    for line in lines:
        if not line:
            out.append(prefix)
            continue
        indent = "  " if line.startswith("- ") else ""
        for part in textwrap.wrap(line, width=96, subsequent_indent=indent, break_on_hyphens=False):
            out.append(f"{prefix} {part}")
    return "\n".join(out) + "\n"


def dur(seconds: float) -> str:
    """A duration as the config writes it: 30s, 10m, 2h, 7d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
