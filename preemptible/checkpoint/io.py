"""Writing a flattened state into data files, and reading and checking it back.

Arrays are grouped into shards of about ``shard_bytes`` and the shards are written concurrently:
object stores are slow per request and fast in parallel, and on a local disk the threads overlap
checksumming with the kernel's page-cache copies. Each array is written straight from its own
memory (a CUDA tensor is copied to the host one at a time), so a save never holds a second copy
of the whole state. The CRC32C of every file is computed on the same bytes as they are written,
and again on read, so a restore never returns bytes that differ from what was saved.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import crc32c

from preemptible.checkpoint.arrays import ArrayEntry, as_bytes, describe, empty_buffer, from_bytes
from preemptible.checkpoint.manifest import FileRecord, Manifest
from preemptible.checkpoint.serialize import Array, Flattened
from preemptible.checkpoint.storage import CheckpointStorage, ReadableFile, Staging
from preemptible.errors import CheckpointCorruptedError, CheckpointFormatError

STATE_FILE = "state.json"
_VERIFY_CHUNK = 16 << 20


@dataclass(frozen=True, slots=True)
class WrittenFiles:
    files: dict[str, FileRecord]
    state_file: str


def plan_shards(sizes: Sequence[int], shard_bytes: int, max_shards: int) -> list[list[int]]:
    """Group array indices into at most ``max_shards`` files of roughly equal size.

    Largest-first into the lightest shard (LPT); within a shard, arrays keep their order so a
    reader walks each file front to back.
    """
    if not sizes:
        return []
    total = sum(sizes)
    count = max(1, min(max_shards, len(sizes), math.ceil(total / max(shard_bytes, 1))))
    shards: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        lightest = min(range(count), key=loads.__getitem__)
        shards[lightest].append(index)
        loads[lightest] += sizes[index]
    return [sorted(s) for s in shards if s]


def write_state(
    storage: CheckpointStorage,
    staging: Staging,
    flat: Flattened,
    *,
    shard_bytes: int,
    max_workers: int,
    devices: list[str] | None = None,
    prefix: str = "",
) -> WrittenFiles:
    """Write every array and the state index into ``staging``; returns sizes and checksums.

    ``devices`` overrides where each array is recorded to live (a staged copy of a GPU tensor
    sits on the CPU but should load back onto the GPU).
    """
    descriptions = [describe(a) for a in flat.arrays]
    if devices is not None:
        descriptions = [
            (k, d, s, dev, n) for (k, d, s, _, n), dev in zip(descriptions, devices, strict=True)
        ]
    shards = plan_shards([d[4] for d in descriptions], shard_bytes, max_shards=256)
    entries: list[ArrayEntry | None] = [None] * len(flat.arrays)

    def write_shard(number: int) -> tuple[str, FileRecord]:
        name = storage.data_name(staging, f"{prefix}data-{number:05d}.bin")
        crc, offset = 0, 0
        with storage.open_write(staging, name) as f:
            for index in shards[number]:
                data = as_bytes(flat.arrays[index])
                f.write(data)
                crc = crc32c.crc32c(data, crc)
                kind, dtype, shape, device, _ = descriptions[index]
                entries[index] = ArrayEntry(kind, dtype, shape, device, name, offset, len(data))
                offset += len(data)
        return name, FileRecord(size=offset, crc32c=crc)

    files = dict(in_threads(write_shard, range(len(shards)), max_workers, "preemptible-write"))

    index = {"tree": flat.tree, "arrays": [e.to_json() for e in entries if e is not None]}
    payload = json.dumps(index, separators=(",", ":")).encode()
    state_name = storage.data_name(staging, f"{prefix}{STATE_FILE}")
    with storage.open_write(staging, state_name) as f:
        f.write(payload)
    files[state_name] = FileRecord(size=len(payload), crc32c=crc32c.crc32c(payload))
    return WrittenFiles(files=files, state_file=state_name)


def read_index(
    storage: CheckpointStorage, dirname: str, manifest: Manifest, rank: int = 0
) -> tuple[Any, list[ArrayEntry]]:
    """Read and check the state index (tree + array table) that ``rank`` restores from."""
    name = manifest.state_file_for(rank)
    data = storage.read_bytes(dirname, name)
    _check_record(manifest, name, len(data), crc32c.crc32c(data))
    try:
        index = json.loads(data)
        tree, raw_entries = index["tree"], index["arrays"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise CheckpointFormatError(f"{name} of step {manifest.step} is not a state index") from e
    entries = [ArrayEntry.from_json(raw) for raw in raw_entries]
    for entry in entries:
        if entry.file not in manifest.files:
            raise CheckpointFormatError(f"array data file {entry.file!r} is not in the manifest")
    return tree, entries


def read_arrays(
    storage: CheckpointStorage,
    dirname: str,
    manifest: Manifest,
    entries: list[ArrayEntry],
    *,
    max_workers: int,
    map_location: Any = None,
) -> list[Array]:
    """Read every array, checking each data file's size and CRC32C end to end."""
    by_file: dict[str, list[int]] = {}
    for i, entry in enumerate(entries):
        by_file.setdefault(entry.file, []).append(i)
    arrays: list[Array | None] = [None] * len(entries)

    def read_file(name: str) -> None:
        ordered = sorted(by_file[name], key=lambda i: entries[i].offset)
        crc, offset = 0, 0
        with storage.open_read(dirname, name) as f:
            for i in ordered:
                entry = entries[i]
                if entry.offset != offset:
                    raise CheckpointFormatError(f"{name}: arrays do not tile the file at {offset}")
                buffer = empty_buffer(entry.nbytes)
                view = buffer.numpy().data if entry.nbytes else memoryview(b"")
                got = _read_exactly(f, view)
                if got != entry.nbytes:
                    _raise_corrupted(manifest, f"{name}: truncated at byte {offset + got}")
                crc = crc32c.crc32c(view, crc)
                offset += entry.nbytes
                arrays[i] = from_bytes(entry, buffer, map_location)
            tail = f.read(1 << 20)
            while tail:
                crc = crc32c.crc32c(tail, crc)
                offset += len(tail)
                tail = f.read(1 << 20)
        _check_record(manifest, name, offset, crc)

    in_threads(read_file, list(by_file), max_workers, "preemptible-read")
    read = [a for a in arrays if a is not None]
    assert len(read) == len(arrays), "every entry belongs to exactly one file"
    return read


