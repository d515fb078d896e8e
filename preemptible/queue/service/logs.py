"""Reading a job's output file: a slice from an offset (`GET /v1/jobs/{id}/logs`, which a client
follows), or its end (the dashboard's job page). Cut at character boundaries, decoded as UTF-8.
"""

from __future__ import annotations

import os
from pathlib import Path


def read_log_slice(path: Path, offset: int, limit: int) -> tuple[str, int, int]:
    """Up to `limit` bytes of `path` from `offset`, cut at a character boundary.

    Returns:
        The text, the offset to read from next, and the file's size (0 if it does not exist
        yet: a job that has not started has no output).
    """
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset >= size:
                return "", offset, size
            f.seek(offset)
            data = _whole_characters(f.read(limit))
    except FileNotFoundError:
        return "", offset, 0
    return data.decode("utf-8", errors="replace"), offset + len(data), size


def _whole_characters(data: bytes) -> bytes:
    """`data` without a UTF-8 sequence cut at its end, which the next read will return whole."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        need = 1
        if byte >= 0xF0:
            need = 4
        elif byte >= 0xE0:
            need = 3
        elif byte >= 0xC0:
            need = 2
        return data if need <= back else data[:-back]
    return data


def tail(path: Path, limit: int) -> tuple[str, int, bool]:
    """The last `limit` bytes of `path` from its first whole line: (text, file size, whether
    the output is longer than the text). A file not there yet reads as empty."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "", 0, False
    offset = max(0, size - limit)
    text, _, size = read_log_slice(path, offset, limit)
    if offset > 0:
        newline = text.find("\n")
        text = text[newline + 1 :] if newline >= 0 else text
    return text, size, offset > 0
