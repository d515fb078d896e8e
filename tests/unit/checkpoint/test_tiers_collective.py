"""Two tiers with a collective save: allowed for every rank of one node, refused across nodes.

The refusal is checked in a real two-process gloo job that the environment declares to span
two nodes (``LOCAL_WORLD_SIZE=1``), and the rule itself as a table.
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
from preemptible.checkpoint.tiers import RankPlace, one_node_problem
from preemptible.errors import ConfigError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, tmp: str, port: int, results: dict[int, list[str]]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    seen = []
    try:
        state = {"w": torch.full((4,), float(rank))}
        # 1. Two nodes of one rank each, as torchrun --nnodes=2 says: refused on every rank.
        os.environ["LOCAL_WORLD_SIZE"] = "1"
        ckpt = Checkpointer(f"{tmp}/remote", local=f"{tmp}/local")
        try:
            ckpt.save(0, state)
        except ConfigError as e:
            seen.append(str(e))
        ckpt.close()
        # 2. One node: each rank's files in the one local tier, rank 0's upload, its own state.
        os.environ["LOCAL_WORLD_SIZE"] = "2"
        ckpt = Checkpointer(f"{tmp}/remote", local=f"{tmp}/local")
        ckpt.save(1, state)
        assert ckpt.wait_durable(timeout=60)
        seen.append(f"durable {ckpt.durable_step}")
        ckpt.close()
        dist.barrier()  # rank 1 knows nothing of the upload: rank 0's close waited for it
        other_node = Checkpointer(f"{tmp}/remote", local=f"{tmp}/other-{rank}")
        seen.append(f"loaded {other_node.load()['w'][0].item():g}")
        other_node.close()
    finally:
        dist.destroy_process_group()
    results[rank] = seen


def test_a_job_over_two_nodes_is_refused_and_one_over_one_node_uploads_from_rank_0(
    tmp_path: Path,
) -> None:
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(str(tmp_path), _free_port(), results), nprocs=2, join=True)
    for rank in (0, 1):
        refused, durable, loaded = results[rank]
        assert "spans several nodes (WORLD_SIZE=2, LOCAL_WORLD_SIZE=1)" in refused
        assert "Supported: one process, or every rank of a single-node job" in refused
        assert durable == ("durable 1" if rank == 0 else "durable None")
        assert loaded == f"loaded {rank}"  # from the remote, each rank its own state
    assert not (tmp_path / "remote" / "step-000000000000").exists()  # the refused save
    assert Checkpointer(tmp_path / "remote").verify(1).ok


def place(
    host: str = "node-a", local: str = "/tmp/ckpt", size: int | None = 2, uploads: bool = False
) -> RankPlace:
    return RankPlace(host=host, local=local, local_world_size=size, uploads=uploads)


@pytest.mark.parametrize(
    ("places", "problem"),
    [
        pytest.param([place(uploads=True), place()], None, id="one-node"),
        pytest.param([place(uploads=True, size=None), place(size=None)], None, id="no-env"),
        pytest.param([place(uploads=True, size=1), place(size=1)], "several nodes", id="env"),
        pytest.param([place(uploads=True), place(host="b")], "run on 2 hosts", id="two-hosts"),
        pytest.param([place(uploads=True), place(local="/x")], "2 local dir", id="two-dirs"),
        pytest.param([place(), place(uploads=True)], "ranks [1] upload", id="rank-1-uploads"),
        pytest.param([place(uploads=True)] * 2, "ranks [0, 1] upload", id="both-upload"),
    ],
)
def test_one_node_problem_names_what_keeps_ranks_from_sharing_a_local_tier(
    places: list[RankPlace], problem: str | None
) -> None:
    found = one_node_problem(places)
    assert (found is None) if problem is None else (found is not None and problem in found)
