"""The process the crash tests SIGKILL: resumes from the latest checkpoint and saves forever."""

from __future__ import annotations

from typing import Any

from preemptible import Checkpointer
from tests.helpers import make_state


def save_forever(url: str, storage_options: dict[str, Any], log_path: str, mib: float) -> None:
    ckpt = Checkpointer(url, keep=2, storage_options=storage_options, shard_bytes=1 << 20)
    latest = ckpt.latest()
    step = latest.step + 1 if latest else 0
    while True:
        ckpt.save(step, make_state(step, mib=mib, tensors=8))
        with open(log_path, "a") as log:  # written only after save() returned: committed
            log.write(f"{step}\n")
        step += 1


def save_steps(url: str, storage_options: dict[str, Any], steps: list[int], salt: int) -> None:
    """A writer that saves ``steps`` with its own contents (``salt``) and retention keep=3."""
    ckpt = Checkpointer(url, keep=3, storage_options=storage_options, shard_bytes=256 << 10)
    for step in steps:
        ckpt.save(step, make_state(step + salt, mib=1.0), metadata={"salt": salt})
