"""How long a save blocks the training loop: background vs blocking, against DCP's async_save.

For the same state (default 1 GiB of mixed tensors, on the CPU), side by side in one run:

* ours sync         Checkpointer.save(blocking=True): the loop waits until the checkpoint is durable
* ours async fork   save(blocking=False), copy-on-write snapshot (the default for CPU state on disk)
* ours async copy   save(blocking=False), copy into a reused staging buffer (the GPU path)
* dcp sync          torch.distributed.checkpoint.save
* dcp async         torch.distributed.checkpoint.async_save (its default staging)

"stall" is the time until the call returns; "total" until the checkpoint is durable. Right after
each call the whole state is updated in place, as an optimizer step would, and timed: "step
extra" is how much slower that update is than without a save in flight. It is the hidden cost
of a copy-on-write snapshot (the kernel copies or re-maps every page the step writes), so the
loop's real cost of a save is stall + step extra.

    python benchmarks/async_save.py --size-gib 1 --repeat 3 --dir /work/bench-tmp
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
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).parent))
from save_restore import make_state

from preemptible import Checkpointer

warnings.filterwarnings("ignore")


def step(state: dict[str, torch.Tensor]) -> float:
    """An optimizer-like in-place update of every tensor; returns its duration."""
    t0 = time.perf_counter()
    for t in state.values():
        t.add_(1)
    return time.perf_counter() - t0


def run(state, out: Path) -> dict[str, Callable[[int], tuple[float, float, float]]]:
    ckpts = {
        "fork": Checkpointer(out / "fork", keep=1, async_mode="fork"),
        "copy": Checkpointer(out / "copy", keep=1, async_mode="copy"),
        "sync": Checkpointer(out / "sync", keep=1),
    }

    def ours_sync(i: int) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        ckpts["sync"].save(i, state)
        t = time.perf_counter() - t0
        return t, step(state), t

    def ours_async(mode: str) -> Callable[[int], tuple[float, float, float]]:
        def go(i: int) -> tuple[float, float, float]:
            t0 = time.perf_counter()
            handle = ckpts[mode].save(i, state, blocking=False)
            stall = time.perf_counter() - t0
            after = step(state)
            handle.wait()
            return stall, after, time.perf_counter() - t0

        return go

    def dcp_sync(i: int) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=str(out / f"dcp-sync-{i}"))
        t = time.perf_counter() - t0
        shutil.rmtree(out / f"dcp-sync-{i}", ignore_errors=True)
        return t, step(state), t

    def dcp_async(i: int) -> tuple[float, float, float]:
        t0 = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=str(out / f"dcp-async-{i}"))
        stall = time.perf_counter() - t0
        after = step(state)
        future.result()
        total = time.perf_counter() - t0
        shutil.rmtree(out / f"dcp-async-{i}", ignore_errors=True)
        return stall, after, total

    return {
        "ours sync": ours_sync,
        "ours async fork": ours_async("fork"),
        "ours async copy": ours_async("copy"),
        "dcp sync": dcp_sync,
        "dcp async": dcp_async,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    out = Path(args.dir or tempfile.mkdtemp(prefix="pbench-async-"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # DCP's async_save needs a process group, even for one process.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    state = make_state(args.size_gib)
    size = sum(t.numel() * t.element_size() for t in state.values())
    print(f"state: {len(state)} tensors, {size / 2**30:.2f} GiB on the CPU; {os.cpu_count()} CPUs")
    methods = run(state, out)
    rows: dict[str, list[tuple[float, float, float]]] = {m: [] for m in methods}
    baseline = []
    for i in range(args.repeat + 1):  # the first round warms up buffers and page cache
        for name, fn in methods.items():
            result = fn(i)
            baseline.append(step(state))  # the same update with no save in flight
            if i:
                rows[name].append(result)
        print(f"  round {i + 1}/{args.repeat + 1}{' (warm-up)' if i == 0 else ''} done")
    base = statistics.median(baseline[len(methods) :])
    med = {n: [statistics.median(col) for col in zip(*r, strict=True)] for n, r in rows.items()}
    sync = med["ours sync"][0]
    print(f"\nan in-place update of the whole state alone takes {base:.3f} s")
    print(
        f"{'method':16} {'stall s':>8} {'step extra s':>13} {'total s':>8}"
        f" {'(stall+extra)/sync':>19}"
    )
    for name, (stall, after, total) in med.items():
        extra = max(0.0, after - base) if "async" in name else 0.0
        print(f"{name:16} {stall:8.3f} {extra:13.3f} {total:8.3f} {(stall + extra) / sync:18.1%}")
    print("goal: stall at most 5% of a sync save")
    dist.destroy_process_group()
    if args.dir is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
