import math

import pytest

from preemptible.queue.core import PreemptionSettings, negotiate
from preemptible.queue.core.negotiation import effective_save_s

S = PreemptionSettings()  # safety 1.5, margin 10 s, grace 30 s..10 min, min runtime 5 min x10


@pytest.mark.parametrize(
    ("save", "grace"),
    [(0.0, 30.0), (10.0, 30.0), (20.0, 40.0), (100.0, 160.0), (1000.0, 600.0)],
    ids=["zero-cost-gets-grace-min", "small", "linear", "linear-large", "clamped-to-max"],
)
def test_grace_is_clamped_safety_times_save_plus_margin(save, grace):
    assert negotiate(save, 0.0, S).grace_s == pytest.approx(grace)


@pytest.mark.parametrize(
    ("save", "restore", "floor"),
    [(1.0, 1.0, 300.0), (20.0, 20.0, 400.0), (0.0, 0.0, 300.0)],
    ids=["floor-wins", "multiple-wins", "zero"],
)
def test_min_runtime_is_max_of_floor_and_multiple_of_costs(save, restore, floor):
    assert negotiate(save, restore, S).min_runtime_s == pytest.approx(floor)


def test_interval_hint_follows_young_daly():
    hint = negotiate(30.0, 0.0, S, mean_time_between_preemptions_s=3600.0)
    assert hint.checkpoint_interval_hint_s == pytest.approx(math.sqrt(2 * 30 * 3600))


def test_no_interval_hint_without_observed_preemptions():
    assert negotiate(30.0, 0.0, S).checkpoint_interval_hint_s is None


def test_inflated_claims_are_capped_by_observation():
    honest = negotiate(20.0, 0.0, S)
    inflated = negotiate(500.0, 0.0, S, observed_exit_s=20.0)
    assert inflated.grace_s == pytest.approx(negotiate(30.0, 0.0, S).grace_s)
    assert inflated.grace_s < negotiate(500.0, 0.0, S).grace_s
    assert honest.grace_s <= inflated.grace_s
    assert effective_save_s(10.0, 12.0) == 12.0  # an exit slower than claimed: what it took


def test_an_exit_slower_than_the_claim_gets_the_observed_figure():
    claimed = negotiate(5.0, 0.0, S)
    seen = negotiate(5.0, 0.0, S, observed_exit_s=60.0)
    assert seen.grace_s == pytest.approx(negotiate(60.0, 0.0, S).grace_s)
    assert seen.grace_s > claimed.grace_s
    assert negotiate(5.0, 0.0, S, observed_exit_s=1e6).grace_s == S.grace_max_s
