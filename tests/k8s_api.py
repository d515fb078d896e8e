"""A local stand-in for the Kubernetes API server, for the pod-annotation reporter and the sidecar.

No API server can run on our machines, so these tests point the real ``kubernetes`` client, with
its real in-cluster config, at an HTTPS server on 127.0.0.1 (a self-signed certificate that the
service-account ``ca.crt`` trusts) that records every request. This is not a cluster test: RBAC,
admission and the pod object itself are not exercised.
"""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.polling import wait_until

TOKEN = "sa-token-Zm9v"
"""The token the fake service account holds (a projected token ends without a newline)."""


def assert_pod_patch(
    request: dict[str, Any], *, namespace: str, pod: str, annotations: dict[str, str] | None
) -> None:
    """``request`` is the merge patch of a pod's annotations, with the mounted token."""
    assert request["method"] == "PATCH"
    assert request["path"] == f"/api/v1/namespaces/{namespace}/pods/{pod}"
    assert request["headers"]["Content-Type"] == "application/merge-patch+json"
    assert request["headers"]["Authorization"] == f"bearer {TOKEN}"  # the client's spelling
    if annotations is not None:
        assert request["body"] == {"metadata": {"annotations": annotations}}


class FakeApiServer:
    """Records every PATCH; answers with the next status of `statuses` (then 200)."""

    def __init__(self, cert: Path, key: Path):
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.silent = threading.Event()  # set: hold each answer until `release` is set
        self.release = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer.lock:
                    outer.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "headers": self.headers,  # case-insensitive
                            "body": json.loads(body),
                            "at": time.monotonic(),
                        }
                    )
                    status = outer.statuses.pop(0) if outer.statuses else 200
                if outer.silent.is_set():
                    outer.release.wait(timeout=10)
                answer = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "trainer-0"}}
                if status != 200:
                    answer = {"kind": "Status", "apiVersion": "v1", "code": status}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, n: int, timeout: float = 10.0) -> None:
        """Until `n` requests have arrived (in all)."""
        wait_until(
            lambda: len(self.requests) >= n,
            f"{n} request(s) to the API server",
            timeout=timeout,
            describe=lambda: f"{len(self.requests)} arrived",
        )

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, written to `directory`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class FakeCluster:
    """The server, a service-account dir (token, ca.crt, namespace) and the pod's environment."""

    server: FakeApiServer
    service_account_dir: Path
    env: dict[str, str]


@contextmanager
def fake_cluster(directory: Path, *, namespace: str = "team-a") -> Iterator[FakeCluster]:
    """A running `FakeApiServer` and what a pod would have mounted; the server stops after."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = self_signed(directory)
    sa = directory / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(TOKEN)
    (sa / "ca.crt").write_bytes(cert.read_bytes())
    (sa / "namespace").write_text(namespace)
    server = FakeApiServer(cert, key)
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(server.port),
        "HOSTNAME": "trainer-0",
    }
    try:
        yield FakeCluster(server, sa, env)
    finally:
        server.stop()
