"""Shared fixtures: checkpoint roots on every backend we support, real S3 servers included."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pytest

from tests.s3servers import S3Server, start_moto, start_seaweedfs


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as at a terminal. A run started in the background (``make test &``) ignores
    SIGINT, and every process a test starts would inherit that: a CLI told to stop by Ctrl-C
    would sleep through it. A caught signal goes back to its default at ``exec``; an ignored
    one stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[S3Server]:
    server = start_moto()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs_server() -> Iterator[S3Server]:
    server = start_seaweedfs()
    yield server
    server.stop()


@pytest.fixture(params=["moto", "seaweedfs"])
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    return request.getfixturevalue(f"{request.param}_server")


@dataclass
class Root:
    """A fresh checkpoint root on one backend, with raw fsspec access for tampering."""

    backend: str
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return fsspec.core.url_to_fs(self.url, **self.storage_options)[0]

    @property
    def path(self) -> str:
        return fsspec.core.url_to_fs(self.url, **self.storage_options)[1]

    def checkpointer(self, **kwargs: Any):
        from preemptible import Checkpointer

        return Checkpointer(self.url, storage_options=self.storage_options, **kwargs)


def s3_root(server: S3Server) -> Root:
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    return Root(f"s3-{server.name}", f"s3://{bucket}/run", server.storage_options())


@pytest.fixture(params=["local", "memory", "s3-moto", "s3-seaweedfs"])
def root(request: pytest.FixtureRequest, tmp_path) -> Root:
    backend = request.param
    if backend == "local":
        return Root("local", str(tmp_path / "ckpt"))
    if backend == "memory":
        return Root("memory", f"memory://preemptible-tests/{uuid.uuid4().hex}")
    server = request.getfixturevalue(f"{backend.removeprefix('s3-')}_server")
    return s3_root(server)


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 4 MiB tmpfs: ENOSPC from the kernel, not from a wrapper."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    probe = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True
    )
    if probe.returncode != 0:
        reason = f"cannot mount a tmpfs here (needs root): {probe.stderr.decode().strip()}"
        if os.environ.get("CI"):  # CI runs as root: a skip there would hide the real-disk tests
            pytest.fail(reason)
        pytest.skip(reason)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)
