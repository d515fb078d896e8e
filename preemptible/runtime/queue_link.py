"""The job's side of the conversation with the queue manager (`PREEMPTIBLE_QUEUE_URL` is set).

The manager starts each job with its URL, the job's id and the job's own token. Over them:

- after each save the measured cost (the cost file's fields, last checkpoint included) goes to
  `POST /v1/jobs/{id}/cost`, from a background thread and at most every `min_interval_s`; the
  answer, `Terms` (grace, minimum runtime, checkpoint interval hint), is kept;
- a watcher long-polls `GET /v1/jobs/{id}/notice`, so that a notice reaches the loop with its
  deadline even before the SIGTERM that follows it. A notice is a preemption, or a resize
  (``"kind": "resize", "gpus": N``): the job saves and exits the same way, and the manager
  restarts it on N GPUs. A kind this SDK does not know is handled as a preemption, with a
  warning: saving and exiting is safe whatever the manager meant, ignoring it is not;
- every `beat_s` seconds (`PREEMPTIBLE_BEAT_SECONDS`, from the manager) a beater posts the
  loop's step, its slowest step since the last beat and its newest checkpoint to
  `POST /v1/jobs/{id}/progress`, when the step has moved: the manager restarts a job whose step
  stands still too long (a hang), and after a crash from the checkpoint it knows of;
- after the notice save has committed, `ack` posts `POST /v1/jobs/{id}/checkpointed`: the job
  is exiting with nothing left to save, and the manager hands its GPUs on at once. The ack of
  a resize adds ``"kind": "resize", "gpus": N``; that of a preemption is unchanged, so a
  manager that never sends resizes never sees a field it does not know.

A manager that is down, slow or answers garbage never breaks or slows training: the failure is
logged once, the thread backs off (doubling up to a minute), the last terms are kept, and
signals still stop the job. Only `ack` runs on the training thread, once, with a short timeout.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx

from preemptible._env_names import BEAT_ENV, JOB_ID_ENV, TOKEN_ENV, URL_ENV
from preemptible.checkpoint import CheckpointCost

log = logging.getLogger("preemptible")


NOTICE_WAIT_S = 30.0
"""How long one notice long-poll waits on the server."""
BEAT_S = 10.0
"""How often the step is reported when the manager does not say (`PREEMPTIBLE_BEAT_SECONDS`)."""
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Terms:
    """What the queue manager granted for the job's measured cost."""

    grace_s: float
    """Seconds from a notice to the kill."""
    min_runtime_s: float
    """The job is not preempted (except to reclaim a quota) before it has run this long."""
    interval_hint_s: float | None
    """Checkpoint period that suits the queue's observed preemption rate (None: none seen)."""


