"""Three clouds' metadata servers, small and real: stdlib HTTP servers on 127.0.0.1.

Each implements the part of its cloud's API that `preemptible.runtime.notices` reads, as the
cloud documents it, rejections included:

- `FakeImds`, AWS IMDSv2: ``PUT /latest/api/token`` (400 without a valid
  ``X-aws-ec2-metadata-token-ttl-seconds``), reads with ``X-aws-ec2-metadata-token`` (401
  without a live token, IMDSv2 required), tokens that expire after their TTL,
  ``spot/instance-action`` and ``events/recommendations/rebalance`` (404 until scheduled);
- `FakeGceMetadata`, Google: ``Metadata-Flavor: Google`` asked (403 without) and answered,
  ``preempted`` and ``maintenance-event`` with ETags, ``wait_for_change=true`` hanging until
  the ETag differs from ``last_etag`` or ``timeout_sec`` passes;
- `FakeAzureImds`, Azure Scheduled Events: ``Metadata: true`` asked (400 without), the events
  document with its ``DocumentIncarnation``, ``StartRequests`` acknowledgements (recorded, with
  what ``on_ack`` returned at that moment), ``compute/name``.

A test schedules a notice through the control methods (`FakeImds.interrupt`, ...), and breaks
a server with `fault` (``slow``, ``garbage``, ``error``) or `stop` (down: the port refuses).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

GARBAGE = "<html><body><h1>502 Bad Gateway</h1></body></html>"


@dataclass
class Request:
    """What a server saw: method, path, query, headers (lower-case names) and the status sent."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    status: int = 0
    body: bytes = b""


@dataclass
class Fault:
    """How a server misbehaves: ``slow`` (answers after `seconds`), ``garbage`` (200 with
    `body`, no cloud headers), ``error`` (500)."""

    kind: str
    seconds: float = 0.0
    body: str = GARBAGE


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.owner._dispatch(self, "GET")

    def do_PUT(self) -> None:
        self.server.owner._dispatch(self, "PUT")

    def do_POST(self) -> None:
        self.server.owner._dispatch(self, "POST")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: MetadataServer


