"""The cost file: measured checkpoint costs, where a scheduler or sidecar can read them.

Written atomically (temp file in the same directory, fsync, ``os.replace``) after every save, so
a reader never sees half a file: it opens either the old file or the new one. Fields:
`docs/maintainers/design.md` (SDK, cost). `read_cost_file` is the inverse, for the sidecar
(`preemptible.runtime.sidecar`), which runs in another container and has only the file.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from preemptible._files import replace_atomically
from preemptible.checkpoint.stats import CheckpointCost, Summary
from preemptible.errors import ConfigError

_FIX = "it is written by preemptible's Context (write_cost_file): let nothing else write there"


def write_cost_file(
    path: str | os.PathLike[str], cost: CheckpointCost, *, now: float | None = None
) -> None:
    """Atomically replace ``path`` with the JSON of ``cost``, readable by every user.

    Readable by all (0644, where `tempfile.mkstemp` gives 0600): the sidecar that reads it may
    run as another user than the trainer, and the file holds no secret.
    """
    payload = json.dumps(cost.to_json(updated_at=now if now is not None else time.time()), indent=1)
    replace_atomically(path, payload.encode())


def read_cost_file(path: str | os.PathLike[str]) -> CheckpointCost:
    """The cost that `write_cost_file` wrote to ``path``.

    The file keeps fewer numbers than `CheckpointCost`: what it does not hold (the last stall,
    the mean and p95 of restores, the sample counts of stalls and restores) reads back as 0.
    The fields `docs/maintainers/design.md` promises are required; ``save_seconds_mean``,
    ``save_seconds_last`` and ``stall_seconds_mean`` are read when present, and so are the
    two-tier fields (``upload_seconds_*``, ``durable_seconds_*``, ``restore_local_seconds``,
    ``restore_remote_seconds``, ``last_durable_*``): files without them read as one tier.

    Raises:
        FileNotFoundError: there is no file (yet: the trainer writes it after its first save).
        ConfigError: the file is not a cost file (not JSON, a field missing or of a wrong type).
    """
    where = Path(path)
    try:
        data = json.loads(where.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cost file {where} is not JSON ({exc}); {_FIX}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"cost file {where} holds a JSON {type(data).__name__}, not an object; {_FIX}"
        )
    fields = _Fields(where, data)
    save = Summary(
        last=fields.seconds("save_seconds_last", required=False),
        mean=fields.seconds("save_seconds_mean", required=False),
        p95=fields.seconds("save_seconds_p95"),
        count=fields.count("samples"),
    )
    return CheckpointCost(
        save=save,
        stall=Summary(
            mean=fields.seconds("stall_seconds_mean", required=False),
            p95=fields.seconds("stall_seconds_p95"),
        ),
        persist=save,
        restore=Summary(last=fields.seconds("restore_seconds")),
        bytes=fields.count("bytes"),
        last_checkpoint_step=fields.optional_count("last_checkpoint_step"),
        last_checkpoint_time=fields.optional_seconds("last_checkpoint_time"),
        upload=fields.summary("upload_seconds", count_key="upload_samples"),
        durable=fields.summary("durable_seconds", count_key="durable_samples"),
        restore_local=fields.last_only("restore_local_seconds"),
        restore_remote=fields.last_only("restore_remote_seconds"),
        last_durable_step=fields.optional_count("last_durable_step", required=False),
        last_durable_time=fields.optional_seconds("last_durable_time", required=False),
    )


class _Fields:
    """Typed access to the cost file's fields; every mistake names the file and the field."""

    def __init__(self, path: Path, data: Mapping[str, Any]) -> None:
        self.path, self.data = path, data

    def _bad(self, key: str, wanted: str) -> ConfigError:
        if key not in self.data:
            return ConfigError(f"cost file {self.path} has no field {key!r}; {_FIX}")
        got = json.dumps(self.data[key])[:40]
        return ConfigError(f"cost file {self.path}: {key!r} must be {wanted}, got {got}; {_FIX}")

    def optional_seconds(self, key: str, *, required: bool = True) -> float | None:
        value = self.data.get(key)
        if value is None and (key in self.data or not required):
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(key, "a number of seconds or null")
        if not math.isfinite(value) or value < 0:
            raise self._bad(key, "a finite number >= 0")
        return float(value)

    def seconds(self, key: str, *, required: bool = True) -> float:
        if not required and key not in self.data:
            return 0.0
        value = self.optional_seconds(key)
        if value is None:
            raise self._bad(key, "a number of seconds")
        return value

    def optional_count(self, key: str, *, required: bool = True) -> int | None:
        value = self.data.get(key)
        if value is None and (key in self.data or not required):
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._bad(key, "an integer >= 0 or null")
        return value

    def count(self, key: str) -> int:
        value = self.optional_count(key)
        if value is None:
            raise self._bad(key, "an integer >= 0")
        return value

    def summary(self, prefix: str, *, count_key: str) -> Summary:
        """``<prefix>_last/_mean/_p95`` and a sample count, all optional (two-tier fields:
        absent in files of single-tier jobs and of older versions, null when not measured)."""
        p95 = self.optional_seconds(f"{prefix}_p95", required=False)
        if p95 is None:
            return Summary()
        return Summary(
            last=self.optional_seconds(f"{prefix}_last", required=False) or 0.0,
            mean=self.optional_seconds(f"{prefix}_mean", required=False) or 0.0,
            p95=p95,
            count=self.optional_count(count_key, required=False) or 1,
        )

    def last_only(self, key: str) -> Summary:
        """One optional number of seconds, as the last of one sample (absent or null: none)."""
        value = self.optional_seconds(key, required=False)
        return Summary() if value is None else Summary(last=value, count=1)
