"""restore() into plain data: dicts and lists are filled in place, live state is loaded strictly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from preemptible import Checkpointer
from preemptible.checkpoint.serialize import flatten, unflatten
from preemptible.errors import StateMismatchError
from tests.helpers import assert_same


@pytest.fixture
def ckpt(tmp_path) -> Checkpointer:
    return Checkpointer(tmp_path / "ckpt")


def _model(seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def _as_read_back(state: Any) -> Any:
    """What ``state`` reads back as: the same encoding save() uses, without the storage."""
    flat = flatten(state)
    return unflatten(flat.tree, flat.arrays.__getitem__)


def test_an_empty_dict_is_filled_with_the_saved_values(ckpt):
    model, model2 = _model(0), _model(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    ckpt.save(4, {"model": model, "optim": opt, "meta": {"epoch": 4, "best": [0.5, 0.25]}})

    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    meta: dict[str, Any] = {}
    weight = model2.weight
    assert ckpt.restore({"model": model2, "optim": opt2, "meta": meta}) == 4
    assert meta == {"epoch": 4, "best": [0.5, 0.25]}
    assert model2.weight is weight
    assert_same(model.state_dict(), model2.state_dict())
    assert_same(opt.state_dict(), opt2.state_dict())


def test_after_restore_the_state_reads_back_as_load_returns(ckpt):
    saved = {
        "model": _model(0),
        "meta": {"epoch": 7, "name": "run", "sub": {"lr": 0.1, 3: "int key"}},
        "history": [1.0, 0.5, 0.25],
        "buffers": [torch.arange(3.0), torch.ones(2, dtype=torch.bfloat16)],
        "np": np.arange(4, dtype=np.int16),
        "pair": (torch.full((2,), 5.0), "tag"),
        "blob": b"\x00\x01",
    }
    ckpt.save(1, saved)
    live = {
        "model": _model(1),
        "meta": {"sub": {}},
        "history": [],
        "buffers": [torch.zeros(3), torch.zeros(2, dtype=torch.bfloat16)],
        "np": np.zeros(1),
        "pair": (torch.zeros(2), ""),
        "blob": None,
    }
    ckpt.restore(live)
    assert_same(ckpt.load(), _as_read_back(live))


def test_containers_and_tensors_keep_their_identity(ckpt):
    ckpt.save(1, {"meta": {"sub": {"a": 1}}, "losses": [0.5, 0.4], "ts": [torch.ones(2)]})
    sub: dict[str, Any] = {}
    meta = {"sub": sub}
    losses: list[float] = []
    tensor = torch.zeros(2)
    ts = [tensor]
    ckpt.restore({"meta": meta, "losses": losses, "ts": ts})
    assert meta["sub"] is sub and sub == {"a": 1}
    assert losses == [0.5, 0.4]
    assert ts[0] is tensor and tensor.tolist() == [1.0, 1.0]


def test_a_tuple_holding_tensors_loads_into_them(ckpt):
    ckpt.save(1, {"pair": (torch.ones(2), 3)})
    tensor = torch.zeros(2)
    state = {"pair": (tensor, 0)}
    ckpt.restore(state)
    assert state["pair"][0] is tensor and tensor.tolist() == [1.0, 1.0]
    assert state["pair"][1] == 3


def test_a_top_level_list_or_tensor_is_restored_in_place(ckpt, tmp_path):
    ckpt.save(1, [torch.ones(2), {"epoch": 2}])
    tensor = torch.zeros(2)
    state: list[Any] = [tensor, {}]
    ckpt.restore(state)
    assert state[0] is tensor and tensor.tolist() == [1.0, 1.0] and state[1] == {"epoch": 2}

    single = Checkpointer(tmp_path / "single")
    single.save(1, torch.arange(3.0))
    live = torch.zeros(3)
    single.restore(live)
    assert live.tolist() == [0.0, 1.0, 2.0]


def _saved_default() -> dict[str, Any]:
    return {"w": torch.ones(2), "meta": {"epoch": 3}, "layers": [_model(0), _model(1)]}


@pytest.mark.parametrize(
    ("live", "needle"),
    [
        pytest.param(
            {"w": torch.zeros(2), "meta": {"epoch": 0, "best": 1.0}, "layers": [_model(2)] * 2},
            r"state\.meta: checkpoint step 1 has no \['best'\]",
            id="plain-key-the-checkpoint-lacks",
        ),
        pytest.param(
            {"w": torch.zeros(2), "meta": {}, "layers": [_model(2)] * 2, "optim": {}},
            r"state: checkpoint step 1 has no \['optim'\]",
            id="top-level-key-the-checkpoint-lacks",
        ),
        pytest.param(
            {"w": torch.zeros(3), "meta": {}, "layers": [_model(2)] * 2},
            r"state\.w: live tensor is \(3,\) torch\.float32, checkpoint step 1 has \(2,\)",
            id="tensor-shape",
        ),
        pytest.param(
            {"w": torch.zeros(2, dtype=torch.float64), "meta": {}, "layers": [_model(2)] * 2},
            r"state\.w: live tensor is \(2,\) torch\.float64",
            id="tensor-dtype",
        ),
        pytest.param(
            {"w": torch.zeros(2), "meta": {"epoch": torch.zeros(1)}, "layers": [_model(2)] * 2},
            r"state\.meta\.epoch: live state is a tensor, checkpoint step 1 has a int",
            id="tensor-where-the-checkpoint-has-a-number",
        ),
        pytest.param(
            {"w": torch.zeros(2), "meta": [], "layers": [_model(2)] * 2},
            r"state\.meta: live state is a list, checkpoint step 1 has a dict",
            id="list-where-the-checkpoint-has-a-dict",
        ),
        pytest.param(
            {"w": torch.zeros(2), "meta": {}, "layers": [_model(2)]},
            r"state\.layers: live list has 1 items holding tensors or stateful objects",
            id="list-of-modules-of-another-length",
        ),
    ],
)
def test_a_mismatch_raises_and_leaves_the_live_state_untouched(ckpt, live, needle):
    ckpt.save(1, _saved_default())
    before = _as_read_back(live)
    with pytest.raises(StateMismatchError, match=needle):
        ckpt.restore(live)
    assert_same(before, _as_read_back(live))


def test_an_object_without_load_state_dict_is_not_silently_replaced(ckpt):
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def state_dict(self) -> dict[str, int]:
            return {"n": self.n}

    counter = Counter()
    counter.n = 5
    ckpt.save(1, {"counter": counter})
    state = {"counter": Counter()}
    with pytest.raises(StateMismatchError, match=r"state\.counter: cannot load into .*Counter"):
        ckpt.restore(state)
    assert isinstance(state["counter"], Counter)


@pytest.mark.parametrize("target", [5, (torch.zeros(1),), "text"], ids=["int", "tuple", "str"])
def test_a_target_that_cannot_be_loaded_in_place_is_refused(ckpt, target):
    ckpt.save(1, (torch.ones(1),))
    with pytest.raises(StateMismatchError, match="use load"):
        ckpt.restore(target)
