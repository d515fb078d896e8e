"""Loading never unpickles: planted pickles raise a clear error and execute nothing."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import crc32c
import pytest
import torch

from preemptible import Checkpointer
from preemptible.errors import CheckpointFormatError


class _Exploit:
    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def _rewrite(step_dir: Path, name: str, payload: bytes) -> None:
    """Replace a file and fix up the manifest so that checksums do NOT stop the attack."""
    (step_dir / name).write_bytes(payload)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"][name] = {"size": len(payload), "crc32c": f"{crc32c.crc32c(payload):08x}"}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def planted(tmp_path):
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, {"w": torch.ones(4)})
    sentinel = tmp_path / "pwned"
    payload = pickle.dumps({"w": _Exploit(sentinel)})
    assert not sentinel.exists()
    return ckpt, tmp_path / "ckpt" / "step-000000000001", payload, sentinel


def test_a_pickle_in_place_of_the_state_index_is_refused(planted):
    ckpt, step_dir, payload, sentinel = planted
    _rewrite(step_dir, "state.json", payload)
    with pytest.raises(CheckpointFormatError, match="not a state index"):
        ckpt.load(1)
    assert not sentinel.exists()


def test_a_torch_save_file_as_array_data_is_read_as_bytes_never_unpickled(planted, tmp_path):
    ckpt, step_dir, _payload, sentinel = planted
    torch.save({"w": _Exploit(sentinel)}, tmp_path / "evil.pt")
    evil = (tmp_path / "evil.pt").read_bytes()
    _rewrite(step_dir, "data-00000.bin", evil)
    index = json.loads((step_dir / "state.json").read_text())
    index["arrays"][0].update(nbytes=len(evil), dtype="uint8", shape=[len(evil)])
    _rewrite(step_dir, "state.json", json.dumps(index).encode())
    loaded = ckpt.load(1)
    assert loaded["w"].dtype == torch.uint8 and bytes(loaded["w"].numpy()) == evil
    assert not sentinel.exists()


@pytest.mark.parametrize(
    "node",
    [
        {"__pt__": "pickle", "data": "gASV"},
        {"__pt__": "object", "module": "os", "name": "system"},
    ],
)
def test_unknown_node_types_in_the_state_tree_are_refused(planted, node):
    ckpt, step_dir, _, _sentinel = planted
    index = json.loads((step_dir / "state.json").read_text())
    index["tree"]["evil"] = node
    _rewrite(step_dir, "state.json", json.dumps(index).encode())
    with pytest.raises(CheckpointFormatError, match="Nothing was executed"):
        ckpt.load(1)


def test_an_object_dtype_array_is_refused(planted):
    ckpt, step_dir, _, _ = planted
    index = json.loads((step_dir / "state.json").read_text())
    index["arrays"][0].update(kind="numpy", dtype="|O", shape=[2], nbytes=16)
    _rewrite(step_dir, "state.json", json.dumps(index).encode())
    with pytest.raises(CheckpointFormatError):
        ckpt.load(1)


def test_an_array_entry_cannot_point_outside_its_checkpoint(planted):
    ckpt, step_dir, _, _ = planted
    index = json.loads((step_dir / "state.json").read_text())
    index["arrays"][0]["file"] = "../../etc/passwd"
    _rewrite(step_dir, "state.json", json.dumps(index).encode())
    with pytest.raises(CheckpointFormatError, match="outside"):
        ckpt.load(1)
