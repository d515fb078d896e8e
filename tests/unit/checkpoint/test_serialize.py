from collections import OrderedDict

import numpy as np
import pytest
import torch

from preemptible.checkpoint.serialize import TAG, flatten, unflatten
from preemptible.errors import CheckpointFormatError, UnsupportedStateError


def _round_trip(state):
    flat = flatten(state)
    return unflatten(flat.tree, flat.arrays.__getitem__)


def test_user_dicts_that_contain_the_tag_key_round_trip_unambiguously():
    state = {"x": {TAG: "tensor", "id": 0}, "t": torch.ones(1)}
    out = _round_trip(state)
    assert out["x"] == {TAG: "tensor", "id": 0}


def test_non_string_keys_tuples_and_ordered_dicts_survive():
    state = OrderedDict([("a", {0: (1, 2), (3, "x"): None, 2.5: True})])
    out = _round_trip(state)
    assert out == {"a": {0: (1, 2), (3, "x"): None, 2.5: True}}


def test_objects_with_state_dict_are_stored_as_their_state_dict():
    model = torch.nn.Linear(3, 2)
    out = _round_trip({"m": model})
    assert set(out["m"]) == {"weight", "bias"} and torch.equal(out["m"]["weight"], model.weight)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (object(), "builtins.object"),
        ({1, 2}, "builtins.set"),
        (np.array([object()], dtype=object), "numpy array of Python objects"),
        (torch.ones(2).to_sparse(), "sparse"),
        (torch.empty(2, device="meta"), "meta tensor"),
    ],
)
def test_unsupported_values_name_their_path_and_the_fix(value, needle):
    with pytest.raises(UnsupportedStateError) as err:
        flatten({"outer": [0, {"inner": value}]})
    assert "state.outer[1].inner" in str(err.value) and needle in str(err.value)


def test_unknown_tags_are_a_format_error():
    with pytest.raises(CheckpointFormatError, match="unknown node type"):
        unflatten({TAG: "lambda"}, lambda i: None)
