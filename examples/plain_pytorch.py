"""A plain PyTorch training loop made preemption-safe with the @preemptible decorator.

Send it SIGTERM (or SIGUSR1) at any moment: it finishes the step it is in, saves, and exits with
143 (138). Start it again with the same --dir and it continues from the next step, bit-exactly:
the model, the optimizer, the LR schedule, every RNG and the data order are restored.

    python examples/plain_pytorch.py --dir runs/plain --steps 300
    kill -TERM <pid>; python examples/plain_pytorch.py --dir runs/plain --steps 300
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from preemptible import Context, ResumableSampler, preemptible, protect_dataloader


def build_data(workers: int, loader_kind: str):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(512, 32, generator=g)
    y = (x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)).squeeze(1)
    dataset = TensorDataset(x, y)
    if loader_kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader
        from torchdata.stateful_dataloader.sampler import RandomSampler

        # torchdata's own RandomSampler saves its generator (torch's does not), and the loader gets
        # another generator for worker seeds: nothing draws from the global RNG at a moment
        # that differs after a resume.
        order = RandomSampler(dataset, generator=torch.Generator().manual_seed(7))
        loader = StatefulDataLoader(
            dataset, batch_size=16, sampler=order, num_workers=workers, generator=torch.Generator()
        )
        return loader, _endless(loader)
    sampler = ResumableSampler(dataset, seed=7)
    # A generator of its own: otherwise each new DataLoader iterator draws its worker seed from
    # the global RNG, at a different moment in a resumed run, and the runs diverge.
    loader = DataLoader(
        dataset, batch_size=16, sampler=sampler, num_workers=workers, generator=torch.Generator()
    )
    loader = protect_dataloader(loader)
    return sampler, sampler.batches(loader)


def _endless(loader):
    while True:
        yield from loader


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", required=True, help="checkpoint directory (or fsspec URL)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25, help="save every N steps")
    parser.add_argument(
        "--sync", action="store_true", help="periodic saves block (default: background)"
    )
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--loader", choices=["plain", "stateful"], default="plain")
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="sleep per step (demo pacing)"
    )
    args = parser.parse_args()

    @preemptible(args.dir, every_steps=args.every, async_save=not args.sync, keep=2)
    def train(ctx: Context) -> float:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1)
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
        position, batches = build_data(args.workers, args.loader)
        ctx.register(model=model, optim=opt, sched=sched, data=position)
        loss = torch.tensor(0.0)
        for step in ctx.steps(args.steps):
            x, y = next(batches)
            noise = np.random.normal() * 1e-3 + random.random() * 1e-3  # exercises every RNG
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y) + noise
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            print(f"step {step} loss {loss.item():.6f}", flush=True)
            if args.step_seconds:
                time.sleep(args.step_seconds)
        return loss.item()

    print(f"final loss {train():.6f}", flush=True)


if __name__ == "__main__":
    main()
