"""Waiting in tests: poll a condition until it holds or a deadline passes.

Every test that waits for something another thread or process does uses `wait_until`; none
writes a loop of its own. A probe gives up early by raising (``assert proc.poll() is None,
output``): its exception propagates as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None],
    what: str,
    *,
    timeout: float = 30.0,
    every: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> T:
    """Call `probe` every `every` seconds until it returns a truthy value, and return that value.

    The probe is called at least once, and once more when the deadline has passed. If no call
    returned a truthy value within `timeout` seconds, raises AssertionError: "timed out after
    `timeout` s waiting for `what`", the last value the probe returned when it tells more than
    None or False (a state, an empty list), and what `describe()` returns (a process's output,
    a server's log) on a line of its own. A probe that may return 0 or "" as a result compares
    (``proc.poll() is not None``): a falsy value means "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(every)
    message = f"timed out after {timeout:g} s waiting for {what}"
    if value is not None and value is not False:
        message += f" (last: {value!r})"
    if describe is not None:
        try:
            message += f"\n{describe()}"
        except Exception as exc:  # the failure to describe must not hide the timeout
            message += f"\n(describe() raised {exc!r})"
    raise AssertionError(message)
