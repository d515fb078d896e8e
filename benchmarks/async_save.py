"""What a background save of CPU state costs a training loop: whole loops of several shapes timed,
ours against DCP's async_save.

A save's stall (the time until the call returns) is not what a loop pays: a copy-on-write
snapshot makes the kernel copy each page the next step writes, and a writer beside the loop
takes cores and memory bandwidth from it. So each method runs the same loop, and a method's
cost per save is (its loop's time - the same loop without saves) / saves. Shapes:

* update        each step is an in-place update of the whole state (an optimizer step), right
                after the save: the worst case for a copy-on-write snapshot
* compute       each step is `--matmuls` float32 matrix products, then the same update
* every step    the update shape with a save every step (the next save waits for the last)

Methods, side by side in one run:

* ours auto     Checkpointer.save(blocking=False), the default mode for the host
                (`async_mode="auto"`: see docs/benchmarks.md for which it picks)
* ours fork     async_mode="fork": a copy-on-write child writes the snapshot
* ours copy     async_mode="copy": a reused staging buffer, written by a thread
* dcp async     torch.distributed.checkpoint.async_save (its default staging)
* ours sync     Checkpointer.save(blocking=True), for the stall goal's reference

A save still in flight when the next is due is waited for first, by either library; the last
one is waited for after the loop's clock stops, as a loop that goes on would not.

    python benchmarks/async_save.py --size-gib 1 --runs 3 --dir /work/bench-tmp
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
from typing import NamedTuple

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from cuda_save import Saver, dcp_async_saver
from ratios import record
from save_restore import make_state

from preemptible import Checkpointer

warnings.filterwarnings("ignore")

_SAVE_IDS = itertools.count(1)


class Shape(NamedTuple):
    name: str
    matmuls: int
    every: int


def savers(state: dict[str, torch.Tensor], out: Path, writers: int | None) -> dict[str, Saver]:
    ours = {
        mode: Checkpointer(out / f"ours-{mode}", keep=1, async_mode=mode, max_workers=writers)
        for mode in ("auto", "fork", "copy")
    }
    sync = Checkpointer(out / "ours-sync", keep=1)

    def background(mode: str) -> Saver:
        def go(i: int) -> Callable[[], None]:
            return ours[mode].save(i, state, blocking=False).wait

        return go

    def ours_sync(i: int) -> None:
        sync.save(i, state)

    return {
        "ours auto": background("auto"),
        "ours fork": background("fork"),
        "ours copy": background("copy"),
        "dcp async": dcp_async_saver(state, out),
        "ours sync": ours_sync,
    }


def loop(
    state: dict[str, torch.Tensor],
    work: torch.Tensor,
    shape: Shape,
    steps: int,
    save: Saver | None,
) -> tuple[float, list[float]]:
    """(the loop's seconds, each save call's stall)."""
    stalls: list[float] = []
    pending: Callable[[], None] | None = None
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        for _ in range(shape.matmuls):
            work = (work @ work).clamp_(-1, 1)
        for t in state.values():
            t.add_(1)
        if save is not None and i % shape.every == 0:
            if pending is not None:
                pending()
            s0 = time.perf_counter()
            pending = save(next(_SAVE_IDS))  # a new step each time: none is skipped as saved
            stalls.append(time.perf_counter() - s0)
    took = time.perf_counter() - t0
    if pending is not None:  # the loop would go on: the last save's write is not its cost
        pending()
    return took, stalls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=1.0, help="state on the CPU")
    parser.add_argument("--steps", type=int, default=12, help="steps a loop (default 12)")
    parser.add_argument("--every", type=int, default=4, help="a save every N steps (default 4)")
    parser.add_argument(
        "--matmuls", type=int, default=24, help="1024x1024 products a compute step (default 24)"
    )
    parser.add_argument("--shapes", default="update,compute,every step", help="which shapes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--writers", type=int, default=None, help="our background writer threads (default: ours)"
    )
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    args = parser.parse_args()
    out = Path(args.dir or tempfile.mkdtemp(prefix="pbench-async-"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    state = make_state(args.size_gib)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    work = torch.randn(1024, 1024) / 100
    shapes = [
        s
        for s in (
            Shape("update", 0, args.every),
            Shape("compute", args.matmuls, args.every),
            Shape("every step", 0, 1),
        )
        if s.name in args.shapes.split(",")
    ]
    print(
        f"state {nbytes / 2**30:.2f} GiB in {len(state)} tensors on the CPU; {os.cpu_count()} "
        f"CPUs, torch {torch.get_num_threads()} threads; {args.steps} steps a loop; {out}"
    )
    methods = savers(state, out, args.writers)
    for shape in shapes:  # warm-up: staging buffers, files, page cache
        loop(state, work, shape, shape.every, None)
        for fn in methods.values():
            loop(state, work, shape, shape.every, fn)
    for run in range(1, args.runs + 1):
        print(f"\nrun {run}")
        print(
            f"{'shape':11} {'method':10} {'loop s':>7} {'stall s':>8} {'stall/sync':>11}"
            f" {'cost/save s':>12} {'vs dcp async':>13}"
        )
        for shape in shapes:
            base, _ = loop(state, work, shape, args.steps, None)
            results = {n: loop(state, work, shape, args.steps, fn) for n, fn in methods.items()}
            saves = args.steps // shape.every
            cost = {n: max(0.0, t - base) / saves for n, (t, _) in results.items()}
            sync_stall = statistics.median(results["ours sync"][1])
            print(f"{shape.name:11} {'no save':10} {base:7.3f}")
            for n, (took, stalls) in results.items():
                stall = statistics.median(stalls)
                if n not in ("dcp async", "ours sync"):
                    measure = f"{shape.name}: {n[5:]} cost/save, run {run}"
                    record("async", measure, cost[n], cost["dcp async"], "DCP async_save", goal=1.0)
                if n == "ours auto":
                    measure = f"{shape.name}: auto stall, run {run}"
                    record("async", measure, stall, sync_stall, "our blocking save", goal=0.05)
                print(
                    f"{'':11} {n:10} {took:7.3f} {stall:8.3f} {stall / sync_stall:10.1%}"
                    f" {cost[n]:12.3f} {cost[n] / max(cost['dcp async'], 1e-9):12.2f}x"
                )
    print(
        "\ngoals: every background mode's cost/save below dcp async's (< 1.00x) in every shape; "
        "the default's stall at most 5% of a sync save"
    )
    dist.destroy_process_group()
    if args.dir is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
