"""PreemptionGuard: recording, chaining, restoring, the final-save shield and the deadline."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from preemptible.errors import ConfigError, GuardError
from preemptible.runtime import signals as signals_module
from preemptible.runtime.deadline import Grace
from preemptible.runtime.signals import PreemptionGuard

CAUGHT = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def restore_handlers() -> Iterator[None]:
    """Whatever a test does, the next one starts with the handlers pytest had."""
    saved = {sig: signal.getsignal(sig) for sig in CAUGHT}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_guard(clock: FakeClock | None = None, **kwargs) -> PreemptionGuard:
    kwargs.setdefault("env", {})
    return PreemptionGuard(clock=clock or FakeClock(), **kwargs)


# --- recording ---------------------------------------------------------------------------------


def test_a_fresh_guard_has_received_nothing():
    guard = make_guard()
    assert not guard.requested
    assert (guard.signal, guard.received_at, guard.count, guard.reason) == (None, None, 0, None)
    assert guard.deadline is None and guard.remaining() is None
    assert guard.exit_code() == 0
    assert not guard.wait(0)


def test_calling_the_handler_records_signal_time_and_count(clock):
    guard = make_guard(clock)
    guard._handle(signal.SIGUSR1, None)
    assert guard.requested and guard.wait(0)
    assert guard.signal is signal.SIGUSR1
    assert guard.received_at == 1000.0
    assert guard.count == 1 and guard.reason == "SIGUSR1"


def test_the_first_notice_is_kept_and_later_ones_are_counted(clock):
    guard = make_guard(clock)
    guard._handle(signal.SIGUSR1, None)
    clock.now += 5
    guard._handle(signal.SIGTERM, None)
    assert guard.signal is signal.SIGUSR1 and guard.received_at == 1000.0
    assert guard.count == 2
    assert [n.signal for n in guard.notices] == [signal.SIGUSR1, signal.SIGTERM]
    assert guard.notices[1].received_at == 1005.0


@pytest.mark.parametrize(
    "sig, code",
    [(signal.SIGTERM, 143), (signal.SIGUSR1, 128 + signal.SIGUSR1), (signal.SIGINT, 130)],
    ids=["term-143", "usr1", "int-130"],
)
def test_a_real_signal_in_the_main_thread_is_recorded_and_sets_the_exit_code(sig, code):
    with make_guard() as guard:
        signal.raise_signal(sig)
        assert guard.signal is sig
        assert guard.exit_code() == code


def test_os_kill_to_our_own_pid_is_recorded():
    with make_guard() as guard:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert guard.wait(5)  # delivered at the next bytecode boundary
        assert guard.signal is signal.SIGUSR1


def test_sigint_does_not_raise_keyboard_interrupt_while_installed():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with make_guard() as guard:
        signal.raise_signal(signal.SIGINT)  # would raise KeyboardInterrupt without the guard
        signal.raise_signal(signal.SIGINT)
    assert guard.count == 2 and guard.exit_code() == 130
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_a_programmatic_request_has_no_signal_and_exit_code_zero(clock):
    guard = make_guard(clock)
    guard.request("queue-manager notice")
    assert guard.requested and guard.signal is None
    assert guard.reason == "queue-manager notice" and guard.received_at == 1000.0
    assert guard.exit_code() == 0


def test_requests_from_many_threads_are_all_counted():
    guard = make_guard()
    threads = [
        threading.Thread(target=lambda: [guard.request() for _ in range(200)]) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert guard.count == 800


def test_wait_returns_when_a_signal_arrives_from_another_thread():
    with make_guard() as guard:
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        started = time.monotonic()
        assert guard.wait(10)
        assert time.monotonic() - started < 5
        timer.join()
    assert guard.signal is signal.SIGTERM


def test_wait_times_out_without_a_notice():
    assert make_guard().wait(0.01) is False


# --- chaining and restoring --------------------------------------------------------------------


def test_a_previous_python_handler_is_chained_after_recording():
    seen: list[tuple[int, bool]] = []
    guard = make_guard()
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append((signum, guard.requested)))
    with guard:
        signal.raise_signal(signal.SIGUSR1)
    assert seen == [(signal.SIGUSR1, True)]  # the guard had recorded it before the chain ran


@pytest.mark.parametrize("previous", [signal.SIG_DFL, signal.SIG_IGN], ids=["dfl", "ign"])
def test_sig_dfl_and_sig_ign_are_not_chained(previous):
    signal.signal(signal.SIGUSR1, previous)
    with make_guard() as guard:
        signal.raise_signal(signal.SIGUSR1)  # chaining SIG_DFL would kill the test process
    assert guard.count == 1
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_uninstall_restores_exactly_the_previous_handlers():
    def mine(signum, frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    guard = make_guard().install()
    assert all(signal.getsignal(s) == guard._handle for s in CAUGHT)
    guard.uninstall()
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not guard.installed
    guard.uninstall()  # a second uninstall is a no-op


def test_reclaim_takes_back_a_replaced_handler_without_calling_it_and_uninstall_still_restores():
    def before(signum, frame):
        pass

    calls: list[int] = []
    signal.signal(signal.SIGTERM, before)
    guard = make_guard(signals=[signal.SIGTERM, signal.SIGUSR1]).install()
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))  # a framework's
    assert guard.reclaim() == [signal.SIGTERM]  # SIGUSR1 was still ours
    assert guard.reclaim() == []
    signal.raise_signal(signal.SIGTERM)
    assert guard.count == 1 and calls == []
    guard.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before
    assert guard.reclaim() == []  # not installed: nothing to take back


def test_only_the_chosen_signals_are_installed():
    before = signal.getsignal(signal.SIGINT)
    with make_guard(signals=[signal.SIGTERM, signal.SIGTERM, int(signal.SIGUSR1)]) as guard:
        assert guard.signals == (signal.SIGTERM, signal.SIGUSR1)
        assert signal.getsignal(signal.SIGINT) is before


def test_a_guard_can_be_installed_again_after_uninstall():
    guard = make_guard()
    with guard:
        pass
    with guard:
        signal.raise_signal(signal.SIGTERM)
    assert guard.count == 1


def test_installing_twice_is_an_error():
    with make_guard() as guard, pytest.raises(GuardError, match="already installed"):
        guard.install()


def test_installing_outside_the_main_thread_is_a_clear_error():
    errors: list[BaseException] = []

    def target() -> None:
        try:
            make_guard().install()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], GuardError)
    assert "main thread" in str(errors[0])


def test_a_failed_install_names_the_signal_that_failed_and_restores_the_others(monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    real_signal = signal.signal

    def refuse_usr1(sig, handler):
        if sig == signal.SIGUSR1:
            raise OSError(22, "Invalid argument")
        return real_signal(sig, handler)

    monkeypatch.setattr(signal, "signal", refuse_usr1)
    guard = make_guard(signals=[signal.SIGTERM, signal.SIGUSR1])
    with pytest.raises(GuardError, match="for SIGUSR1") as caught:
        guard.install()
    assert "SIGTERM" not in str(caught.value)
    assert not guard.installed
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(
    "signals",
    [[signal.SIGKILL], [signal.SIGSTOP], [9999], []],
    ids=["kill", "stop", "9999", "none"],
)
def test_uncatchable_or_invalid_signals_are_rejected(signals):
    with pytest.raises(ConfigError):
        make_guard(signals=signals)


# --- final save --------------------------------------------------------------------------------


def test_a_second_signal_during_final_save_is_recorded_but_does_not_abort_it():
    def exit_now(signum, frame):
        raise SystemExit(1)

    signal.signal(signal.SIGTERM, exit_now)
    saved = False
    with make_guard() as guard:
        with guard.final_save():
            signal.raise_signal(signal.SIGTERM)  # would chain to exit_now outside final_save
            signal.raise_signal(signal.SIGINT)
            saved = True
        assert saved and guard.count == 2
        with pytest.raises(SystemExit):  # outside final_save the chain is live again
            signal.raise_signal(signal.SIGTERM)
    assert guard.count == 3


# --- deadline ----------------------------------------------------------------------------------


def test_deadline_and_remaining_follow_the_injected_clock(clock):
    guard = make_guard(clock, grace_seconds=30)
    assert guard.grace_seconds == 30 and guard.grace_source == "argument"
    clock.now = 100.0
    guard._handle(signal.SIGTERM, None)
    assert guard.deadline == 130.0
    clock.now = 120.0
    assert guard.remaining() == pytest.approx(10.0)
    clock.now = 500.0
    assert guard.remaining() == 0.0


def test_the_grace_comes_from_the_environment_when_not_given(clock):
    guard = make_guard(clock, env={"PREEMPTIBLE_GRACE_SECONDS": "45"})
    assert (guard.grace_seconds, guard.grace_source) == (45.0, "PREEMPTIBLE_GRACE_SECONDS")
    guard.request()
    assert guard.deadline == 1045.0


def test_an_explicit_grace_beats_the_environment():
    guard = make_guard(grace_seconds=5, env={"PREEMPTIBLE_GRACE_SECONDS": "45"})
    assert (guard.grace_seconds, guard.grace_source) == (5, "argument")


def test_an_unknown_grace_gives_no_deadline(clock):
    guard = make_guard(clock)
    guard.request()
    assert guard.grace_source == "unknown"
    assert guard.deadline is None and guard.remaining() is None


def test_a_bad_grace_variable_fails_at_install_not_at_the_notice():
    guard = make_guard(env={"PREEMPTIBLE_GRACE_SECONDS": "two minutes"})
    with pytest.raises(ConfigError, match="PREEMPTIBLE_GRACE_SECONDS"):
        guard.install()
    assert signal.getsignal(signal.SIGTERM) != guard._handle


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")], ids=["neg", "inf", "nan"])
def test_a_bad_grace_argument_is_rejected(bad):
    with pytest.raises(ConfigError):
        make_guard(grace_seconds=bad)


def test_the_job_end_time_caps_the_deadline(monkeypatch, clock):
    grace = Grace(seconds=300, source="slurm", not_after=1100.0)
    monkeypatch.setattr(signals_module, "discover_grace", lambda env: grace)
    guard = make_guard(clock)
    guard.request()
    assert guard.deadline == 1100.0  # not 1300: the job ends first
    assert guard.remaining() == pytest.approx(100.0)
