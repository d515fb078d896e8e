"""A small deterministic run of a real Accelerator under PreemptibleAccelerator, for
test_accelerate.py.

Usage: accelerate_train.py WORKDIR [--epochs N] [--slow SECONDS] [--total-limit N]
       [--ballast-mib M] [--save-every N] [--local DIR]

The same command starts and restarts it, alone or under ``accelerate launch``. Each process
writes its pid to WORKDIR/pid-rank<R> at start and, after every batch, the batches done to
WORKDIR/progress-rank<R> (the test signals once enough are done). ``accelerator.save_state()``
runs at the end of each epoch (and every ``--save-every`` batches), routed to
PreemptibleAccelerator. On the way out each process writes its exit code to
WORKDIR/exit-rank<R> and whether its process group is still alive to WORKDIR/group-rank<R> (a
process that exits with a gloo group alive may abort); at the end, the final weights and
optimizer state go to WORKDIR/final.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset

from preemptible import Checkpointer
from preemptible.accelerate import PreemptibleAccelerator


class Ballast:
    """A registered object with a large state, so that a save lasts long enough to be killed."""

    def __init__(self, mib: int) -> None:
        self.data = torch.arange(mib << 18, dtype=torch.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.data}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data.copy_(state["data"])


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def train(args: argparse.Namespace) -> None:
    set_seed(0)
    config = ProjectConfiguration(
        project_dir=args.workdir, automatic_checkpoint_naming=True, total_limit=args.total_limit
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    _train(args, accelerator)
    accelerator.end_training()  # not in a `finally`: on a notice the wrapper does it


def _train(args: argparse.Namespace, accelerator: Accelerator) -> None:
    rank = accelerator.process_index
    _write(os.path.join(args.workdir, f"pid-rank{rank}"), f"{os.getpid()}\n")
    # Each process its own dropout: a resume that gave one process another's RNG states would
    # train differently (DDP broadcasts the weights of process 0 at prepare()).
    torch.manual_seed(1000 + rank)
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
    )
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(96, 8, generator=gen), torch.randn(96, 1, generator=gen))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
    loader = DataLoader(data, batch_size=4, shuffle=True)
    net, opt, sched, loader = accelerator.prepare(net, opt, sched, loader)
    if args.ballast_mib:
        accelerator.register_for_checkpointing(Ballast(args.ballast_mib))

    acc = PreemptibleAccelerator(accelerator, local=args.local)
    print(f"rank {rank} resumed from step {acc.load_state()}", flush=True)
    for _epoch in acc.epochs(args.epochs):
        for x, y in acc.batches(loader):
            loss = torch.nn.functional.mse_loss(net(x), y)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            if os.environ.get("ACC_TRACE"):
                with open(os.path.join(args.workdir, f"trace-rank{rank}"), "a") as f:
                    f.write(f"{acc.global_step} {float(x.sum()):.6f}\n")
            _write(os.path.join(args.workdir, f"progress-rank{rank}"), f"{acc.global_step}\n")
            if args.save_every and acc.global_step % args.save_every == 0:
                accelerator.save_state()
            time.sleep(args.slow)
        accelerator.save_state()
    state = {"model": accelerator.unwrap_model(net).state_dict(), "optim": opt.state_dict()}
    Checkpointer(os.path.join(args.workdir, "final")).save(acc.global_step, state)
    acc.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--total-limit", type=int, default=None)
    parser.add_argument("--ballast-mib", type=int, default=0)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--local", default=None, help="a local tier: two tiers")
    args = parser.parse_args()
    rank = os.environ.get("RANK", "0")
    code: Any = 0
    try:
        train(args)
    except SystemExit as e:
        code = e.code
        raise
    except BaseException:
        code = "error"
        raise
    finally:
        _write(os.path.join(args.workdir, f"exit-rank{rank}"), f"{code}\n")
        group = "alive" if torch.distributed.is_initialized() else "ended"
        _write(os.path.join(args.workdir, f"group-rank{rank}"), f"{group}\n")


if __name__ == "__main__":
    main()
