"""A small training loop under `Context`, stopped by a cloud's notice (the cloud notice tests).

    python cloud_notice_train.py CKPT --total N [--step-s S]
    torchrun --nproc-per-node 2 cloud_notice_train.py CKPT --total N [--step-s S]

The notice sources come from the environment (``PREEMPTIBLE_NOTICES`` and each cloud's
endpoint variable). Each rank prints ``rank R step S`` after each step; when a notice stops
it, ``rank R stopped at step S reason=... deadline=...`` before exiting with the Context's code;
``rank R done`` when the loop ends.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

from preemptible import Context


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("--total", type=int, required=True)
    parser.add_argument("--step-s", type=float, default=0.05)
    args = parser.parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        with Context(args.ckpt, every_steps=1000, async_save=False) as ctx:
            ctx.register(model=model, opt=opt)
            try:
                for step in ctx.steps(args.total):
                    x = torch.randn(16, 8)
                    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    print(f"rank {rank} step {step}", flush=True)
                    time.sleep(args.step_s)
            except SystemExit:
                # One write, so that two ranks' lines never interleave (print writes twice).
                sys.stdout.write(
                    f"rank {rank} stopped at step {ctx.step} reason={ctx.guard.reason!r} "
                    f"deadline={ctx.guard.deadline!r}\n"
                )
                sys.stdout.flush()
                raise
        print(f"rank {rank} done", flush=True)
    finally:
        if distributed:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
