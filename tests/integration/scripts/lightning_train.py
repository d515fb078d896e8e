"""A small deterministic Lightning run under PreemptionCallback, for test_lightning.py.

Usage: lightning_train.py WORKDIR [--devices N] [--slow SECONDS] [--local DIR]

The same command starts and restarts it. After every batch it writes the number of batches done
to WORKDIR/progress-rank<R> (the test sends SIGTERM once enough are done); at the end it saves the
final weights and optimizer state with Checkpointer to WORKDIR/final-rank<R>.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from preemptible import Checkpointer
from preemptible.lightning import PreemptibleCheckpointIO, PreemptionCallback


class Model(pl.LightningModule):
    def __init__(self, workdir: str, slow: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.workdir = workdir
        self.slow = slow
        self.batches = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.slow)
        if os.environ.get("LT_TRACE"):
            with open(os.path.join(self.workdir, f"trace-rank{self.global_rank}"), "a") as f:
                f.write(f"{self.trainer.global_step} {float(x.sum()):.6f}\n")
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        path = os.path.join(self.workdir, f"progress-rank{self.global_rank}")
        with open(path + ".tmp", "w") as f:
            f.write(f"{self.trainer.global_step}\n")
        os.replace(path + ".tmp", path)

    def train_dataloader(self) -> StatefulDataLoader:
        gen = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(96, 8, generator=gen), torch.randn(96, 1, generator=gen))
        if self.trainer.world_size == 1:
            return StatefulDataLoader(data, batch_size=4, shuffle=True)
        # Several processes: a DistributedSampler of our own, whose order depends on its seed
        # and the epoch only, so a resumed run fast-forwards through the same order. With
        # shuffle=True, Lightning would wrap torchdata's RandomSampler, which draws a new order
        # from the global RNG when the epoch starts (docs/ways-in/lightning.md).
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        return StatefulDataLoader(data, batch_size=4, sampler=sampler)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--local", default=None, help="a local tier: two tiers, WORKDIR/ckpt last")
    args = parser.parse_args()

    pl.seed_everything(0, workers=True)
    ckpt_dir = os.path.join(args.workdir, "ckpt")
    preemption = PreemptionCallback(ckpt_dir, local=args.local)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=2,
        default_root_dir=args.workdir,  # where Lightning's own SLURM handler would save
        deterministic=True,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[PreemptibleCheckpointIO(local=args.local)],
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_last=True), preemption],
    )
    model = Model(args.workdir, args.slow)
    trainer.fit(model, ckpt_path=preemption.resume_path())
    optim = trainer.optimizers[0]
    # Each rank keeps its own copy (collective=False): a collective save needs one shared root.
    final = os.path.join(args.workdir, f"final-rank{trainer.global_rank}")
    out = Checkpointer(final, collective=False)
    out.save(trainer.global_step, {"model": model.state_dict(), "optim": optim.state_dict()})


if __name__ == "__main__":
    main()
