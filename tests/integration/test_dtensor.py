"""Sharded tensors (DTensor) through torch.distributed.checkpoint, inside our commit protocol:
written by 2 real torchrun ranks, restored on 1 and on 2, verified, and never unpickled unsafely."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest
import torch

from preemptible import Checkpointer
from preemptible.errors import CheckpointCorruptedError, CheckpointFormatError
from tests.s3servers import free_port

SCRIPT = Path(__file__).parent / "scripts" / "dtensor_ckpt.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def torchrun(nproc: int, *args: str) -> str:
    for attempt in range(2):
        result = _run(nproc, *args)
        # torch/gloo can abort in process teardown ("terminate called without an active
        # exception") after the work is done; that is not ours to test, so one retry.
        if result.returncode == 0 or "terminate called" not in result.stderr or attempt:
            break
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _run(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            TORCHRUN,
            "--nnodes=1",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            str(SCRIPT),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dtensor") / "ckpt"
    torchrun(2, "save", str(root))
    return root


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_two_rank_sharded_checkpoint_restores_on_one_and_on_two_ranks(saved, tmp_path, nproc):
    copy = tmp_path / "ckpt"
    shutil.copytree(saved, copy)
    out = torchrun(nproc, "restore", str(copy))
    assert out.count("restored its shard") == nproc


def test_dcp_files_are_in_the_manifest_and_verified(saved, tmp_path):
    ckpt = Checkpointer(saved)
    info = ckpt.latest()
    manifest = json.loads((saved / "step-000000000001" / "manifest.json").read_text())
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= set(manifest["files"])
    assert info.world_size == 2 and ckpt.verify(1).ok
    full = ckpt.load(1)["w"]  # no process group: the full tensor, assembled from both shards
    assert torch.equal(full, torch.arange(16.0).reshape(8, 2))

    copy = tmp_path / "ckpt"
    shutil.copytree(saved, copy)
    shard = copy / "step-000000000001" / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    damaged = Checkpointer(copy)
    assert any("dcp/__1_0.distcp" in p for p in damaged.verify(1).problems)
    with pytest.raises(CheckpointCorruptedError, match=r"__1_0\.distcp"):
        damaged.load(1)


class _Exploit:
    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def test_a_malicious_dcp_metadata_pickle_is_refused_and_runs_nothing(saved, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(saved, copy)
    step_dir = copy / "step-000000000001"
    sentinel = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(sentinel))
    (step_dir / "dcp" / ".metadata").write_bytes(payload)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"]["dcp/.metadata"] = {
        "size": len(payload),
        "crc32c": f"{crc32c.crc32c(payload):08x}",
    }
    (step_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointFormatError, match="Nothing was executed"):
        Checkpointer(copy).load(1)
    assert not sentinel.exists()
