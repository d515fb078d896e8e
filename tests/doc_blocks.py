"""The code blocks of the README and the guides, found by the marker that names each one.

A Python block that a test runs is preceded by ``<!-- test: NAME -->``; the test takes it with
`block` and runs it as printed. One that is only part of a program is preceded by
``<!-- fragment: PATH -->``, the page or file that holds the whole (tests/test_doc_blocks.py
holds every block to one of the two).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"(?:^<!-- (test|fragment): (\S+) -->\n)?^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    kind: str | None  # "test", "fragment" or None (unmarked)
    target: str | None  # the test's name, or the fragment's whole


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the marker before it, if any."""
    text = page.read_text()
    return [
        Block(page, text.count("\n", 0, m.start(3)) + 1, m[3], m[4], m[1], m[2])
        for m in _BLOCK.finditer(text)
    ]


def block(page: str, name: str) -> str:
    """The code of the block of ``page`` (relative to the repository) marked ``test: name``."""
    found = [b.code for b in blocks(ROOT / page) if b.kind == "test" and b.target == name]
    assert len(found) == 1, f"{page} has {len(found)} blocks marked <!-- test: {name} -->"
    return found[0]
