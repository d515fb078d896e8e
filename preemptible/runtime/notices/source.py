"""What every cloud notice source shares: daemon threads that poll a metadata server, back off,
and log one warning per outage.

A cloud tells a VM it is about to be taken away through a metadata server that only the VM can
reach (AWS spot interruptions, Google's preemption and maintenance keys, Azure Scheduled
Events). A source watches one of them and hands the first notice it finds to a callback, which
records it on the `PreemptionGuard` exactly as a signal would be: the loop acts at its next
step boundary, where the ranks agree on the stop step.

Why threads and not the loop. A poll is a network request; at the step boundary it would add
its latency to every step, and a metadata server that hangs would hang training. A daemon
thread costs nothing per step and never holds the exit.

Why every failure is swallowed. The notices are a best-effort early warning: the cloud still
sends its ACPI shutdown (SIGTERM) afterwards, and the signals still work. A metadata server
that is slow, down, refuses, or answers garbage must therefore never stop training nor raise
into it: the failure is logged once (a warning when the outage starts, an info line when it
ends), and the thread retries with a back-off that doubles up to a minute.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import httpx

log = logging.getLogger("preemptible")

DEFAULT_POLL_S = 5.0
"""Seconds between two polls: what AWS recommends for its spot interruption notice."""
DEFAULT_TIMEOUT_S = 2.0
"""One request to a metadata server: it runs on the VM's host, so it answers in milliseconds."""
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudNotice:
    """A notice a cloud's metadata server gave: save and exit by `deadline`."""

    cloud: str
    """Which source saw it (``aws``, ``gcp``, ``azure``)."""
    reason: str
    """What the cloud said, in words (the log and `PreemptionGuard.reason` show it)."""
    deadline: float | None
    """When the VM goes away (epoch seconds); None when the cloud gave no time."""
    event_id: str | None = None
    """The cloud's id of the event, where it has one (Azure acknowledges by it)."""


class MetadataAnswerError(ValueError):
    """A metadata server answered, but not what its API documents (a status, a body).

    Never leaves a source's thread: it counts as an outage, like a refused connection.
    """


Poll = Callable[[], CloudNotice | None]
"""One poll of one key: a notice, None when there is none, or an exception (an outage)."""


class NoticeSource(ABC):
    """One cloud's metadata server, watched by daemon threads (one per key it polls).

    Subclasses say what to poll (`watches`) and how to tell the server is there (`probe`);
    this class runs the threads, the back-off and the outage log, and delivers the first
    notice once. Started and closed by `preemptible.runtime.notices.CloudNotices`, on the
    rank that polls for its node (local rank 0).

    Args:
        base_url: the metadata server, e.g. ``http://169.254.169.254``.
        poll_s: seconds between two polls of a key.
        timeout_s: timeout of one request (a slower answer is an outage).
        clock: wall-clock source (epoch seconds) for deadlines; tests pass a fake one.
        transport: an httpx transport, for tests.
    """

    cloud: ClassVar[str]

    def __init__(
        self,
        base_url: str,
        *,
        poll_s: float = DEFAULT_POLL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self._clock = clock
        # trust_env=False: an HTTP(S)_PROXY of the job must never route metadata requests
        # (a proxy cannot reach the link-local address, and it would see the AWS token).
        self._client = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 1.0)),
            transport=transport,
            trust_env=False,
        )
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._delivered: CloudNotice | None = None
        self._threads: list[threading.Thread] = []

    # --- what subclasses say -------------------------------------------------------------------

    @abstractmethod
    def watches(self) -> Mapping[str, Poll]:
        """The keys to poll, each by its own thread: name (for the log) -> one poll."""

    @abstractmethod
    def probe(self, timeout_s: float) -> bool:
        """Whether this cloud's metadata server answers here, within ``timeout_s`` (for
        ``PREEMPTIBLE_NOTICES=auto``). Never raises."""

    def pause_s(self, what: str) -> float:
        """Seconds to wait after a poll of ``what`` that found no notice."""
        return self.poll_s

    def committed(self, step: int) -> None:  # noqa: B027 - most clouds want no ack
        """The notice save of ``step`` has committed; a cloud that waits for an
        acknowledgement gets it now (Azure). Called on the training thread; never raises."""

    # --- running --------------------------------------------------------------------------------

    def start(self, on_notice: Callable[[CloudNotice], None]) -> None:
        """Start one daemon thread per watched key; ``on_notice`` is called once, from one."""
        for what, poll in self.watches().items():
            thread = threading.Thread(
                target=self._loop,
                args=(what, poll, on_notice),
                name=f"preemptible-notices-{self.cloud}-{what}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    @property
    def delivered(self) -> CloudNotice | None:
        """The notice this source handed on (None before one)."""
        with self._lock:
            return self._delivered

    def close(self) -> None:
        """Stop the threads (daemons: a request stuck on a slow server never holds the exit)."""
        self._done.set()
        for thread in self._threads:
            thread.join(timeout=0.2)
        self._client.close()

    def _loop(self, what: str, poll: Poll, on_notice: Callable[[CloudNotice], None]) -> None:
        backoff = 0.0
        while not self._done.is_set():
            try:
                notice = poll()
            except Exception as exc:  # a bad answer, whatever it is, must never end the watch
                if self._done.is_set():
                    return  # closed under the request
                self._failed(what, exc)
                backoff = min(MAX_BACKOFF_S, max(self.poll_s, 2 * backoff))
                self._done.wait(backoff)
                continue
            self._recovered(what)
            backoff = 0.0
            if notice is not None:
                self._deliver(notice, on_notice)
                return
            self._done.wait(self.pause_s(what))

    def _deliver(self, notice: CloudNotice, on_notice: Callable[[CloudNotice], None]) -> None:
        with self._lock:
            if self._delivered is not None:
                return  # another key of the same cloud was first
            self._delivered = notice
        on_notice(notice)

    # --- the outage log -----------------------------------------------------------------------

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            first = not self._failing
            self._failing.add(what)
        if first:  # once per outage: a server that is down must not flood the job's log
            log.warning(
                "%s metadata server at %s: %s failed (%s); training goes on, retrying with "
                "back-off (signals still stop the job)",
                self.cloud,
                self.base_url,
                what,
                describe(exc),
            )

    def _recovered(self, what: str) -> None:
        with self._lock:
            was_failing = bool(self._failing)
            self._failing.discard(what)
            recovered = was_failing and not self._failing
        if recovered:
            log.info("%s metadata server at %s answers again", self.cloud, self.base_url)


def unexpected(response: httpx.Response) -> MetadataAnswerError:
    """The error for a status the API does not document at this point."""
    return MetadataAnswerError(f"HTTP {response.status_code} from {response.request.url.path}")


def describe(exc: BaseException) -> str:
    """The failure in words, never with the request's headers (AWS's carry a token)."""
    return f"{type(exc).__name__}: {exc}"[:200]
