import math

import pytest

from preemptible.queue.core import POLICIES, PreemptionSettings, negotiate, schedule
from preemptible.queue.core.model import NO_LIMIT
from preemptible.queue.core.negotiation import effective_save_s, min_runtime_seconds

from .factories import config, job, running, snapshot

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


WEEK = 604800.0


def test_a_week_long_restore_claim_buys_a_bounded_minimum_runtime():
    # The claim counts as 3 x grace_max = 1800 s: 10 x (60 + 1800) s, not 70 days.
    terms = negotiate(60.0, WEEK, S)
    assert terms.min_runtime_s == pytest.approx(10 * (60.0 + 1800.0))
    assert terms.min_runtime_s <= S.min_runtime_cap_s == 24000.0
    [clamp] = terms.clamped
    assert clamp.reason == "claimed restore 604800 s, counted as 1800 s (max_claimed_restore)"


def test_a_week_long_save_claim_buys_grace_max_and_a_bounded_minimum_runtime():
    terms = negotiate(WEEK, WEEK, S)
    assert terms.grace_s == S.grace_max_s
    assert terms.min_runtime_s == S.min_runtime_cap_s == 10 * (600.0 + 1800.0)
    assert [c.setting for c in terms.clamped] == ["max_claimed_save", "max_claimed_restore"]
    assert terms.clamped[0].reason == "claimed save 604800 s, counted as 600 s (max_claimed_save)"


def test_min_runtime_max_caps_what_counted_claims_buy():
    capped = PreemptionSettings(min_runtime_max_s=3600.0)
    terms = negotiate(300.0, 1200.0, capped)  # 10 x 1500 s = 15000 s, within the claim caps
    assert terms.min_runtime_s == 3600.0
    [clamp] = terms.clamped
    assert clamp.reason == (
        "claims buy a minimum runtime of 15000 s, counted as 3600 s (min_runtime_max)"
    )


@pytest.mark.parametrize(("save", "restore"), [(5.0, 5.0), (60.0, 120.0), (600.0, 1800.0)])
def test_claims_within_the_caps_are_counted_as_claimed(save, restore):
    terms = negotiate(save, restore, S)
    assert terms.min_runtime_s == max(300.0, 10 * (save + restore))
    assert terms.clamped == ()


def test_caps_set_lower_bind_the_grace_too():
    strict = PreemptionSettings(max_claimed_save_s=60.0, max_claimed_restore_s=60.0)
    assert negotiate(300.0, 0.0, strict).grace_s == 1.5 * 60.0 + 10.0
    assert min_runtime_seconds(300.0, 300.0, strict) == 10 * 120.0


def test_a_higher_tier_preempts_a_week_long_restore_claim_after_the_capped_minimum_runtime():
    # One GPU, one queue: the high-tier job may only take the low-tier one by tier preemption,
    # which waits for the victim's minimum runtime (reclaim would not).
    cfg = config(gpus=1, queues={"a": (1.0, 1, NO_LIMIT)})
    low = running(job("low", tier="low", save=60.0, restore=WEEK), started=0.0)
    bounded = 10 * (60.0 + 1800.0)

    def preempted_at(now: float) -> list[str]:
        snap = snapshot(cfg, pending=[job("high", tier="high", at=0.0)], running_jobs=[low])
        return [p.job_id for p in schedule(snap, now, POLICIES["preemptible"], cfg).preempt]

    assert preempted_at(bounded - 1.0) == []
    assert preempted_at(bounded) == ["low"]
