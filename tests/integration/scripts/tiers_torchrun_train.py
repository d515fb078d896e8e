"""Every rank of a one-node torchrun job saves through two tiers (the collective two-tier test).

    torchrun --nproc-per-node 2 tiers_torchrun_train.py REMOTE LOCAL --total N

Each rank's weight starts at its rank and grows by 1 a step, so the weight a rank restores
shows whose state it read: ``rank R resumed from S weight W`` (W = R + S + 1), or ``rank R
fresh``. Each rank prints ``rank R step S`` after each step and, when a SIGTERM stops it,
``rank R stopped at step S durable D`` (D: its checkpointer's `durable_step`).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

from preemptible import Context, init_process_group


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("remote")
    parser.add_argument("local")
    parser.add_argument("--total", type=int, default=100_000)
    args = parser.parse_args()
    init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 4, bias=False)
    model.weight.data.fill_(float(rank))
    try:
        with Context(args.remote, local=args.local, every_steps=5) as ctx:
            ctx.register(model=model)
            first = True
            try:
                for step in ctx.steps(args.total):
                    if first:
                        first = False
                        origin = (
                            "fresh"
                            if ctx.resumed_from is None
                            else f"resumed from {ctx.resumed_from} "
                            f"weight {model.weight[0, 0].item():g}"
                        )
                        sys.stdout.write(f"rank {rank} {origin}\n")  # one write: no interleaving
                        sys.stdout.flush()
                    model.weight.data.add_(1.0)
                    sys.stdout.write(f"rank {rank} step {step}\n")
                    sys.stdout.flush()
                    time.sleep(0.05)
            except SystemExit:
                # One write, so that two ranks' lines never interleave (print writes twice).
                durable = ctx.checkpointer.durable_step
                sys.stdout.write(f"rank {rank} stopped at step {ctx.step} durable {durable}\n")
                sys.stdout.flush()
                raise
        print(f"rank {rank} done", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
