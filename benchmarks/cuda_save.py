"""What a checkpoint of CUDA state costs a training loop: ours against DCP, whole loops timed.

A save's stall (the time until the call returns) is not what a loop pays: a background save may
also slow the steps that run beside it (its copies share the GPU's copy engines and the host's
memory bandwidth). So each method runs the same loop, `--steps` steps of compute-bound work
(bf16 matrix products) followed by an in-place update of the whole state, as an optimizer
step does, with a save every `--every` steps; the loop with no save is the baseline, and a
method's cost per save is (its loop's time - the baseline's) / saves. Side by side in one run:

* ours sync     Checkpointer.save(blocking=True): durable when it returns
* ours async    Checkpointer.save(blocking=False): staged to pinned host buffers, written behind
* dcp sync      torch.distributed.checkpoint.save
* dcp async     torch.distributed.checkpoint.async_save (its default staging)

A background save still in flight when the next is due is waited for first, by either library;
the last one is waited for after the loop's clock stops, as a loop that goes on would not.
The raw write of the same bytes to the same disk (one file, fsync) is printed beside them.

    python benchmarks/cuda_save.py --size-gib 2 --runs 3 --dir /tmp/pbench-cuda
"""

from __future__ import annotations

import argparse
import itertools
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

_SAVE_IDS = itertools.count(1)
Saver = Callable[[int], Callable[[], None] | None]
"""Starts a save of step i; returns what waits for it (None: done already)."""


def raw_write_s(out: Path, nbytes: int) -> float:
    """Seconds to write `nbytes` to one new file and fsync it: the disk's own speed."""
    block = os.urandom(64 << 20)
    path = out / "raw.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
        f.flush()
        os.fsync(f.fileno())
    took = time.perf_counter() - t0
    path.unlink()
    return took


def dcp_async_saver(state: dict[str, torch.Tensor], out: Path) -> Saver:
    """DCP's `async_save` of step i under `out`; what it returns waits, then removes it."""

    def dcp_async(i: int) -> Callable[[], None]:
        path = out / f"dcp-async-{i}"
        future = dcp.async_save(state, checkpoint_id=str(path))

        def done() -> None:
            future.result()
            shutil.rmtree(path, ignore_errors=True)

        return done

    return dcp_async


def savers(state: dict[str, torch.Tensor], out: Path) -> dict[str, Saver]:
    ours_sync = Checkpointer(out / "ours-sync", keep=1)
    ours_async = Checkpointer(out / "ours-async", keep=1)

    def sync(i: int) -> None:
        ours_sync.save(i, state)

    def background(i: int) -> Callable[[], None]:
        handle = ours_async.save(i, state, blocking=False)
        return handle.wait

    def dcp_sync(i: int) -> None:
        path = out / f"dcp-sync-{i}"
        dcp.save(state, checkpoint_id=str(path))
        shutil.rmtree(path, ignore_errors=True)

    return {
        "ours sync": sync,
        "ours async": background,
        "dcp sync": dcp_sync,
        "dcp async": dcp_async_saver(state, out),
    }


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def loop(
    state: dict[str, torch.Tensor],
    work: torch.Tensor,
    steps: int,
    every: int,
    save: Saver | None,
    matmuls: int,
) -> tuple[float, list[float]]:
    """(the loop's seconds, each save call's stall). A background save still in flight at the
    end is waited for after the clock stops: a loop that goes on would not wait for it."""
    stalls: list[float] = []
    pending: Callable[[], None] | None = None
    synchronize()
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        for _ in range(matmuls):
            work = (work @ work).clamp_(-1, 1)
        for t in state.values():
            t.add_(1)
        synchronize()  # as a loop that reads its loss each step
        if save is not None and i % every == 0:
            if pending is not None:
                pending()
            s0 = time.perf_counter()
            pending = save(next(_SAVE_IDS))  # a new step each time: none is skipped as saved
            stalls.append(time.perf_counter() - s0)
    synchronize()
    took = time.perf_counter() - t0
    if pending is not None:  # the loop would go on: the last save's write is not its cost
        pending()
    return took, stalls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=2.0, help="state on the GPU")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--every", type=int, default=5, help="a save every this many steps")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--matmuls",
        type=int,
        default=64,
        help="bf16 8192x8192 products a step (~1.4 ms each on an H200)",
    )
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    parser.add_argument(
        "--device", default="cuda", help="cuda, or cpu to try the script on a small state"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("needs a CUDA device (or --device cpu to try the script)")
    out = Path(args.dir or tempfile.mkdtemp(prefix="pbench-cuda-"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    state = {k: v.to(args.device) for k, v in make_state(args.size_gib).items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    side = 8192 if args.device == "cuda" else 256
    work = torch.randn(side, side, device=args.device, dtype=torch.bfloat16) / 100
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(
        f"{name}; state {nbytes / 2**30:.2f} GiB in {len(state)} tensors on the device; "
        f"{args.steps} steps of {args.matmuls} matrix products, a save every {args.every}; "
        f"{os.cpu_count()} CPUs; {out}"
    )
    methods = savers(state, out)
    loop(state, work, args.every, args.every, None, args.matmuls)  # warm-up: kernels, allocator
    for fn in methods.values():  # warm-up: staging buffers, files
        loop(state, work, args.every, args.every, fn, args.matmuls)
    saves = args.steps // args.every
    for run in range(1, args.runs + 1):
        raw = raw_write_s(out, nbytes)
        base, _ = loop(state, work, args.steps, args.every, None, args.matmuls)
        results = {
            n: loop(state, work, args.steps, args.every, fn, args.matmuls)
            for n, fn in methods.items()
        }
        print(
            f"\nrun {run}: loop without saves {base:.3f} s; raw write of the same bytes "
            f"{raw:.3f} s ({nbytes / raw / 1e9:.2f} GB/s)"
        )
        print(
            f"{'method':12} {'stall s':>8} {'cost/save s':>12} {'cost/raw':>9} {'vs dcp async':>13}"
        )
        cost = {n: max(0.0, t - base) / saves for n, (t, _) in results.items()}
        for n, (_, stalls) in results.items():
            print(
                f"{n:12} {statistics.median(stalls):8.3f} {cost[n]:12.3f} {cost[n] / raw:9.2f} "
                f"{cost[n] / max(cost['dcp async'], 1e-9):12.2f}x"
            )
    dist.destroy_process_group()
    if args.dir is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
