"""The cost file: measured checkpoint costs, where a scheduler or sidecar can read them.

Written atomically (temp file in the same directory, fsync, ``os.replace``) after every save, so
a reader never sees half a file. Fields: `docs/design.md` (SDK, cost).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from preemptible.checkpoint import CheckpointCost

COST_FILE_ENV = "PREEMPTIBLE_COST_FILE"


def write_cost_file(
    path: str | os.PathLike[str], cost: CheckpointCost, *, now: float | None = None
) -> None:
    """Atomically replace ``path`` with the JSON of ``cost``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(cost.to_json(updated_at=now if now is not None else time.time()), indent=1)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
