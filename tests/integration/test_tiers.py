"""Two tiers against a real S3 endpoint (moto's server over HTTP): a local directory first,
then the bucket. Restores across tiers, a corrupt local copy, another node, and a SIGKILL in
the middle of an upload."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from preemptible import Checkpointer
from preemptible.checkpoint.manifest import MANIFEST_NAME, Manifest
from preemptible.errors import PreemptibleWarning
from tests.conftest import Root, s3_root
from tests.helpers import assert_same, make_state
from tests.integration.tiers_child import big_state
from tests.polling import wait_until

ROOT_DIR = Path(__file__).resolve().parents[2]
MIB = 32  # eight data files of 4 MiB
PAUSE = 2.0  # seconds after each uploaded file (`tiers_child`): the kill lands mid-upload


@pytest.fixture
def remote(moto_server) -> Root:
    root = s3_root(moto_server)
    root.fs.mkdir(root.path.split("/")[0])  # the bucket
    return root


def two_tier(remote: Root, local: Path, **kwargs) -> Checkpointer:
    return Checkpointer(remote.url, local=local, storage_options=remote.storage_options, **kwargs)


def step_dir(step: int) -> str:
    return f"step-{step:012d}"


def test_save_commits_locally_at_once_and_remotely_after_wait_durable(remote, tmp_path):
    ckpt = two_tier(remote, tmp_path / "local", shard_bytes=64 << 10)
    ckpt.save(5, make_state(5, mib=0.4))
    assert ckpt.local_step == 5
    local_dir = tmp_path / "local" / step_dir(5)
    assert (local_dir / MANIFEST_NAME).exists()
    assert ckpt.wait_durable(timeout=60)
    assert ckpt.durable_step == 5
    remote_dir = f"{remote.path}/{step_dir(5)}"
    local_manifest = (local_dir / MANIFEST_NAME).read_bytes()
    assert remote.fs.cat_file(f"{remote_dir}/{MANIFEST_NAME}") == local_manifest
    manifest = Manifest.from_bytes(local_manifest)
    assert len(manifest.files) > 3
    for name in manifest.files:  # the very bytes, under the very names
        assert remote.fs.cat_file(f"{remote_dir}/{name}") == (local_dir / name).read_bytes()
    report = ckpt.remote.verify(5)
    assert report.ok and report.files_checked == len(manifest.files)
    ckpt.close()


def test_restore_takes_local_on_a_tie_and_the_newest_across_tiers(remote, tmp_path):
    ckpt = two_tier(remote, tmp_path / "a")
    ckpt.save(1, make_state(1))
    ckpt.wait_durable(timeout=60)
    state = make_state(0)
    assert ckpt.restore(state) == 1
    assert_same(state, make_state(1))
    assert ckpt.cost.restore_local.count == 1 and ckpt.cost.restore_remote.count == 0
    # another node saves a newer step: this node's local copy is older, the remote wins
    other = two_tier(remote, tmp_path / "b")
    other.save(2, make_state(2))
    other.close()
    state = make_state(0)
    assert ckpt.restore(state) == 2
    assert_same(state, make_state(2))
    assert ckpt.cost.restore_remote.count == 1
    assert [i.step for i in ckpt.list()] == [1, 2]
    assert ckpt.list()[0].url.startswith(str(tmp_path / "a"))
    ckpt.close()


def test_a_fresh_node_restores_from_the_remote(remote, tmp_path):
    first = two_tier(remote, tmp_path / "node1")
    first.save(3, make_state(3))
    first.close()  # waits for the upload
    fresh = two_tier(remote, tmp_path / "node2")
    assert fresh.local_step is None
    state = make_state(0)
    assert fresh.restore(state) == 3
    assert_same(state, make_state(3))
    assert fresh.cost.restore_remote.count == 1
    fresh.close()


def test_a_corrupt_local_copy_falls_back_to_the_remote_with_a_warning(remote, tmp_path):
    ckpt = two_tier(remote, tmp_path / "local")
    ckpt.save(4, make_state(4, mib=0.2))
    ckpt.wait_durable(timeout=60)
    local_dir = tmp_path / "local" / step_dir(4)
    data = sorted(local_dir.glob("data-*.bin"))[0]
    raw = bytearray(data.read_bytes())
    raw[100:108] = bytes(b ^ 0xFF for b in raw[100:108])  # really flip bytes on disk
    data.write_bytes(bytes(raw))
    state = make_state(0, mib=0.2)
    with pytest.warns(PreemptibleWarning, match="skipping the local copy of checkpoint step 4"):
        assert ckpt.restore(state) == 4
    assert_same(state, make_state(4, mib=0.2))
    assert ckpt.cost.restore_remote.count == 1
    ckpt.close()


def test_sigkill_mid_upload_leaves_no_torn_remote_step_and_the_next_start_uploads(remote, tmp_path):
    local = tmp_path / "local"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.tiers_child",
            remote.url,
            str(local),
            json.dumps(remote.storage_options),
            str(MIB),
            str(PAUSE),
        ],
        cwd=ROOT_DIR,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "committed"
        step_path = f"{remote.path}/{step_dir(0)}"

        def uploading() -> bool:
            remote.fs.invalidate_cache()
            names = [p.rsplit("/", 1)[-1] for p in remote.fs.find(step_path)]
            assert MANIFEST_NAME not in names, "the upload finished before the kill"
            return any(n.startswith("data-") for n in names)

        wait_until(uploading, "the child to have uploaded a first data file", timeout=60)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    remote.fs.invalidate_cache()
    assert remote.fs.find(step_path), "the kill came after some files were uploaded"
    observer = remote.checkpointer()
    assert observer.list() == []  # the torn upload is invisible
    assert observer.latest() is None
    # the next start on the same local directory restores the local copy and uploads it
    again = two_tier(remote, local)
    state = {f"w{i}": t.clone().zero_() for i, t in enumerate(big_state(MIB).values())}
    assert again.restore(state) == 0
    assert again.cost.restore_local.count == 1
    assert_same(state, big_state(MIB))
    assert again.wait_durable(timeout=120)
    assert again.durable_step == 0
    assert observer.verify(0).ok
    again.close()
