"""The last save's choice from the deadline and measured costs (`runtime/last_save.py`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from preemptible.runtime.last_save import LastSave, plan_last_save


def test_no_deadline_or_no_measurement_saves_as_fast_as_possible() -> None:
    for plan in (
        plan_last_save(None, local_save_s=3.0, upload_s=9.0, two_tiers=True),
        plan_last_save(5.0, local_save_s=None, two_tiers=False),
    ):
        assert plan.choice is LastSave.DURABLE
        assert "as fast as possible" in plan.describe()
    assert plan_last_save(None, local_save_s=3.0).upload_budget_s is None


def test_one_tier_saves_when_the_save_fits_else_exits_at_once() -> None:
    fits = plan_last_save(10.0, local_save_s=8.0)
    assert fits.choice is LastSave.DURABLE
    assert fits.describe() == "last save: save (10.0 s left, save 8.00 s)"
    late = plan_last_save(10.0, local_save_s=10.5)
    assert late.choice is LastSave.NONE
    assert late.describe() == (
        "last save: none, exiting on the last checkpoint (10.0 s left, save 10.50 s: "
        "it cannot finish)"
    )


def test_two_tiers_choose_durable_then_local_then_none() -> None:
    durable = plan_last_save(30.0, local_save_s=2.0, upload_s=20.0, two_tiers=True)
    assert durable.choice is LastSave.DURABLE
    assert durable.upload_budget_s == 28.0
    local = plan_last_save(10.0, local_save_s=2.0, upload_s=20.0, two_tiers=True)
    assert local.choice is LastSave.LOCAL
    assert local.upload_budget_s == 8.0
    assert local.describe() == (
        "last save: local, then the upload for up to 8.0 s "
        "(10.0 s left, local save 2.00 s, upload 20.00 s)"
    )
    none = plan_last_save(1.5, local_save_s=2.0, upload_s=20.0, two_tiers=True)
    assert none.choice is LastSave.NONE and none.upload_budget_s is None


def test_an_upload_never_measured_is_tried_within_the_deadline() -> None:
    plan = plan_last_save(10.0, local_save_s=2.0, upload_s=None, two_tiers=True)
    assert plan.choice is LastSave.DURABLE
    assert plan.upload_budget_s == 8.0  # waited for until the deadline, no longer
    assert "upload not measured" in plan.describe()


@given(
    left=st.floats(0, 1e4),
    local=st.floats(0, 1e4),
    upload=st.floats(0, 1e4),
    two_tiers=st.booleans(),
)
def test_what_is_chosen_fits_the_deadline(
    left: float, local: float, upload: float, two_tiers: bool
) -> None:
    plan = plan_last_save(left, local_save_s=local, upload_s=upload, two_tiers=two_tiers)
    if plan.choice is LastSave.NONE:
        assert local > left  # exits at once only when even the local commit cannot finish
    else:
        assert local <= left
        assert plan.upload_budget_s is not None and local + plan.upload_budget_s <= left + 1e-9
    if plan.choice is LastSave.LOCAL:
        assert two_tiers and local + upload > left  # durable was not possible
