"""A Lightning Trainer made preemption-safe with two objects from `preemptible.lightning`.

    python examples/lightning_train.py --dir runs/lightning              # one process
    python examples/lightning_train.py --dir runs/lightning --devices 2  # ddp on the CPU (gloo)

Send it SIGTERM (or SIGUSR1) while it trains: it finishes the batch it is in, writes
`<dir>/preempted.ckpt` atomically, and exits with 143 (138). Run the same command again: it
resumes at the next batch, mid-epoch, and says `resuming from <dir>/preempted.ckpt`. Every
checkpoint, `ModelCheckpoint`'s included, is committed atomically with checksums and read back
without unpickling. `--batch-seconds` slows each batch so that there is time to send a signal.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from preemptible.lightning import PreemptibleCheckpointIO, PreemptionCallback


class Regression(pl.LightningModule):
    """A small network fitting a fixed noisy linear function."""

    def __init__(self, batch_seconds: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)
        )
        self.batch_seconds = batch_seconds

    def train_dataloader(self) -> StatefulDataLoader:
        gen = torch.Generator().manual_seed(7)
        x = torch.randn(512, 16, generator=gen)
        y = x @ torch.randn(16, 1, generator=gen) + 0.05 * torch.randn(512, 1, generator=gen)
        data = TensorDataset(x, y)
        if self.trainer.world_size == 1:  # a stateful loader resumes mid-epoch
            return StatefulDataLoader(data, batch_size=32, shuffle=True)
        # ddp: a DistributedSampler of our own, whose order depends on seed and epoch only
        return StatefulDataLoader(data, batch_size=32, sampler=DistributedSampler(data, seed=7))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(self.batch_seconds)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        if batch_idx % 4 == 0 and self.global_rank == 0:
            print(
                f"epoch {self.current_epoch} batch {batch_idx} loss {loss.item():.4f}", flush=True
            )
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", required=True, help="checkpoint directory (or fsspec URL)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--batch-seconds", type=float, default=0.0, help="sleep per batch")
    args = parser.parse_args()

    pl.seed_everything(0)
    preemption = PreemptionCallback(args.dir)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        logger=False,
        enable_progress_bar=False,
        plugins=[PreemptibleCheckpointIO()],
        callbacks=[ModelCheckpoint(dirpath=args.dir, save_last=True), preemption],
    )
    resume = preemption.resume_path()  # None on the first run: the same command every time
    if resume is not None and trainer.is_global_zero:
        print(f"resuming from {resume}", flush=True)
    trainer.fit(Regression(args.batch_seconds), ckpt_path=resume)
    if trainer.is_global_zero:
        loss = float(trainer.callback_metrics["loss"])
        print(f"done: global step {trainer.global_step}, loss {loss:.4f}")


if __name__ == "__main__":
    main()
