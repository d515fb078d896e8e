"""The process the two-tier crash test SIGKILLs: one big save, then its upload to S3.

Usage: python -m tests.integration.tiers_child URL LOCAL_DIR STORAGE_OPTIONS_JSON MIB
Prints "committed" once the local commit returned, then waits for the upload.
"""

from __future__ import annotations

import json
import sys

import torch

from preemptible import Checkpointer


def big_state(mib: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    per = (mib << 20) // 4 // 8
    return {f"w{i}": torch.randn(per, generator=g) for i in range(8)}


def main() -> None:
    url, local, options, mib = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    ckpt = Checkpointer(
        url, local=local, storage_options=options, shard_bytes=16 << 20, max_workers=2
    )
    ckpt.save(0, big_state(mib))
    print("committed", flush=True)
    ckpt.wait_durable()
    print("durable", flush=True)


if __name__ == "__main__":
    main()
