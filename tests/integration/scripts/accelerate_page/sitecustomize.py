"""A docs page's Accelerate script, run as printed, with a test's eyes and hand on its loop.

With this directory first on ``PYTHONPATH`` and one of the variables below set, every Python
process (the script, and each process ``accelerate launch`` starts) imports this module at
start-up, and ``PreemptibleAccelerator.batches`` is wrapped, so the page's code stays as
printed:
- ``PAGE_TRACE=PREFIX``: after each step, appends ``global_step sum(inputs)`` (in full) to
  ``PREFIX<process index>``: which batch the step read.
- ``PAGE_KILL_AT=STEP``: after that step, process 0 sends a real SIGTERM, before the loop asks
  for the next batch (where the notice is acted on): to itself when it runs alone, to its
  launcher (``accelerate launch``, which passes it on to every process) when it has one, and
  then waits 2 s for it to arrive, so that the processes stop after this step, not some later.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any


def _install(trace: str | None, kill_at: int) -> None:
    from preemptible.accelerate import PreemptibleAccelerator

    batches = PreemptibleAccelerator.batches

    def traced(self: Any, loader: Any) -> Iterator[Any]:
        rank = self.accelerator.process_index
        for batch in batches(self, loader):
            yield batch  # the page's step runs here
            if trace:
                with open(f"{trace}{rank}", "a") as f:
                    f.write(f"{self.global_step} {float(batch[0].sum())!r}\n")
            if self.global_step == kill_at and rank == 0:
                if "WORLD_SIZE" not in os.environ:
                    os.kill(os.getpid(), signal.SIGTERM)
                else:  # wait here for the launcher to pass it on, so the stop is this step's
                    os.kill(os.getppid(), signal.SIGTERM)
                    time.sleep(2)

    PreemptibleAccelerator.batches = traced  # type: ignore[method-assign]


if os.environ.get("PAGE_TRACE") or os.environ.get("PAGE_KILL_AT"):
    _install(os.environ.get("PAGE_TRACE"), int(os.environ.get("PAGE_KILL_AT", "-1")))
