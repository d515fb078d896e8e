"""Per-step overhead of the preemption machinery: the guard and Context alone, and the
cross-rank agreement (one all-reduce of two flags per step on a gloo group, 2 ranks).

    python benchmarks/step_overhead.py --steps 20000
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from preemptible import Context
from preemptible.runtime.elastic import StepAgreement


def plain_loop(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - t0


def context_loop(n: int) -> float:
    with tempfile.TemporaryDirectory() as root:
        ctx = Context(root, every_steps=10**9)
        ctx.register(x={"v": torch.zeros(1)})
        t0 = time.perf_counter()
        for _ in ctx.steps(n):
            pass
        elapsed = time.perf_counter() - t0
        ctx.close()
    return elapsed


def agreement_worker(rank: int, port: int, n: int, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    agreement = StepAgreement()
    agreement.agree(False, False)  # creates the group
    t0 = time.perf_counter()
    for _ in range(n):
        agreement.agree(False, False)
    elapsed = time.perf_counter() - t0
    if rank == 0:
        out["agree"] = elapsed
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20000)
    args = parser.parse_args()
    n = args.steps
    plain = statistics.median(plain_loop(n) for _ in range(3))
    ctx = statistics.median(context_loop(n) for _ in range(3))
    print(f"plain range loop        {plain / n * 1e6:8.2f} us/step")
    print(
        f"ctx.steps (1 process)   {ctx / n * 1e6:8.2f} us/step  (+{(ctx - plain) / n * 1e6:.2f} us)"
    )
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(agreement_worker, args=(port, n // 4, out), nprocs=2, join=True)
    print(f"agreement, 2 ranks gloo {out['agree'] / (n // 4) * 1e6:8.2f} us/step (one all-reduce)")
    print(
        f"(on {os.cpu_count()} CPUs; a 100 ms training step pays {out['agree'] / (n // 4) / 0.1:.3%})"
    )


if __name__ == "__main__":
    main()
