"""A small deterministic training job under `@preemptible`, for the queue manager and SLURM tests.

    python queue_train.py CKPT_DIR OUT --total N [--step-s S] [--every K] [--save-s A,B,...]
                          [--slow-marker PATH] [--linger-s S]

Each executed step appends "<attempt> <step>" to OUT.steps (the attempt is the queue manager's,
else SLURM's restart count), so a test counts the steps a preemption made the job redo; at the
end the weights go to OUT (`torch.save` of tensors, read back with `weights_only=True`).
`--save-s` makes the n-th save take that long (the last value repeats), so a test controls the
cost the job measures and reports; before a save that takes a second or more, `--slow-marker`
is written with the job's pid (a test SIGKILLs it then).
`--linger-s` keeps the job alive after its last save, so that its last cost report goes out.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch

from preemptible import Context, preemptible


class SlowState:
    """Checkpointed like any state; its `state_dict` takes the time the schedule says."""

    def __init__(self, schedule: list[float], marker: Path | None):
        self.schedule, self.marker, self.saves = schedule, marker, 0

    def state_dict(self) -> dict[str, Any]:
        seconds = self.schedule[min(self.saves, len(self.schedule) - 1)] if self.schedule else 0
        self.saves += 1
        if seconds >= 1.0 and self.marker is not None:
            self.marker.write_text(str(os.getpid()))
        time.sleep(seconds)
        return {"saves": torch.tensor(self.saves)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.saves = int(state["saves"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt")
    parser.add_argument("out", type=Path)
    parser.add_argument("--total", type=int, required=True)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--save-s", default="")
    parser.add_argument("--slow-marker", type=Path)
    parser.add_argument("--linger-s", type=float, default=0.0)
    args = parser.parse_args()
    schedule = [float(s) for s in args.save_s.split(",") if s]
    attempt = os.environ.get("PREEMPTIBLE_ATTEMPT") or os.environ.get("SLURM_RESTART_COUNT", "0")

    @preemptible(args.ckpt, every_steps=args.every, async_save=False)
    def train(ctx: Context) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        ctx.register(model=model, opt=opt, slow=SlowState(schedule, args.slow_marker))
        print("ready", flush=True)
        for step in ctx.steps(args.total):
            with open(f"{args.out}.steps", "a") as f:
                f.write(f"{attempt} {step}\n")
            x = torch.randn(16, 8)  # from the checkpointed RNG: a resumed run draws the same
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.step_s)
        time.sleep(args.linger_s)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    torch.save(train(), args.out)


if __name__ == "__main__":
    main()