@dataclass
class Reply:
    status: int
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class MetadataServer:
    """The shared part: a threaded server on a free port of 127.0.0.1, a request log, faults."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.host = f"127.0.0.1:{self.port}"
        self.requests: list[Request] = []
        self.fault: Fault | None = None
        self.cond = threading.Condition()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self._up = True

    def stop(self) -> None:
        """Down: stop serving and close the listening socket (connections are refused)."""
        if self._up:
            self._up = False
            self._server.shutdown()
            self._server.server_close()
            with self.cond:
                self.cond.notify_all()

    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in handler.headers.items()}
        request = Request(method, split.path, query, headers, body=body)
        self.requests.append(request)
        fault = self.fault
        if fault is not None and fault.kind == "slow":
            time.sleep(fault.seconds)
        if fault is not None and fault.kind == "garbage":
            reply = Reply(200, fault.body, {"Content-Type": "text/html"})
        elif fault is not None and fault.kind == "error":
            reply = Reply(500, "Internal Server Error")
        else:
            reply = self.handle(request)
        request.status = reply.status
        data = reply.body.encode()
        try:
            handler.send_response(reply.status)
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:
            pass  # the client gave up (a timeout); nothing to answer

    def handle(self, request: Request) -> Reply:
        raise NotImplementedError

    def count(self, method: str, path: str, status: int | None = None) -> int:
        """How many requests of ``method`` to ``path`` (with ``status``, if given) came."""
        return sum(
            1
            for r in list(self.requests)
            if r.method == method and r.path == path and (status is None or r.status == status)
        )


# --- AWS -----------------------------------------------------------------------------------------


def iso_utc(at: float) -> str:
    """Epoch seconds as AWS writes times: ``2026-12-04T10:00:00Z``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeImds(MetadataServer):
    """AWS's instance metadata service with IMDSv2 required."""

    TOKEN = "/latest/api/token"
    ACTION = "/latest/meta-data/spot/instance-action"
    REBALANCE = "/latest/meta-data/events/recommendations/rebalance"

    def __init__(self) -> None:
        super().__init__()
        self.tokens: dict[str, float] = {}  # token -> monotonic expiry
        self.action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None

    def interrupt(self, action: str = "terminate", *, in_s: float = 120.0) -> float:
        """Schedule a spot interruption ``in_s`` from now; returns its time (whole seconds)."""
        at = float(int(time.time() + in_s))
        self.action = {"action": action, "time": iso_utc(at)}
        return at

    def recommend_rebalance(self) -> None:
        self.rebalance = {"noticeTime": iso_utc(time.time())}

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def handle(self, request: Request) -> Reply:
        if request.method == "PUT" and request.path == self.TOKEN:
            return self._token(request)
        if request.method != "GET":
            return Reply(405)
        token = request.headers.get("x-aws-ec2-metadata-token")
        if token is None or self.tokens.get(token, 0.0) < time.monotonic():
            return Reply(401, "Unauthorized")
        if request.path == self.ACTION:
            return self._document(self.action)
        if request.path == self.REBALANCE:
            return self._document(self.rebalance)
        return Reply(404, "Not Found")

    def _token(self, request: Request) -> Reply:
        if "x-forwarded-for" in request.headers:
            return Reply(403, "Forbidden")
        raw = request.headers.get("x-aws-ec2-metadata-token-ttl-seconds", "")
        if not raw.isdigit() or not 1 <= int(raw) <= 21600:
            return Reply(400, "Bad Request")
        token = uuid.uuid4().hex
        self.tokens[token] = time.monotonic() + int(raw)
        return Reply(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": raw})

    @staticmethod
    def _document(document: dict[str, str] | None) -> Reply:
        if document is None:
            return Reply(404, "Not Found")
        return Reply(200, json.dumps(document), {"Content-Type": "text/plain"})


# --- Google --------------------------------------------------------------------------------------


class FakeGceMetadata(MetadataServer):
    """Compute Engine's metadata server: the two keys a preemptible VM watches."""

    PREFIX = "/computeMetadata/v1/instance/"

    def __init__(self) -> None:
        super().__init__()
        self.values = {"preempted": "FALSE", "maintenance-event": "NONE"}
        self.versions = {key: 0 for key in self.values}

    def set(self, key: str, value: str) -> None:
        """Change a key (``preempted`` to ``TRUE``...): hanging waits answer at once."""
        with self.cond:
            self.values[key] = value
            self.versions[key] += 1
            self.cond.notify_all()

    def etag(self, key: str) -> str:
        seed = f"{key}:{self.versions[key]}:{self.values[key]}".encode()
        return hashlib.sha256(seed).hexdigest()[:16]

    def handle(self, request: Request) -> Reply:
        if request.headers.get("metadata-flavor") != "Google":
            return Reply(403, "Missing required header: Metadata-Flavor", {"Content-Type": "text"})
        key = request.path.removeprefix(self.PREFIX)
        if request.method != "GET" or not request.path.startswith(self.PREFIX):
            return Reply(404, "Not Found")
        if key not in self.values:
            return Reply(404, "Not Found")
        if request.query.get("wait_for_change") == "true":
            timeout = float(request.query.get("timeout_sec", "300"))
            with self.cond:  # without last_etag: until the next change
                last = request.query.get("last_etag") or self.etag(key)
                self.cond.wait_for(lambda: not self._up or self.etag(key) != last, timeout=timeout)
        with self.cond:
            value, etag = self.values[key], self.etag(key)
        headers = {"Metadata-Flavor": "Google", "ETag": etag, "Content-Type": "application/text"}
        return Reply(200, value, headers)


# --- Azure ---------------------------------------------------------------------------------------


@dataclass
class Ack:
    """One ``StartRequests`` POST: when, for which events, and what ``on_ack`` said then."""

    at: float
    event_ids: list[str]
    seen: Any


class FakeAzureImds(MetadataServer):
    """Azure's Instance Metadata Service: Scheduled Events and the VM's name."""

    EVENTS = "/metadata/scheduledevents"
    NAME = "/metadata/instance/compute/name"

    def __init__(self, vm_name: str = "trainer-vm-0", on_ack: Callable[[], Any] | None = None):
        super().__init__()
        self.vm_name = vm_name
        self.on_ack = on_ack
        self.incarnation = 1
        self.events: list[dict[str, Any]] = []
        self.acks: list[Ack] = []

    def schedule(
        self,
        event_type: str = "Preempt",
        *,
        resources: list[str] | None = None,
        in_s: float = 30.0,
        description: str = "",
    ) -> tuple[str, float]:
        """Add an event on ``resources`` (default: this VM) ``in_s`` from now; returns its id
        and NotBefore (whole seconds)."""
        at = float(int(time.time() + in_s))
        event_id = str(uuid.uuid4()).upper()
        self.events.append(
            {
                "EventId": event_id,
                "EventType": event_type,
                "ResourceType": "VirtualMachine",
                "Resources": [self.vm_name] if resources is None else resources,
                "EventStatus": "Scheduled",
                "NotBefore": format_datetime(datetime.fromtimestamp(at, UTC), usegmt=True),
                "Description": description,
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
        )
        self.incarnation += 1
        return event_id, at

    def handle(self, request: Request) -> Reply:
        if request.headers.get("metadata", "").lower() != "true":
            return self._error(400, "Bad request. Required metadata header not specified")
        if "api-version" not in request.query:
            return self._error(400, "Bad request. api-version was not specified in the request")
        if request.path == self.NAME and request.method == "GET":
            if request.query.get("format") != "text":
                return Reply(200, json.dumps(self.vm_name), {"Content-Type": "application/json"})
            return Reply(200, self.vm_name, {"Content-Type": "text/plain"})
        if request.path != self.EVENTS:
            return self._error(404, "Not found")
        if request.method == "GET":
            document = {"DocumentIncarnation": self.incarnation, "Events": self.events}
            return Reply(200, json.dumps(document), {"Content-Type": "application/json"})
        if request.method == "POST":
            return self._start(request)
        return self._error(405, "Method not allowed")

    def _start(self, request: Request) -> Reply:
        try:
            starts = json.loads(request.body)["StartRequests"]
            ids = [str(s["EventId"]) for s in starts]
        except (ValueError, KeyError, TypeError):
            return self._error(400, "Bad request. StartRequests is malformed")
        self.acks.append(Ack(time.time(), ids, self.on_ack() if self.on_ack else None))
        for event in self.events:
            if event["EventId"] in ids:
                event["EventStatus"], event["NotBefore"] = "Started", ""
        self.incarnation += 1
        return Reply(200, "")

    @staticmethod
    def _error(status: int, message: str) -> Reply:
        return Reply(status, json.dumps({"error": message}), {"Content-Type": "application/json"})
