"""A small deterministic data-parallel job that keeps its math across world sizes (elastic tests).

    torchrun --nproc-per-node N elastic_train.py CKPT_DIR OUT_DIR [--epochs 2] [--step-s S]
             [--stop-at-step STEP ...] [--pause-at-step STEP ...] [--dtype float64]
             [--samples 48] [--global-batch 8] [--micro-batch 1] [--every-steps 1000]

The size of each run is torchrun's world size (under the queue manager, ``--nproc-per-node
{gpus}``). A float64 (``--dtype``) MLP learns a fixed regression on ``--samples`` samples
under DDP (gloo), with a constant global batch (`GlobalBatch`: more micro-batches per step on
fewer ranks) and a `ResumableSampler` that deals what is left of the epoch over whatever ranks
there are. It stops at a step boundary on SIGTERM or a queue manager's notice (preemption or
resize), saving the step it completed, and resumes from it at any size the global batch allows.

Output, in OUT_DIR:

- ``samples-w{W}-r{R}-{pid}.txt``: one line per sample trained on, ``epoch step world rank id``
  (one file per process, so that runs at different sizes never share one);
- ``final.pt``: the model's parameters after the last step (rank 0; `torch.save` of tensors).

On stdout, rank 0 prints ``world W: starting at step S`` once, then ``world W step S loss L`` after
each step. ``--stop-at-step`` makes rank 0 alone ask for a stop at the end of each listed step
(the path a queue manager's notice takes), for replaying another run's stops exactly.
``--pause-at-step`` makes rank 0 print ``world W: waiting for a notice at step S`` at the end of
each listed step and wait (up to 120 s) for a notice, such as a SIGTERM, before the ranks agree
on the boundary: a test's signal then stops the job at exactly that step.

``--fault segv|exit|hang --fault-at STEP [--fault-attempts N]`` breaks the job at the end of
STEP on the queue manager's attempts 1..N (0: every attempt): rank 0 dies of SIGSEGV, or exits
3 after printing an error to stderr; for ``hang`` the last rank stops taking part (it sleeps),
so the others block in the next step's all-reduce, as in a deadlocked collective.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from preemptible import Context, GlobalBatch, ResumableSampler, init_process_group, preemptible


def dataset(samples: int, dtype: torch.dtype) -> TensorDataset:
    g = torch.Generator().manual_seed(99)
    x = torch.randn(samples, 8, generator=g, dtype=torch.float64)
    y = (x @ torch.linspace(-1, 1, 8, dtype=torch.float64)).sin().unsqueeze(1)
    return TensorDataset(torch.arange(samples), x.to(dtype), y.to(dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", help="checkpoint root shared by all ranks and runs")
    parser.add_argument("out", type=Path, help="where the sample logs and final.pt go")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--step-s", type=float, default=0.0, help="sleep after each step")
    parser.add_argument(
        "--every-steps",
        type=int,
        default=1000,
        help="save every N steps (the SDK then reports its measured cost to a queue manager)",
    )
    parser.add_argument("--stop-at-step", type=int, nargs="*", default=[])
    parser.add_argument("--pause-at-step", type=int, nargs="*", default=[])
    parser.add_argument("--fault", choices=("segv", "exit", "hang"))
    parser.add_argument("--fault-at", type=int, default=-1)
    parser.add_argument("--fault-attempts", type=int, default=1)
    args = parser.parse_args()
    if args.samples % args.global_batch:
        parser.error("--samples must be a multiple of --global-batch (each sample once)")
    args.out.mkdir(parents=True, exist_ok=True)

    init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gb = GlobalBatch(args.global_batch, micro_batch=args.micro_batch, world_size=world)
    total = args.epochs * args.samples // args.global_batch
    dtype = getattr(torch, args.dtype)

    @preemptible(args.ckpt, every_steps=args.every_steps, async_save=False)
    def train(ctx: Context) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)  # the same initial model on every rank, at every size
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        ).to(dtype)
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        data = dataset(args.samples, dtype)
        sampler = ResumableSampler(data, seed=3)
        loader = DataLoader(
            data, batch_size=gb.micro_batch, sampler=sampler, generator=torch.Generator()
        )
        batches = sampler.batches(loader)
        ctx.register(model=model, optim=opt, data=sampler)
        log = (args.out / f"samples-w{world}-r{rank}-{os.getpid()}.txt").open("a")
        for step in ctx.steps(total):
            if rank == 0 and step == (ctx.resumed_from if ctx.resumed_from is not None else -1) + 1:
                print(f"world {world}: starting at step {step}", flush=True)
            opt.zero_grad()
            seen, loss_sum = [], 0.0
            for i in range(gb.accumulation_steps):
                ids, x, y = next(batches)
                epoch = sampler.epoch  # the batch's: the stream is paused at its yield
                last = i == gb.accumulation_steps - 1
                with contextlib.nullcontext() if last else ddp.no_sync():
                    loss = gb.scale(torch.nn.functional.mse_loss(ddp(x), y, reduction="sum"))
                    loss.backward()
                seen += [f"{epoch} {step} {world} {rank} {int(s)}\n" for s in ids]
                loss_sum += loss.item()
            opt.step()
            log.writelines(seen)
            log.flush()
            if rank == 0:
                print(f"world {world} step {step} loss {loss_sum:.9f}", flush=True)
            if rank == 0 and step in args.stop_at_step:
                ctx.guard.request(f"--stop-at-step {step}")
            if rank == 0 and step in args.pause_at_step:
                print(f"world {world}: waiting for a notice at step {step}", flush=True)
                ctx.guard.wait(timeout=120)
            if args.step_s:
                time.sleep(args.step_s)
            if step == args.fault_at:
                fault(args.fault, args.fault_attempts, step, rank, world)
        log.close()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    try:
        final = train()
        if rank == 0:
            torch.save(final, args.out / "final.pt")
            print("done", flush=True)
    finally:
        dist.destroy_process_group()


def fault(kind: str | None, attempts: int, step: int, rank: int, world: int) -> None:
    """The injected failure of ``--fault`` (on the manager's attempts 1..``attempts``)."""
    attempt = int(os.environ.get("PREEMPTIBLE_ATTEMPT", "1"))
    if kind is None or (attempts and attempt > attempts):
        return
    if kind == "segv" and rank == 0:
        print(f"rank 0: segfault at step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "exit" and rank == 0:
        print(f"RuntimeError: injected NCCL error at step {step}", file=sys.stderr, flush=True)
        os._exit(3)
    if kind == "hang" and rank == world - 1:
        print(f"rank {rank}: stops taking part at step {step}", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main()
