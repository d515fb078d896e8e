"""`GlobalBatch`: accumulation from the world size, and the loss scaling that keeps a step the
mean gradient over the global batch whatever the number of ranks."""

from __future__ import annotations

import pytest
import torch

from preemptible import ConfigError, GlobalBatch


@pytest.mark.parametrize(
    ("size", "micro", "world", "accumulation"),
    [(64, 4, 4, 4), (64, 4, 2, 8), (64, 4, 16, 1), (12, 1, 3, 4), (15, 3, 5, 1)],
    ids=["4-ranks", "2-ranks", "one-pass", "three-ranks", "five-ranks"],
)
def test_accumulation_is_the_global_batch_over_micro_batch_times_world(
    size, micro, world, accumulation
) -> None:
    gb = GlobalBatch(size, micro_batch=micro, world_size=world)
    assert gb.accumulation_steps == accumulation
    assert gb.per_rank * world == size


def test_the_world_size_comes_from_the_environment_without_torch_distributed(
    monkeypatch,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert GlobalBatch(16, micro_batch=2).accumulation_steps == 4
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert GlobalBatch(16, micro_batch=2).world_size == 1


def test_a_global_batch_the_ranks_cannot_split_says_which_sizes_work() -> None:
    with pytest.raises(ConfigError) as error:
        GlobalBatch(24, micro_batch=4, world_size=4)
    message = str(error.value)
    assert "24 is not a multiple of 4 x 4 = 16" in message
    assert "world sizes that work with micro_batch 4: 1, 2, 3, 6" in message
    assert "micro-batches that work on 4 ranks: 1, 2, 3, 6" in message


@pytest.mark.parametrize(
    "kwargs",
    [{"size": 0}, {"micro_batch": -1}, {"world_size": 0}, {"size": 8.0}, {"micro_batch": True}],
    ids=["zero-size", "negative-micro", "zero-world", "float", "bool"],
)
def test_sizes_must_be_positive_integers(kwargs) -> None:
    options = {"size": 8, "micro_batch": 2, "world_size": 2, **kwargs}
    size = options.pop("size")
    with pytest.raises(ConfigError, match="must be a positive integer"):
        GlobalBatch(size, **options)


def accumulated_gradient(x: torch.Tensor, y: torch.Tensor, world: int) -> torch.Tensor:
    """What DDP on `world` ranks leaves in the weight after a step's micro-batches: each rank's
    sum of scaled micro-batch gradients, averaged over the ranks."""
    gb = GlobalBatch(len(x), micro_batch=2, world_size=world)
    per_rank = []
    for rank in range(world):
        w = torch.zeros(3, dtype=torch.float64, requires_grad=True)
        mine = torch.arange(rank, len(x), world)  # dealt like the sampler deals
        for i in range(gb.accumulation_steps):
            idx = mine[i * gb.micro_batch : (i + 1) * gb.micro_batch]
            loss = ((x[idx] @ w - y[idx]) ** 2).sum()
            gb.scale(loss).backward()
        per_rank.append(w.grad)
    return torch.stack(per_rank).mean(0)


def test_scaled_micro_batch_sums_give_the_global_batch_mean_gradient_on_any_world() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 3, generator=g, dtype=torch.float64)
    y = torch.randn(24, generator=g, dtype=torch.float64)
    w = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    ((x @ w - y) ** 2).mean().backward()
    for world in (1, 2, 3, 4, 6, 12):
        got = accumulated_gradient(x, y, world)
        torch.testing.assert_close(got, w.grad, rtol=1e-12, atol=0)
