"""Save and restore speed of the checkpoint store against its peers, side by side in one run.

Peers, all writing the same state to the same disk and made durable (fsync) before the clock
stops, because a checkpoint that is not on disk when the node dies is not a checkpoint:

* raw-1    the state's bytes written to one file with plain writes + fsync, one thread
* raw-4    the same bytes split over 4 files written by 4 threads + fsync: together with raw-1,
           the disk's physical limit (the faster of the two is the reference)
* ours     preemptible.Checkpointer.save (blocking), restore = Checkpointer.load
* torch    torch.save to a temp file + fsync + os.replace; restore = torch.load(weights_only=True)
* dcp      torch.distributed.checkpoint.save (one process); restore = dcp.load in place

Each method runs ``--repeat`` times in rotating order; the median is reported. With
``--cold`` (root only) the page cache is dropped before every restore so reads hit the disk.

    python benchmarks/save_restore.py --size-gib 1 --dir bench-out
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from preemptible import Checkpointer

sys.path.insert(0, str(Path(__file__).parent))
from ratios import record

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def make_state(size_gib: float) -> dict[str, torch.Tensor]:
    """Mixed tensors like a model + optimizer: a few big matrices, many small vectors, 3 dtypes."""
    g = torch.Generator().manual_seed(0)
    target = int(size_gib * (1 << 30))
    state: dict[str, torch.Tensor] = {}
    total, i = 0, 0
    while total < target:
        kind = i % 10
        if kind < 4:
            t = torch.randn(2048, 2048, generator=g)  # 16 MiB fp32
        elif kind < 7:
            t = torch.randn(4096, 1024, generator=g).to(torch.bfloat16)  # 8 MiB bf16
        elif kind < 9:
            t = torch.randn(4096, generator=g)  # small bias-like
        else:
            t = torch.randint(0, 1 << 30, (1 << 20,), generator=g)  # 8 MiB int64
        state[f"layer{i}.{'wbti'[kind % 4]}"] = t
        total += t.numel() * t.element_size()
        i += 1
    return state


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _fsync_tree(path: Path) -> None:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_raw(tensors: list[torch.Tensor], path: Path) -> None:
    with open(path, "wb") as f:
        for t in tensors:
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        f.flush()
        os.fsync(f.fileno())


def _read_raw(tensors: list[torch.Tensor], path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        for t in tensors:
            buf = torch.empty(t.numel() * t.element_size(), dtype=torch.uint8)
            f.readinto(memoryview(buf.numpy()))


def save_raw(state: dict[str, torch.Tensor], out: Path) -> None:
    _write_raw(list(state.values()), out / "raw.bin")


def _split(state: dict[str, torch.Tensor], n: int) -> list[list[torch.Tensor]]:
    tensors = list(state.values())
    return [tensors[i::n] for i in range(n)]


def save_raw_parallel(state: dict[str, torch.Tensor], out: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(_write_raw, _split(state, 4), [out / f"raw{i}.bin" for i in range(4)]))


def save_ours(state: dict[str, torch.Tensor], out: Path) -> None:
    Checkpointer(out / "ours", keep=1).save(1, state)


def save_torch(state: dict[str, torch.Tensor], out: Path) -> None:
    tmp = out / "model.pt.tmp"
    torch.save(state, tmp)
    _fsync_tree(tmp)
    os.replace(tmp, out / "model.pt")


def save_dcp(state: dict[str, torch.Tensor], out: Path) -> None:
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(out / "dcp"), sync_files=True))


def load_raw(state: dict[str, torch.Tensor], out: Path) -> None:
    _read_raw(list(state.values()), out / "raw.bin")


def load_raw_parallel(state: dict[str, torch.Tensor], out: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(_read_raw, _split(state, 4), [out / f"raw{i}.bin" for i in range(4)]))


def load_ours(state: dict[str, torch.Tensor], out: Path) -> None:
    Checkpointer(out / "ours").load(1)


def load_torch(state: dict[str, torch.Tensor], out: Path) -> None:
    torch.load(out / "model.pt", weights_only=True)


def load_dcp(state: dict[str, torch.Tensor], out: Path) -> None:
    target = {k: torch.empty_like(v) for k, v in state.items()}
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(out / "dcp")))


METHODS: dict[str, tuple[Callable[..., None], Callable[..., None]]] = {
    "raw-1": (save_raw, load_raw),
    "raw-4": (save_raw_parallel, load_raw_parallel),
    "ours": (save_ours, load_ours),
    "torch": (save_torch, load_torch),
    "dcp": (save_dcp, load_dcp),
}


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=1.0, help="state size (default 1 GiB)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method (median reported)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir on /tmp)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before restores")
    args = parser.parse_args()

    base = Path(args.dir or tempfile.mkdtemp(prefix="pbench-"))
    base.mkdir(parents=True, exist_ok=True)
    state = make_state(args.size_gib)
    size = nbytes(state)
    print(f"state: {len(state)} tensors, {size / 2**30:.2f} GiB; writing under {base}")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, threads={torch.get_num_threads()}")

    save_t: dict[str, list[float]] = {m: [] for m in METHODS}
    load_t: dict[str, list[float]] = {m: [] for m in METHODS}
    names = list(METHODS)
    cold = False
    for rep in range(args.repeat):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            save, load = METHODS[name]
            out = base / name
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            os.sync()
            t0 = time.perf_counter()
            save(state, out)
            save_t[name].append(time.perf_counter() - t0)
            cold = drop_caches() if args.cold else False
            t0 = time.perf_counter()
            load(state, out)
            load_t[name].append(time.perf_counter() - t0)
            shutil.rmtree(out, ignore_errors=True)
        print(f"  run {rep + 1}/{args.repeat} done")

    gb = size / 1e9

    def table(title: str, times: dict[str, list[float]], kind: str) -> None:
        print(f"\n{title} (median of {args.repeat}; GB/s = 1e9 bytes/s)")
        print(f"{'method':8} {'seconds':>8} {'GB/s':>7} {'its time / ours':>16}")
        ours = statistics.median(times["ours"])
        for name in names:
            med = statistics.median(times[name])
            ratio = med / ours
            print(f"{name:8} {med:8.3f} {gb / med:7.2f} {ratio:15.2f}x")
        raw = min(statistics.median(times["raw-1"]), statistics.median(times["raw-4"]))
        peers = [n for n in names if not n.startswith("raw") and n != "ours"]
        fastest_peer = min(peers, key=lambda n: statistics.median(times[n]))
        print(f"ours reaches {raw / ours:.0%} of the raw disk's throughput (the faster raw row)")
        print(
            f"ours is {statistics.median(times[fastest_peer]) / ours:.2f}x"
            f" the fastest peer ({fastest_peer})"
        )
        # For `make bench`: the save within 10% of one file's plain write + fsync; no slower
        # than a peer, either way.
        saving = kind == "save"
        measure = f"{kind} {args.size_gib:g} GiB" + ("" if saving else f" ({title[9:-1]})")
        references = {
            "raw-1": (
                "1 file, plain write" if saving else "1 file, readinto",
                1.10 if saving else None,
            ),
            "torch": ("torch.save" if saving else "torch.load", 1.0),
            "dcp": ("DCP save" if saving else "DCP load", 1.0),
        }
        for peer, (against, goal) in references.items():
            record("store", measure, ours, statistics.median(times[peer]), against, goal=goal)

    table("SAVE (durable: fsync before the clock stops)", save_t, "save")
    table(f"RESTORE ({'cold page cache' if cold else 'warm page cache'})", load_t, "restore")
    shutil.rmtree(base, ignore_errors=True) if args.dir is None else None


if __name__ == "__main__":
    main()
