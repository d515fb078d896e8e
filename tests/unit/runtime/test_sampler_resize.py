"""`ResumableSampler` across any sequence of world sizes: each sample once per epoch.

A run is simulated as segments: each starts every rank's sampler from the last saved state on
its own number of ranks, takes the same number of batches on every rank (the loop stops at a
step boundary), and saves. The samples each rank took are recorded with their epoch.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from preemptible import GlobalBatch, ResumableSampler

SEED = 7


def run_segment(
    length: int, state: dict[str, Any] | None, world: int, batch: int, batches: int
) -> tuple[dict[str, Any], list[tuple[int, int, int]]]:
    """`batches` batches on each of `world` ranks from `state`; the state every rank would save
    (they must agree) and what was taken, as (epoch, rank, sample)."""
    taken: list[tuple[int, int, int]] = []
    states = []
    for rank in range(world):
        sampler = ResumableSampler(length, seed=SEED, num_replicas=world, rank=rank)
        if state is not None:
            sampler.load_state_dict(state)
        loader = DataLoader(
            range(length), batch_size=batch, sampler=sampler, generator=torch.Generator()
        )
        stream = sampler.batches(loader)
        for _ in range(batches):
            got = next(stream)
            taken += [(sampler.epoch, rank, int(i)) for i in got]
        states.append(sampler.state_dict())
    assert all(s == states[0] for s in states), states  # one position, whatever the rank
    return states[0], taken


def order(length: int, epoch: int) -> list[int]:
    sampler = ResumableSampler(length, seed=SEED, num_replicas=1, rank=0)
    sampler.set_epoch(epoch)
    return sampler._order()


segments = st.lists(
    st.tuples(st.integers(1, 6), st.integers(0, 12)),  # (world size, batches per rank)
    min_size=1,
    max_size=5,
)


@settings(max_examples=150, deadline=None)
@given(length=st.integers(1, 60), batch=st.integers(1, 5), plan=segments)
def test_any_sequence_of_world_sizes_sees_each_sample_once_per_epoch_but_the_padding(
    length, batch, plan
) -> None:
    state: dict[str, Any] | None = None
    by_epoch: dict[int, list[int]] = defaultdict(list)
    pads: dict[int, int] = {}  # epoch -> samples its padded last round repeats
    for world, batches in plan:
        before = state or {"epoch": 0, "consumed": 0}
        state, taken = run_segment(length, state, world, batch, batches)
        for epoch, _, sample in taken:
            by_epoch[epoch].append(sample)
        # An epoch whose end this segment dealt: padded to a multiple of this world size.
        current = {state["epoch"]} if state["consumed"] < length else set()
        ends = {e for e, _, _ in taken} - current
        for epoch in ends:
            left = length - (before["consumed"] if epoch == before["epoch"] else 0)
            pads[epoch] = -left % world
    for epoch, samples in by_epoch.items():
        counts = Counter(samples)
        done = sorted(counts)
        if epoch in pads:  # finished: every sample, and only the padding twice
            assert done == list(range(length)), epoch
            assert len(samples) - length == pads[epoch]  # < the world size that dealt the end
        else:  # in progress: the permutation's first samples, each once
            assert len(samples) == len(set(samples)) == state["consumed"]
            assert done == sorted(order(length, epoch)[: len(samples)])


@settings(max_examples=60, deadline=None)
@given(
    steps_per_epoch=st.integers(1, 4),
    micro=st.sampled_from([1, 2]),
    plan=st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 6]), st.integers(0, 5)), max_size=5),
)
def test_with_a_global_batch_every_step_takes_the_same_samples_at_any_world_size(
    steps_per_epoch, micro, plan
) -> None:
    """Stopped at optimizer-step boundaries (after all of a step's micro-batches), on world sizes
    the global batch allows, the samples of each step are those of an uninterrupted run, and an
    epoch that is a multiple of the global batch is seen exactly once: no padding."""
    size = 12 * micro
    length = size * steps_per_epoch
    state: dict[str, Any] | None = None
    steps: list[set[int]] = []
    for world, n in plan:
        gb = GlobalBatch(size, micro_batch=micro, world_size=world)
        for _ in range(n):  # one segment per step keeps the steps apart
            state, taken = run_segment(length, state, world, micro, gb.accumulation_steps)
            steps.append({s for _, _, s in taken})
            assert len(taken) == size
    reference = []
    for epoch in range(len(steps) // steps_per_epoch + 1):
        perm = order(length, epoch)
        reference += [set(perm[i : i + size]) for i in range(0, length, size)]
    assert steps == reference[: len(steps)]


def test_fewer_samples_left_than_ranks_still_gives_every_rank_one() -> None:
    state = {"seed": SEED, "epoch": 0, "consumed": 9, "length": 10}
    dealt = []
    for rank in range(4):
        sampler = ResumableSampler(10, seed=SEED, num_replicas=4, rank=rank)
        sampler.load_state_dict(state)
        dealt.append(list(sampler))
        assert len(sampler) == 1
    assert [len(d) for d in dealt] == [1, 1, 1, 1]  # a rank without one would hang the others
    assert {s for d in dealt for s in d} == {order(10, 0)[9]}
