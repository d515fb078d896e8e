"""Preemption notices from the clouds' metadata servers, beside the signals.

AWS spot interruptions (`aws`), Google Compute Engine preemption and host maintenance (`gcp`)
and Azure Scheduled Events (`azure`) each get a source: daemon threads that poll the metadata
server and record the first notice on the `PreemptionGuard`, with the cloud's deadline
(`source`). ``PREEMPTIBLE_NOTICES`` or ``Context(notices=...)`` chooses them (`selection`).
"""

from preemptible.runtime.notices.selection import (
    CLOUDS,
    CloudNotices,
    NoticeSelection,
    build_source,
    parse_notices,
)
from preemptible.runtime.notices.source import CloudNotice, NoticeSource

__all__ = [
    "CLOUDS",
    "CloudNotice",
    "CloudNotices",
    "NoticeSelection",
    "NoticeSource",
    "build_source",
    "parse_notices",
]
