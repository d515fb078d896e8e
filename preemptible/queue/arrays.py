"""Job arrays: one submission, many jobs that differ only by their index, as SLURM's `--array`.

`--array 0-99%8` submits 100 jobs, indices 0 to 99, at most 8 of them in their queue or running
at once; each reads its index from $PREEMPTIBLE_ARRAY_INDEX (and `{index}` in its command). The
spec takes what `sbatch --array` takes: indices and ranges separated by commas, a range's step
after a colon, the limit after `%` ("1,3,10-20:2%4").

The limit is kept by the manager, not the scheduling core: the jobs beyond it wait out of their
queue (as a held job or one waiting for a dependency does) and join it, lowest index first, as
the others leave. Each job is a job in its own right (its own id, attempts, restarts and
checkpoint); the array's id, `a` and the number of its first job, names them together.

The manager (`preemptible.queue.service`) and the `queue` client commands both read the spec,
so it lives outside the service, which needs the queue extra.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preemptible.errors import JobSpecError

MAX_TASKS = 1000
"""Jobs one array may have (SLURM's default `MaxArraySize` is 1001)."""
MAX_INDEX = 1_000_000
"""Indices run from 0 to this (exclusive)."""

_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indices: tuple[int, ...]
    """Ascending, each once."""
    limit: int | None
    """At most this many in their queue or running at once (None: no limit)."""


def parse(spec: str) -> ArraySpec:
    """The indices and limit of "0-99%8", "1,3,10-20:2" or "7".

    Raises:
        JobSpecError: the spec is malformed, empty, too large, or its limit is below 1.
    """
    body, percent, limit_text = spec.strip().partition("%")
    limit: int | None = None
    if percent:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise JobSpecError(
                f"array {spec!r}: the limit after % must be a whole number of at least 1, "
                "e.g. 0-99%8"
            )
        limit = int(limit_text)
    found: set[int] = set()
    for part in body.split(","):
        found.update(_indices(part.strip(), spec))
        if len(found) > MAX_TASKS:
            raise JobSpecError(
                f"array {spec!r} has more than {MAX_TASKS} jobs: split it into several arrays"
            )
    return ArraySpec(indices=tuple(sorted(found)), limit=limit)


def _indices(part: str, spec: str) -> range:
    match = _PART.match(part)
    if match is None:
        raise JobSpecError(
            f"array {spec!r}: cannot read {part!r}; give indices and ranges separated by "
            "commas, a step after a colon and a limit after %, e.g. 0-99%8 or 1,3,10-20:2"
        )
    first, last, step = (int(g) if g is not None else None for g in match.groups())
    assert first is not None
    last = first if last is None else last
    if last < first:
        raise JobSpecError(f"array {spec!r}: the range {part!r} goes down; write {last}-{first}")
    if step == 0:
        raise JobSpecError(f"array {spec!r}: the range {part!r} has a step of 0; give 1 or more")
    if last >= MAX_INDEX:
        raise JobSpecError(f"array {spec!r}: indices must be below {MAX_INDEX}")
    if (last - first) // (step or 1) >= MAX_TASKS:
        raise JobSpecError(
            f"array {spec!r} has more than {MAX_TASKS} jobs: split it into several arrays"
        )
    return range(first, last + 1, step or 1)


def compress(indices: list[int]) -> str:
    """ "0-3,7,9-10" from [0, 1, 2, 3, 7, 9, 10]: how `status` shows an array's indices."""
    if not indices:
        return ""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def is_array_id(name: str) -> bool:
    """Whether `name` has an array's form ("a7")."""
    return len(name) > 1 and name[0] == "a" and name[1:].isdigit()


def array_id(first_seq: int) -> str:
    """The array's id, from the number of its first job ("a7" for j7..)."""
    return f"a{first_seq}"
