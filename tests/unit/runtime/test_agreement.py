"""The step agreement between real ranks (gloo, two processes): what rank 0 alone heard of a
resize reaches every rank with the stop."""

from __future__ import annotations

import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

from preemptible.runtime.elastic import Agreed, StepAgreement


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, results: dict[int, list[Agreed]]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        agreement = StepAgreement()
        results[rank] = [
            agreement.agree(False, rank == 1),
            agreement.agree(rank == 0, False, 3 if rank == 0 else None),
        ]
    finally:
        dist.destroy_process_group()


def test_a_resize_heard_by_rank_0_alone_is_agreed_by_every_rank_with_the_stop() -> None:
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(_free_port(), results), nprocs=2, join=True)
    for rank in (0, 1):
        assert results[rank] == [Agreed(False, True, None), Agreed(True, False, 3)], rank


def test_without_torch_distributed_the_agreement_is_the_local_view() -> None:
    assert StepAgreement().agree(True, False, 4) == Agreed(stop=True, save=False, resize_to=4)
    assert StepAgreement().agree(False, True) == Agreed(stop=False, save=True, resize_to=None)
