"""An Accelerate training loop made preemption-safe with PreemptibleAccelerator.

    python examples/accelerate_train.py --dir runs/acc
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py --dir runs/acc2

(On a machine without GPUs, prefix the second with ``ACCELERATE_USE_CPU=1``: without it each of
the two processes runs alone, and ``PreemptibleAccelerator`` refuses them; without
``--multi_gpu``, ``--num_processes 2`` starts one.)

It prints one line per 10 steps. Send it SIGTERM (``kill <pid>``; under ``accelerate launch``,
the launcher's pid) or press Ctrl-C: each process finishes its step, they save together, print
``preempted: checkpointed step N ... in DIR; exiting with 143`` (130 for Ctrl-C) and exit. Run
the same command again: it prints ``resumed at epoch E, step N`` and continues with the next
batch, the result bit for bit what an uninterrupted run gives; once it has finished, the same
command says
``already complete at step N`` and exits 0. Checkpoints are the folders
``<dir>/checkpoints/checkpoint_<i>``, the last 3 kept; ``preemptible ckpt verify`` reads each.
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset

from preemptible.accelerate import PreemptibleAccelerator


def regression_data(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 32, generator=g)
    y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="project directory (checkpoints go inside)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--step-seconds", type=float, default=0.02, help="slow each step down")
    args = parser.parse_args()

    set_seed(0)  # before the model and prepare(): a restart builds the same objects
    config = ProjectConfiguration(
        project_dir=args.dir, automatic_checkpoint_naming=True, total_limit=3
    )
    accelerator = Accelerator(project_config=config)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200)
    loader = DataLoader(regression_data(args.samples), batch_size=32, shuffle=True)
    model, optimizer, schedule, loader = accelerator.prepare(model, optimizer, schedule, loader)

    with PreemptibleAccelerator(accelerator) as acc:
        if acc.load_state() is not None:  # None on the first run
            accelerator.print(f"resumed at epoch {acc.epoch}, step {acc.global_step}")
        loss = None
        for epoch in acc.epochs(args.epochs):
            for x, y in acc.batches(loader):  # a notice: save at the end of this step, exit
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                if acc.global_step % 10 == 0:
                    accelerator.print(
                        f"epoch {epoch} step {acc.global_step} loss {loss.item():.4f}"
                    )
                time.sleep(args.step_seconds)
            accelerator.save_state()  # checkpoints/checkpoint_<i>, atomic; old ones go after
        last = "-" if loss is None else f"{loss.item():.4f}"  # None: --epochs 0
        cost = acc.cost
        accelerator.print(
            f"done: {acc.global_step} steps, loss {last}, "
            f"save {cost.save.mean:.3f} s mean over {cost.save.count}"
        )
    accelerator.end_training()  # gloo may abort a process that exits with its group alive


if __name__ == "__main__":
    main()
