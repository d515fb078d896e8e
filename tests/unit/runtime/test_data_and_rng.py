import random

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from preemptible import ResumableSampler, RNGState


def test_rng_state_round_trips_every_generator():
    rng = RNGState()
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    saved = rng.state_dict()
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(9)
    random.seed(9)
    np.random.seed(9)
    rng.load_state_dict(saved)
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(1, 200),
    old_world=st.integers(1, 4),
    new_world=st.integers(1, 4),
    batches_taken=st.integers(0, 30),
)
def test_resuming_on_another_world_size_sees_every_remaining_sample_once(
    length, old_world, new_world, batches_taken
):
    batch = 4
    epoch_order = ResumableSampler(length, seed=5, num_replicas=1, rank=0)._order()
    consumed = min(length, batches_taken * batch * old_world)
    state = {"seed": 5, "epoch": 0, "consumed": consumed, "length": length}
    seen: list[int] = []
    for rank in range(new_world):
        sampler = ResumableSampler(length, seed=5, num_replicas=new_world, rank=rank)
        sampler.load_state_dict(state)
        seen.extend(sampler)
    remaining = epoch_order[consumed:]
    assert set(seen) == set(remaining)  # nothing skipped, nothing from the done part
    assert len(seen) - len(remaining) < new_world  # at most the DistributedSampler-style padding


def test_batches_counts_what_the_loop_took_not_what_workers_prefetched():
    data = list(range(64))
    sampler = ResumableSampler(data, seed=1)
    loader = DataLoader(
        data, batch_size=4, sampler=sampler, num_workers=2, generator=torch.Generator()
    )
    batches = sampler.batches(loader)
    taken = [next(batches) for _ in range(3)]
    assert sampler.state_dict()["consumed"] == 12
    resumed = ResumableSampler(data, seed=1)
    resumed.load_state_dict(sampler.state_dict())
    rest = next(
        resumed.batches(
            DataLoader(data, batch_size=4, sampler=resumed, generator=torch.Generator())
        )
    )
    assert rest.tolist() == next(batches).tolist()
    assert sum(len(b) for b in taken) == 12
