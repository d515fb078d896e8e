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


def _keys_in_order(value, path="state"):
    """Every mapping's keys, in order, by path: dict equality ignores order."""
    if isinstance(value, list | tuple):
        value = dict(enumerate(value))
        found = {}
    elif isinstance(value, dict):
        found = {path: list(value)}
    else:
        return {}
    for k, v in value.items():
        found |= _keys_in_order(v, f"{path}[{k!r}]")
    return found


def test_non_string_keys_tuples_and_the_order_of_keys_survive():
    inner = {"z": 1, 0: (1, 2), (3, "x"): None, 2.5: True, "a": 2}  # not sorted, mixed keys
    state = {"b": inner, "a": {"y": [1, {"d": 0, "c": 1}], "x": 2}, "o": OrderedDict(w=1, b=2)}
    out = _round_trip(state)
    assert out == state
    assert _keys_in_order(out) == _keys_in_order(state)


def test_ordered_dicts_come_back_as_plain_dicts_in_the_same_order():
    # load() returns plain nested dicts (docs/maintainers/design.md); a dict keeps its insertion
    # order, so an OrderedDict such as nn.Module.state_dict() loses nothing but its type.
    state = OrderedDict([("w", 1), ("b", OrderedDict([(2, "two"), (1, "one")])), ("a", 3)])
    out = _round_trip(state)
    assert _keys_in_order(out) == _keys_in_order(state)
    assert type(out) is dict and type(out["b"]) is dict


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
