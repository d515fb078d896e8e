"""A training loop whose remote tier is slow for real, stopped by SIGTERM (the last-save tests).

    python last_save_train.py REMOTE_DIR [--local DIR] --write-delay S [--total N]

The remote is ``slowdir://REMOTE_DIR``: the local disk, but closing each file written there
sleeps ``--write-delay`` seconds, as a slow link to an object store would. ``--local`` adds a
fast first tier. The job prints ``step S`` after each step and ``resumed from R`` (or
``fresh``) at its start; the deadline comes from ``PREEMPTIBLE_GRACE_SECONDS``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

from preemptible import Context


class SlowOpener(LocalFileOpener):
    """A file written to ``slowdir://``: closing it takes `SlowDirFileSystem.write_delay_s`."""

    def close(self) -> None:
        if not self.closed:
            time.sleep(SlowDirFileSystem.write_delay_s)
        super().close()

    def __exit__(self, *exc: Any) -> None:  # fsspec's closes the file without `close`
        self.close()


class SlowDirFileSystem(LocalFileSystem):
    """``slowdir://PATH``: the local file system, with a real sleep per file written."""

    protocol = ("slowdir",)
    write_delay_s = 0.0

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return super()._strip_protocol(str(path).removeprefix("slowdir://"))

    def _open(self, path: Any, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        if "r" in mode:
            return super()._open(path, mode=mode, block_size=block_size, **kwargs)
        if self.auto_mkdir:
            self.makedirs(self._parent(path), exist_ok=True)
        return SlowOpener(path, mode, fs=self, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("remote")
    parser.add_argument("--local")
    parser.add_argument("--write-delay", type=float, required=True)
    parser.add_argument("--total", type=int, default=100_000)
    args = parser.parse_args()
    SlowDirFileSystem.write_delay_s = args.write_delay
    fsspec.register_implementation("slowdir", SlowDirFileSystem, clobber=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    with Context(f"slowdir://{args.remote}", local=args.local, every_steps=5) as ctx:
        ctx.register(model=model)
        first = True
        for step in ctx.steps(args.total):
            if first:
                first = False
                origin = "fresh" if ctx.resumed_from is None else f"resumed from {ctx.resumed_from}"
                print(origin, flush=True)
            model.weight.data.add_(1.0)
            print(f"step {step}", flush=True)
            time.sleep(0.05)


if __name__ == "__main__":
    main()
