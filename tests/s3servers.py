"""Real S3 endpoints on 127.0.0.1 for the tests: moto's server mode and SeaweedFS.

Both are started as separate processes and spoken to over HTTP by s3fs, exactly as a training
job would speak to S3. They are stopped by PID at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.polling import wait_until

KEY = "testing"
SECRET = "testing"


@dataclass
class S3Server:
    name: str
    endpoint: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def storage_options(self) -> dict[str, object]:
        return {
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"endpoint_url": self.endpoint},
            "use_listings_cache": False,
            # Each test gets a fresh filesystem object: fsspec caches instances by arguments.
            "skip_instance_cache": True,
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise RuntimeError(
            f"{name} not found next to {sys.executable}; run `make test` to install it"
        )
    return str(path)


def _wait_ready(server: S3Server, timeout: float = 60.0) -> None:
    import s3fs

    last: list[Exception] = []

    def stores() -> bool:
        if server.process.poll() is not None:
            log = (server.workdir / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}:\n{log}")
        try:
            urllib.request.urlopen(server.endpoint, timeout=1).close()
        except urllib.error.HTTPError:
            pass  # any HTTP answer means the listener is up
        except OSError as e:
            last[:] = [e]
            return False
        try:  # SeaweedFS answers HTTP before its volume server can store anything
            fs = s3fs.S3FileSystem(**server.storage_options())  # type: ignore[arg-type]
            fs.mkdir("ready-probe")
            fs.pipe_file("ready-probe/x", b"x")
            fs.rm("ready-probe", recursive=True)
            return True
        except Exception as e:
            last[:] = [e]
            return False

    wait_until(
        stores,
        f"{server.name} at {server.endpoint} to store an object",
        timeout=timeout,
        every=0.1,
        describe=lambda: f"last error: {last[0]!r}" if last else "no error",
    )


def start_moto() -> S3Server:
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="moto-"))
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(
        [_bin("moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET},
    )
    server = S3Server("moto", f"http://127.0.0.1:{port}", proc, workdir)
    _wait_ready(server)
    return server


def start_seaweedfs() -> S3Server:
    workdir = Path(tempfile.mkdtemp(prefix="seaweedfs-"))
    ports = {
        name: free_port()
        for name in (
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
        )
    }
    args = [f"-{name}={port}" for name, port in ports.items()]
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(
        [
            _bin("weed"),
            "mini",
            f"-dir={workdir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env={**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET},
    )
    server = S3Server("seaweedfs", f"http://127.0.0.1:{ports['s3.port']}", proc, workdir)
    try:
        _wait_ready(server)
    except BaseException:
        server.stop()
        raise
    return server
