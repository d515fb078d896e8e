"""A torch loop over a DataLoader with 2 worker processes, protected or not.

    python dataloader_loop.py OUT_DIR protect|plain [spawn|forkserver|fork]

Each worker writes its pid to OUT_DIR/worker-N (the loader's own worker_init_fn, which
protect_dataloader must keep). Prints "ready" once batches flow; on a notice it finishes the step,
spends 0.5 s "saving", writes OUT_DIR/saved.json and exits with the guard's exit code.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from preemptible import PreemptionGuard, protect_dataloader


class Numbers(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.001)
        return torch.tensor([float(index)])


def record_pid(worker_id: int) -> None:
    with open(os.path.join(os.environ["OUT_DIR"], f"worker-{worker_id}"), "w") as f:
        f.write(str(os.getpid()))


def main() -> int:
    out_dir, mode = sys.argv[1], sys.argv[2]
    context = sys.argv[3] if len(sys.argv) > 3 else "spawn"
    os.environ["OUT_DIR"] = out_dir
    loader = DataLoader(
        Numbers(),
        batch_size=4,
        num_workers=2,
        multiprocessing_context=context,
        worker_init_fn=record_pid,
    )
    if mode == "protect":
        loader = protect_dataloader(loader)
    with PreemptionGuard() as guard:
        for step, batch in enumerate(loader):
            if step == 3:
                print("ready", flush=True)
            time.sleep(0.05)  # "train"
            if guard.requested:
                with guard.final_save():
                    time.sleep(0.5)  # a save takes time; a dead worker's SIGCHLD lands here
                    with open(os.path.join(out_dir, "saved.json"), "w") as f:
                        json.dump({"step": step, "last": batch.tolist()}, f)
                return guard.exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
