"""Real queue managers for a test, from a configuration mapping; every job they started is
killed, every process of it, when the test ends (import `no_job_outlives_its_test` to use it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from preemptible.queue.core import parse_config
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.server import build_manager
from tests.unit.queue.service.test_manager import kill_every_job

_MANAGERS: list[QueueManager] = []


def real_manager(config: dict[str, Any], state: Path) -> QueueManager:
    """A manager on `state` with this configuration; the test steps it."""
    m = build_manager(parse_config(config), state, url="http://127.0.0.1:9")
    _MANAGERS.append(m)
    return m


def retire(m: QueueManager) -> None:
    """Kill `m`'s jobs and close its state file now (a test that restarts the manager)."""
    kill_every_job(m)
    m.store.close()
    _MANAGERS.remove(m)


@pytest.fixture(autouse=True)
def no_job_outlives_its_test() -> Iterator[None]:
    yield
    while _MANAGERS:
        kill_every_job(_MANAGERS.pop())
