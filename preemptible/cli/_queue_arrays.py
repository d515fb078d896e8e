"""Job arrays at the command line: `a7` names every job of array a7, `a7_3` its index 3, and
`status` shows an array on one line.

The server knows each job by its own id; these turn what a user types into those ids (one
listing of the array) and the array's jobs into one row, so that an array of 100 does not take
100 lines of `status`.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from preemptible.queue.arrays import compress

_ARRAY = re.compile(r"^(a\d+)(?:_(\d+))?$")
_ORDER = ("running", "preempting", "pending", "failed", "cancelled", "completed")
"""An array's row shows the first of these states any of its jobs is in."""


class Lister(Protocol):
    def every_page(self, path: str, *, params: dict[str, Any] | None = None) -> list[Any]: ...


def array_of(given: str) -> tuple[str, int | None] | None:
    """("a7", None) for "a7", ("a7", 3) for "a7_3", None for a job's own id."""
    match = _ARRAY.match(given)
    if match is None:
        return None
    return match[1], None if match[2] is None else int(match[2])


def expand(
    client: Lister, given: list[str], states: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """(job ids, problems): each array id becomes its jobs in `states`, each "a7_3" the job at
    index 3 (whatever its state: the server says what it refuses), each job id itself."""
    ids: list[str] = []
    problems: list[str] = []
    for one in given:
        named = array_of(one)
        if named is None:
            ids.append(one)
            continue
        array_id, index = named
        jobs = client.every_page("/v1/jobs", params={"array": array_id})
        if not jobs:
            problems.append(f"{one}: no array {array_id!r} (or not yours to see)")
        elif index is None:
            ids += [job["id"] for job in jobs if job["state"] in states]
        else:
            found = [job["id"] for job in jobs if job["array_index"] == index]
            ids += found
            if not found:
                indices = compress([job["array_index"] for job in jobs])
                problems.append(f"{one}: array {array_id} has no index {index} (it has {indices})")
    return list(dict.fromkeys(ids)), problems


def resolve_one(client: Lister, given: str) -> str | None:
    """The job id "a7_3" names (None: no such index), or `given` itself if it is not an
    array's; an array's id alone names no one job.

    Raises:
        ValueError: `given` names a whole array, with what to give instead.
    """
    named = array_of(given)
    if named is None:
        return given
    array_id, index = named
    if index is None:
        raise ValueError(f"{given} is an array: give one of its jobs, {array_id}_INDEX")
    jobs = client.every_page("/v1/jobs", params={"array": array_id})
    return next((job["id"] for job in jobs if job["array_index"] == index), None)


def one_row_per_array(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`jobs` with every array's jobs replaced by one job-like row, where its first job was:
    its state the most active of theirs, its reason how many are in each state."""
    members: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        if job.get("array_id") is not None:
            members.setdefault(job["array_id"], []).append(job)
    rows: list[dict[str, Any]] = []
    for job in jobs:
        array_id = job.get("array_id")
        if array_id is None:
            rows.append(job)
        elif members[array_id][0] is job:
            rows.append(_array_row(array_id, members[array_id]))
    return rows


def _array_row(array_id: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    by_state: dict[str, list[int]] = {}
    for job in jobs:
        by_state.setdefault(job["state"], []).append(job["array_index"])
    states = [s for s in _ORDER if s in by_state] + sorted(set(by_state) - set(_ORDER))
    counts = ", ".join(f"{len(by_state[s])} {s} ({compress(by_state[s])})" for s in states)
    first = jobs[0]
    limit = first.get("array_limit")
    state = states[0]
    pending = [j for j in jobs if j["state"] == "pending"]
    return {
        **first,
        "id": array_id,
        "name": re.sub(r"\[\d+\]$", "", first["name"]),
        "state": state,
        "reason": f"{state}: {counts}" + (f"; at most {limit} at once" if limit else ""),
        "submitted_at": first["submitted_at"],
        "started_at": None if pending else first["started_at"],
        "gpu_ids": [],
        "array_jobs": len(jobs),
    }
