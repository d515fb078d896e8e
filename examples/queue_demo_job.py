"""The training job that examples/queue_demo.py submits: small, on the CPU, deterministic.

A multilayer perceptron learns a fixed function with Adam under `@preemptible`: it saves every
few steps, and on SIGTERM (the queue manager's notice) saves the step it is in and exits 143.
Batch k is drawn from a generator seeded with k, so a resumed run sees the same data as an
uninterrupted one, and its final parameters are the same bit for bit. `--step-seconds` sleeps
after each step, standing in for the GPU time of a real job; it changes no number. `--gpus`
is the size of this attempt (the manager's `{gpus}`): this job only prints it, because one CPU
process stands in for every GPU; a job of one process per GPU keeps its math the same across
sizes with `GlobalBatch` and the resumable sampler (docs/user-guide/elastic.md).

    python examples/queue_demo_job.py --dir runs/job --steps 120 --step-seconds 0.2 --gpus 4

Under the queue manager the job finds `PREEMPTIBLE_QUEUE_URL` and friends in its environment;
the SDK uses them, the script does not.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import torch

from preemptible import Context, preemptible

WIDTH = 512
FEATURES = 64
BATCH = 64


def build_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model and its optimizer, initialised from a fixed seed."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, WIDTH),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, 1),
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of step `step`: the same whichever attempt runs the step."""
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, torch.tanh(x[:, :8].sum(dim=1, keepdim=True) / 4)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", required=True, help="checkpoint directory")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=10, help="save every N steps")
    parser.add_argument("--report", type=int, default=20, help="print progress every N steps")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (pacing)")
    parser.add_argument(
        "--gpus", type=int, default=1, help="GPUs of this attempt (the manager's {gpus})"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # the demo runs on two cores, next to other jobs
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the SDK's notice line
    attempt = os.environ.get("PREEMPTIBLE_ATTEMPT", "1")

    @preemptible(args.dir, every_steps=args.every, keep=2)
    def train(ctx: Context) -> float:
        model, opt = build_model()
        ctx.register(model=model, optim=opt)
        loss = torch.zeros(())
        first = True
        for step in ctx.steps(args.steps):
            if first:
                first = False
                origin = (
                    "fresh" if ctx.resumed_from is None else f"resumed from step {ctx.resumed_from}"
                )
                print(
                    f"attempt {attempt}: starting at step {step} on {args.gpus} GPUs ({origin})",
                    flush=True,
                )
            x, y = batch(step)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if (step + 1) % args.report == 0:
                print(f"{step + 1}/{args.steps} steps done: loss {loss.item():.4f}", flush=True)
            time.sleep(args.step_seconds)
        return loss.item()

    loss = train()
    print(f"finished all {args.steps} steps: loss {loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
