"""`tests.polling.wait_until`, the one way a test waits: its value, its timeout, its message."""

from __future__ import annotations

import itertools
import time

import pytest

from tests.polling import wait_until


def test_it_returns_the_first_truthy_value_of_the_probe() -> None:
    calls = itertools.count()
    values: list[object] = [None, False, 0, [], "ready", "later"]
    assert wait_until(lambda: values[next(calls)], "the value", every=0.001) == "ready"
    assert next(calls) == 5  # never called again once it held


def test_it_times_out_with_what_it_waited_for_the_last_value_and_the_description() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: [], "the jobs", timeout=0.2, every=0.01, describe=lambda: "the log")
    took = time.monotonic() - started
    assert 0.2 <= took < 2.0
    assert str(failed.value) == "timed out after 0.2 s waiting for the jobs (last: [])\nthe log"


def test_a_probe_that_says_nothing_more_than_not_yet_is_not_shown() -> None:
    with pytest.raises(AssertionError, match=r"^timed out after 0.05 s waiting for x$"):
        wait_until(lambda: False, "x", timeout=0.05, every=0.01)


def test_a_description_that_fails_does_not_hide_the_timeout() -> None:
    def describe() -> str:
        raise OSError("gone")

    with pytest.raises(AssertionError, match=r"waiting for x\n\(describe\(\) raised OSError"):
        wait_until(lambda: None, "x", timeout=0.05, every=0.01, describe=describe)


def test_a_probe_gives_up_early_by_raising() -> None:
    def probe() -> bool:
        raise RuntimeError("the process exited")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the process exited"):
        wait_until(probe, "x")
    assert time.monotonic() - started < 1.0  # not the 30 s of the timeout
