"""Checkpointer(collective=False) in a real two-process gloo job: rank 0 saves alone, all load.

This is how a framework that saves from rank 0 only (Lightning's CheckpointIO) uses the store; a
collective checkpointer would wait forever for rank 1 there.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from preemptible import Checkpointer
from preemptible.errors import ConfigError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, root: str, port: int, results: dict[int, list[float]]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        store = Checkpointer(root, keep=2, collective=False)
        if rank == 0:
            for step in range(3):
                store.save(step, {"w": torch.full((4,), float(step))})
        dist.barrier()
        steps = [i.step for i in store.list()]
        loaded = store.load()
        assert steps == [1, 2], steps  # rank 0 applied keep=2 after its commits
        assert store.load(1)["w"][0].item() == 1.0
        results[rank] = loaded["w"].tolist()
    finally:
        dist.destroy_process_group()


def test_rank_0_saves_alone_and_every_rank_loads_the_same_state(tmp_path: Path) -> None:
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(str(tmp_path), _free_port(), results), nprocs=2, join=True)
    assert dict(results) == {0: [2.0] * 4, 1: [2.0] * 4}
    (manifest,) = [i for i in Checkpointer(tmp_path).list() if i.step == 2]
    assert manifest.world_size == 1  # one state, not one per rank


def test_sharded_state_needs_the_collective_path(tmp_path: Path) -> None:
    from torch.distributed.tensor import DeviceMesh, DTensor, Replicate

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])
        tensor = DTensor.from_local(torch.ones(2), mesh, [Replicate()])
        with pytest.raises(ConfigError, match="collective=True"):
            Checkpointer(tmp_path, collective=False).save(0, {"t": tensor})
    finally:
        dist.destroy_process_group()
