"""Replacing a small file so that readers never see half of it.

The data goes to a temporary file in the same folder, is fsynced, and is renamed over the
target (`os.replace`): a reader opens either the old file or the new one. Used for the cost
file the sidecar polls and for the simulator's HTML report.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_atomically(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with `data`, creating its folder if needed.

    `mode` defaults to readable by all, where `tempfile.mkstemp` would give 0600: the files
    written here are read by other users (a sidecar container, whoever gets the report).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
