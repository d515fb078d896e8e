"""Data-parallel training under torchrun that survives preemption, worker failures and resizes.

    torchrun --nproc-per-node=2 --max-restarts=3 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29400 examples/torchrun_elastic.py --dir runs/ddp

- SIGTERM to torchrun (or to any worker): every rank finishes the step it is in, all ranks agree
  on that step, each writes its shard, one manifest commits them, and the workers exit with 143.
- A worker that dies (``--crash-at-step`` simulates it with a real SIGKILL): torchrun restarts
  the group and every rank resumes from the last committed checkpoint.
- Started again with a different ``--nproc-per-node``: the replicated model and optimizer are
  restored on every rank and the data order continues with the samples not yet seen.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from preemptible import Context, ResumableSampler, init_process_group, preemptible


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", required=True, help="checkpoint root shared by all ranks")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5, help="save every N steps")
    parser.add_argument("--sync", action="store_true", help="periodic saves block")
    parser.add_argument(
        "--crash-at-step", type=int, default=None, help="rank 1 SIGKILLs itself (first attempt)"
    )
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument(
        "--sigterm-rank-at-step",
        nargs=2,
        type=int,
        metavar=("RANK", "STEP"),
        help="that rank alone sends itself SIGTERM at that step (a notice only one rank sees)",
    )
    args = parser.parse_args()

    init_process_group("gloo")  # torch's, made safe for torchrun restarts
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    @preemptible(args.dir, every_steps=args.every, async_save=not args.sync, keep=3)
    def train(ctx: Context) -> None:
        random.seed(rank)
        np.random.seed(rank)
        torch.manual_seed(0)  # same initial model on every rank
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(99)
        x = torch.randn(640, 16, generator=g)
        data = TensorDataset(x, x.sum(1, keepdim=True).sin())
        sampler = ResumableSampler(data, seed=3)
        loader = DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator())
        batches = sampler.batches(loader)
        torch.manual_seed(1000 + rank)  # per-rank randomness, restored per rank
        ctx.register(model=model, optim=opt, data=sampler)
        for step in ctx.steps(args.steps):
            if rank == 0 and step == (ctx.resumed_from or -1) + 1:
                print(f"attempt {attempt}: world {world}, starting at step {step}", flush=True)
            xb, yb = next(batches)
            noise = torch.randn(()) * 1e-4  # differs per rank, so per-rank RNG state matters
            loss = torch.nn.functional.mse_loss(ddp(xb), yb) + noise
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
            if args.sigterm_rank_at_step and args.sigterm_rank_at_step == [rank, step]:
                os.kill(os.getpid(), signal.SIGTERM)
            if args.crash_at_step == step and rank == 1 and attempt == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            if args.step_seconds:
                time.sleep(args.step_seconds)

    try:
        train()
        if rank == 0:
            print("done", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