class NoticeKind(StrEnum):
    """What a notice asks; both mean "save at the next step boundary, ack, exit"."""

    PREEMPT = "preempt"
    """Leave the GPUs; the job waits in the queue again."""
    RESIZE = "resize"
    """Restart at once on `QueueNotice.gpus` GPUs (an elastic job shrinks or grows)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueNotice:
    """A notice from the manager: save and exit by `deadline` (epoch seconds)."""

    reason: str
    grace_s: float
    deadline: float
    kind: NoticeKind = NoticeKind.PREEMPT
    """A notice without a kind (every manager before resizes) is a preemption."""
    gpus: int | None = None
    """The size of the restart, for a resize only."""


class QueueLink:
    """One job's link to its queue manager; threads start with `start` and stop with `close`.

    Args:
        url: the manager's base URL (``http://127.0.0.1:8470``).
        job_id: this job's id.
        token: this job's own token (never logged).
        min_interval_s: at most one cost report per this many seconds.
        timeout_s: timeout of one report or ack.
        beat_s: how often the step is reported (when it has moved).
        transport: an httpx transport, for tests.
    """

    def __init__(
        self,
        url: str,
        job_id: str,
        token: str,
        *,
        min_interval_s: float = 2.0,
        timeout_s: float = 5.0,
        beat_s: float = BEAT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        self.job_id = job_id
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self.beat_s = beat_s
        self._step: tuple[int, float] | None = None  # (step, when), set by the training thread
        self._slowest_s = 0.0
        self._checkpoint: tuple[int, float] | None = None  # the newest committed: (step, time)
        self._client = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: CheckpointCost | None = None
        self._terms: Terms | None = None
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._failing: set[str] = set()
        self._on_terms: Callable[[Terms], None] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], **options: Any) -> QueueLink | None:
        """The link the manager's variables describe; None when the job was not started by one."""
        url = env.get(URL_ENV, "").strip()
        if not url:
            return None
        job_id, token = env.get(JOB_ID_ENV, "").strip(), env.get(TOKEN_ENV, "").strip()
        if not job_id or not token:
            missing = [n for n, v in ((JOB_ID_ENV, job_id), (TOKEN_ENV, token)) if not v]
            log.warning(
                "%s is set but %s is not: not talking to the queue manager (signals still work)",
                URL_ENV,
                " and ".join(missing),
            )
            return None
        try:
            beat_s = float(env.get(BEAT_ENV, "").strip() or BEAT_S)
        except ValueError:
            beat_s = BEAT_S
        options.setdefault("beat_s", beat_s if math.isfinite(beat_s) and beat_s > 0 else BEAT_S)
        return cls(url, job_id, token, **options)

    @property
    def terms(self) -> Terms | None:
        """The last terms the manager answered with (None before the first answer)."""
        with self._lock:
            return self._terms

    # --- threads ------------------------------------------------------------------------------

    def start(
        self,
        on_notice: Callable[[QueueNotice], None],
        on_terms: Callable[[Terms], None] | None = None,
    ) -> None:
        """Start reporting costs, beating the step and watching for a notice (`on_notice` is
        called once)."""
        self._on_terms = on_terms
        loops = (("reporter", self._report_loop), ("notices", self._watch), ("beat", self._beat))
        for name, target in loops:
            args = (on_notice,) if name == "notices" else ()
            thread = threading.Thread(
                target=target, args=args, name=f"preemptible-queue-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def progress(self, step: int) -> None:
        """The loop finished ``step`` (called at every step boundary: no lock, no I/O)."""
        now = time.monotonic()
        last = self._step
        if last is not None and step != last[0]:
            self._slowest_s = max(self._slowest_s, now - last[1])
        self._step = (step, now)

    def report(self, cost: CheckpointCost) -> None:
        """Queue `cost` for the reporter (a newer one replaces one not sent yet); its last
        checkpoint goes out with the next step beat too, which no rate limit holds back."""
        with self._wake:
            step, at = cost.last_checkpoint_step, cost.last_checkpoint_time
            if step is not None and at is not None:
                self._checkpoint = (step, at)
            self._pending = cost
            self._wake.notify_all()

    def ack(self, step: int, *, at: float | None = None, resize_to: int | None = None) -> bool:
        """Tell the manager the notice save of `step` has committed and the job is exiting;
        `resize_to`: the notice was a resize to that many GPUs (the body says so)."""
        body: dict[str, Any] = {"step": step, "at": time.time() if at is None else at}
        if resize_to is not None:
            body.update(kind=NoticeKind.RESIZE.value, gpus=resize_to)
        try:
            response = self._client.post(
                f"/v1/jobs/{self.job_id}/checkpointed", json=body, timeout=min(self.timeout_s, 2.0)
            )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            self._failed("ack", exc)
            return False
        return True

    def close(self) -> None:
        """Stop the threads (they are daemons: a stuck request never holds the exit)."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(timeout=0.5)
        self._client.close()

    def _report_loop(self) -> None:
        backoff = 0.0
        not_before = -math.inf  # the rate limit, or the end of a back-off
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                wait = not_before - time.monotonic()
                if wait > 0:
                    self._wake.wait(timeout=wait)  # a newer cost may replace this one meanwhile
                    continue
                cost, self._pending = self._pending, None
            assert cost is not None
            terms = self._send_cost(cost)
            if terms is None:
                backoff = min(MAX_BACKOFF_S, max(1.0, 2 * backoff))
                not_before = time.monotonic() + backoff
                with self._wake:
                    if self._pending is None:
                        self._pending = cost  # send it again after the back-off
                continue
            backoff = 0.0
            not_before = time.monotonic() + self.min_interval_s
            with self._lock:
                self._terms = terms
            if self._on_terms is not None:
                self._on_terms(terms)

    def _beat(self) -> None:
        """Report the step every `beat_s` when it has moved; a failure is logged once and the
        next beat tries again (the manager restarts a job only for a step it saw stand still)."""
        sent: int | None = None
        while True:
            next_at = time.monotonic() + self.beat_s
            with self._wake:  # woken early by a cost report or by close
                while not self._closed and (left := next_at - time.monotonic()) > 0:
                    self._wake.wait(timeout=left)
                if self._closed:
                    return
            current = self._step
            if current is None or current[0] == sent:
                continue
            slowest, self._slowest_s = self._slowest_s, 0.0
            body: dict[str, Any] = {
                "step": current[0],
                "step_seconds": round(slowest, 6) if slowest else None,
            }
            checkpoint = self._checkpoint
            if checkpoint is not None:
                body.update(checkpoint_step=checkpoint[0], checkpoint_time=checkpoint[1])
            try:
                response = self._client.post(f"/v1/jobs/{self.job_id}/progress", json=body)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                if self._is_closed():
                    return
                self._failed("progress beat", exc)
                self._slowest_s = max(self._slowest_s, slowest)
                continue
            self._recovered("progress beat")
            sent = current[0]

    def _send_cost(self, cost: CheckpointCost) -> Terms | None:
        try:
            response = self._client.post(
                f"/v1/jobs/{self.job_id}/cost", json=cost.to_json(updated_at=time.time())
            )
            response.raise_for_status()
            terms = _terms(response.json())
        except (httpx.HTTPError, ValueError, RuntimeError) as exc:
            if self._is_closed():
                return None
            self._failed("cost report", exc)
            return None
        self._recovered("cost report")
        return terms

    def _watch(self, on_notice: Callable[[QueueNotice], None]) -> None:
        backoff = 0.0
        while True:
            with self._wake:
                if backoff:
                    self._wake.wait(timeout=backoff)
                if self._closed:
                    return
            try:
                response = self._client.get(
                    f"/v1/jobs/{self.job_id}/notice",
                    params={"wait": NOTICE_WAIT_S},
                    timeout=NOTICE_WAIT_S + self.timeout_s,
                )
                response.raise_for_status()
                notice = _notice(response.json())
            except (httpx.HTTPError, ValueError, RuntimeError) as exc:
                if self._is_closed():
                    return  # the client was closed under the poll (RuntimeError, or a read)
                self._failed("notice watch", exc)
                backoff = min(MAX_BACKOFF_S, max(1.0, 2 * backoff))
                continue
            self._recovered("notice watch")
            backoff = 0.0
            if notice is not None:
                on_notice(notice)
                return

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def _failed(self, what: str, exc: Exception) -> None:
        with self._lock:
            first = what not in self._failing
            self._failing.add(what)
        if first:  # once per outage: a manager that is down must not flood the job's log
            log.warning(
                "queue manager %s failed (%s); training goes on, retrying with back-off",
                what,
                _describe(exc),
            )

    def _recovered(self, what: str) -> None:
        with self._lock:
            was_failing = what in self._failing
            self._failing.discard(what)
        if was_failing:
            log.info("queue manager %s works again", what)


def _terms(body: Any) -> Terms:
    """The answer of `POST /cost`; ValueError when it is not one."""
    if not isinstance(body, dict):
        raise ValueError(f"the cost answer is not an object: {body!r:.80}")
    grace, minimum = _number(body, "grace_s"), _number(body, "min_runtime_s")
    hint = body.get("checkpoint_interval_hint_s")
    if hint is not None:
        hint = _number(body, "checkpoint_interval_hint_s")
    if grace is None or minimum is None:
        raise ValueError(f"the cost answer lacks grace_s or min_runtime_s: {body!r:.80}")
    return Terms(grace_s=grace, min_runtime_s=minimum, interval_hint_s=hint)


def _notice(body: Any) -> QueueNotice | None:
    """The answer of `GET /notice`; ValueError when it is not one."""
    if not isinstance(body, dict) or "notice" not in body:
        raise ValueError(f"the notice answer is not {{'notice': ...}}: {body!r:.80}")
    notice = body["notice"]
    if notice is None:
        return None
    if not isinstance(notice, dict):
        raise ValueError(f"the notice is not an object: {notice!r:.80}")
    deadline = _number(notice, "deadline")
    if deadline is None:
        raise ValueError(f"the notice lacks a deadline: {notice!r:.80}")
    grace = _number(notice, "grace_s")
    if grace is None:  # a resize notice may carry the deadline alone
        grace = max(0.0, deadline - time.time())
    reason = str(notice.get("reason", ""))
    kind, gpus = _kind(notice)
    if kind is NoticeKind.RESIZE and not reason:
        reason = f"resize to {gpus} GPUs"
    elif kind is NoticeKind.PREEMPT and notice.get("kind", "preempt") != "preempt":
        reason = f"{reason or 'notice'} (kind {notice.get('kind')!r}, handled as a preemption)"
    return QueueNotice(reason=reason, grace_s=grace, deadline=deadline, kind=kind, gpus=gpus)


_warned_kinds: set[str] = set()


def _kind(notice: dict[str, Any]) -> tuple[NoticeKind, int | None]:
    """The notice's kind and, for a resize, its size. What this SDK cannot act on exactly (a
    kind it does not know, a resize without a valid size) is a preemption: saving and exiting
    is what every notice asks first. Warned once per kind."""
    raw = notice.get("kind", NoticeKind.PREEMPT.value)
    gpus = notice.get("gpus")
    if raw == NoticeKind.PREEMPT.value:
        return NoticeKind.PREEMPT, None
    if raw == NoticeKind.RESIZE.value and type(gpus) is int and gpus >= 1:
        return NoticeKind.RESIZE, gpus
    what = f"a resize notice with gpus={gpus!r}" if raw == "resize" else f"notice kind {raw!r}"
    if repr(raw) not in _warned_kinds:
        _warned_kinds.add(repr(raw))
        log.warning(
            "the queue manager sent %s, which this version of preemptible does not know: "
            "handling it as a preemption (save at the next step, then exit)",
            what,
        )
    return NoticeKind.PREEMPT, None


def _number(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if value < 0:
        raise ValueError(f"{key} is negative: {value!r}")
    return float(value)


def _describe(exc: Exception) -> str:
    """The failure in words, never with the request's headers (they carry the token)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} from {exc.request.url.path}"
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {exc}"
    return str(exc)
