import math

import pytest

from preemptible.errors import ConfigError
from preemptible.runtime.interval import SaveSchedule, young_daly_seconds


def test_young_daly_is_sqrt_2cm():
    assert young_daly_seconds(2.0, 3600.0) == pytest.approx(math.sqrt(2 * 2 * 3600))
    with pytest.raises(ConfigError):
        young_daly_seconds(1.0, 0.0)


def test_auto_saves_once_to_measure_then_every_sqrt_2cm(monkeypatch):
    monkeypatch.setenv("PREEMPTIBLE_MTBF_SECONDS", "1800")
    schedule = SaveSchedule(auto=True)
    assert schedule.should_save(0, now=0.0, last_save_at=0.0, stall_p95=None)
    interval = math.sqrt(2 * 0.25 * 1800)  # 30 s
    assert not schedule.should_save(5, now=29.0, last_save_at=0.0, stall_p95=0.25)
    assert schedule.should_save(6, now=30.5, last_save_at=0.0, stall_p95=0.25)
    assert schedule.interval_seconds(0.25) == pytest.approx(interval)


def test_a_bad_mtbf_variable_is_named(monkeypatch):
    monkeypatch.setenv("PREEMPTIBLE_MTBF_SECONDS", "soon")
    with pytest.raises(ConfigError, match="PREEMPTIBLE_MTBF_SECONDS"):
        SaveSchedule(auto=True).resolved_mtbf()


def test_steps_and_seconds_combine():
    schedule = SaveSchedule(every_steps=10, every_seconds=60)
    assert schedule.should_save(9, now=1.0, last_save_at=0.0, stall_p95=None)
    assert not schedule.should_save(10, now=59.0, last_save_at=0.0, stall_p95=None)
    assert schedule.should_save(11, now=61.0, last_save_at=0.0, stall_p95=None)
