"""The server's log: every decision as one line with its reason, plain or JSON.

The audit log (`GET /v1/events`) keeps every decision; an operator reading the server's output
(journald, a container's log, a terminal) sees them too, as they happen: "admitted j12
(team-a): within team-a's nominal quota". With ``--log-format json`` every line of the server
is one JSON object, a decision's with its event (kind, job, queue, reason, data, who asked)
under ``"decision"``, for a log pipeline to index. Tokens are never in an event, so never here.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

DECISIONS = logging.getLogger("preemptible.queue.decisions")
FORMATS = ("plain", "json")
PLAIN = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_decision(
    kind: str,
    job_id: str,
    queue: str,
    reason: str,
    data: dict[str, Any] | None,
    by: tuple[str, str] | None,
) -> None:
    """One line for one event of the audit log (INFO; `by`: who asked, None: the manager)."""
    if not DECISIONS.isEnabledFor(logging.INFO):
        return
    who = "" if by is None else f" [asked by {by[0]}:{by[1]}]"
    decision = {
        "kind": kind,
        "job": job_id,
        "queue": queue,
        "reason": reason,
        "data": data or {},
        "by": None if by is None else f"{by[0]}:{by[1]}",
    }
    DECISIONS.info(
        "%s %s (%s): %s%s", kind, job_id, queue, reason, who, extra={"decision": decision}
    )


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, and a decision's
    event or an exception's traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        decision = getattr(record, "decision", None)
        if decision is not None:
            out["decision"] = decision
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """The root logger writes to stderr at `level`, as `log_format` ("plain" or "json") says.

    Raises:
        ValueError: an unknown level or format.
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(PLAIN))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
