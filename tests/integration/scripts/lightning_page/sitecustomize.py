"""A docs page's Lightning script, run as printed, with a test's eyes and hand on the Trainer.

With this directory first on ``PYTHONPATH`` and one of the variables below set, every Python
process (the script, and the ranks ``ddp`` starts with the same command) imports this module at
start-up, and every ``lightning.pytorch.Trainer`` gets one more callback, so the page's code
stays as printed:
- ``PAGE_TRACE=PREFIX``: after each training batch, appends ``global_step epoch batch_idx
  sum(x) loss`` (floats in full) to ``PREFIX<rank>``: what the batch read and what dropout drew.
- ``PAGE_KILL_AT=STEP``: at the end of the batch that makes that global step, global rank 0
  sends itself a real SIGTERM (this callback's turn comes before the page's, so they save at the
  end of the same batch).
"""

from __future__ import annotations

import os
import signal
from typing import Any


def _install(trace: str | None, kill_at: int) -> None:
    import lightning.pytorch as pl

    class Harness(pl.Callback):
        def on_train_batch_end(
            self, trainer: pl.Trainer, module: Any, outputs: Any, batch: Any, i: int
        ) -> None:
            if trace:
                loss = float(outputs["loss"] if isinstance(outputs, dict) else outputs)
                line = f"{trainer.global_step} {trainer.current_epoch} {i} "
                with open(f"{trace}{trainer.global_rank}", "a") as f:
                    f.write(line + f"{float(batch[0].sum())!r} {loss!r}\n")
            if trainer.global_step == kill_at and trainer.is_global_zero:
                os.kill(os.getpid(), signal.SIGTERM)

    init = pl.Trainer.__init__

    def with_harness(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["callbacks"] = [Harness(), *(kwargs.get("callbacks") or [])]
        init(self, *args, **kwargs)

    pl.Trainer.__init__ = with_harness  # type: ignore[method-assign]


if os.environ.get("PAGE_TRACE") or os.environ.get("PAGE_KILL_AT"):
    _install(os.environ.get("PAGE_TRACE"), int(os.environ.get("PAGE_KILL_AT", "-1")))
