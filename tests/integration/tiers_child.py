"""The process the two-tier crash test SIGKILLs: one big save, then its slowed upload to S3.

Usage: python -m tests.integration.tiers_child URL LOCAL_DIR STORAGE_OPTIONS_JSON MIB PAUSE
Prints "committed" once the local commit returned, then waits for the upload. Each uploaded
file is followed by PAUSE seconds: the bucket's speed varies with the machine's load, and the
test must see some files uploaded and the manifest not yet, whatever that speed is.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch

from preemptible import Checkpointer
from preemptible.checkpoint import upload


def big_state(mib: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    per = (mib << 20) // 4 // 8
    return {f"w{i}": torch.randn(per, generator=g) for i in range(8)}


def slow_uploads(pause: float) -> None:
    """Sleep after each file the uploader copies (the S3 writes themselves are real)."""
    copy = upload.copy_verified

    def copy_then_pause(*args: Any) -> None:
        copy(*args)
        time.sleep(pause)

    upload.copy_verified = copy_then_pause  # type: ignore[assignment]


def main() -> None:
    url, local, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    mib, pause = int(sys.argv[4]), float(sys.argv[5])
    slow_uploads(pause)
    ckpt = Checkpointer(
        url, local=local, storage_options=options, shard_bytes=(mib << 20) // 8, max_workers=2
    )
    ckpt.save(0, big_state(mib))
    print("committed", flush=True)
    ckpt.wait_durable()
    print("durable", flush=True)


if __name__ == "__main__":
    main()