def check_file(
    storage: CheckpointStorage,
    dirname: str,
    name: str,
    record: FileRecord,
    on_bytes: Callable[[int], None] | None = None,
) -> str | None:
    """Stream one file and compare it with its record; returns what is wrong, or None."""
    try:
        actual = file_record(storage, dirname, name, on_bytes)
    except FileNotFoundError:
        return "missing"
    return record_problem(actual, record)


def record_problem(actual: FileRecord, record: FileRecord) -> str | None:
    """How a file's measured size and CRC32C differ from its manifest record (None: they match)."""
    size, crc = actual.size, actual.crc32c
    if size != record.size:
        kind = "truncated" if size < record.size else "longer than recorded"
        return f"{kind}: {size} bytes, manifest says {record.size}"
    if crc != record.crc32c:
        return f"checksum mismatch: crc32c {crc:08x}, manifest says {record.crc32c:08x}"
    return None


def file_record(
    storage: CheckpointStorage,
    dirname: str,
    name: str,
    on_bytes: Callable[[int], None] | None = None,
    sink: Callable[[bytes], object] | None = None,
) -> FileRecord:
    """Size and CRC32C of a file as it is stored, streamed once (to verify it, or to record a
    file another writer produced: DCP's). ``sink`` gets every chunk as it is read, so a copy
    to another store checks the very bytes it writes (`upload`)."""
    crc, size = 0, 0
    with storage.open_read(dirname, name) as f:
        while chunk := f.read(_VERIFY_CHUNK):
            crc = crc32c.crc32c(chunk, crc)
            size += len(chunk)
            if sink is not None:
                sink(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return FileRecord(size=size, crc32c=crc)


def _read_exactly(f: ReadableFile, view: memoryview) -> int:
    total = 0
    while total < len(view):
        n = f.readinto(view[total:])
        if not n:
            break
        total += n
    return total


def _check_record(manifest: Manifest, name: str, size: int, crc: int | None) -> None:
    record = manifest.files[name]
    problem = None
    if size != record.size:
        kind = "truncated" if size < record.size else "longer than recorded"
        problem = f"{name}: {kind} ({size} bytes, manifest says {record.size})"
    elif crc is not None and crc != record.crc32c:
        problem = f"{name}: checksum mismatch (crc32c {crc:08x}, manifest says {record.crc32c:08x})"
    if problem:
        _raise_corrupted(manifest, problem)


def _raise_corrupted(manifest: Manifest, problem: str) -> None:
    raise CheckpointCorruptedError(
        f"checkpoint step {manifest.step} is corrupted: {problem}",
        step=manifest.step,
        problems=[problem],
    )


_T = TypeVar("_T")
_R = TypeVar("_R")


def in_threads(
    fn: Callable[[_T], _R], items: Sequence[_T], max_workers: int, name: str
) -> list[_R]:
    """``fn`` of each item, in order: on up to ``max_workers`` threads named ``name``, or on
    this one when there is one item or one worker (a pool would only add its start)."""
    if len(items) <= 1 or max_workers <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(min(max_workers, len(items)), name) as pool:
        return list(pool.map(fn, items))
