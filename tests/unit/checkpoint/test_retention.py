import pytest

from preemptible.checkpoint.retention import steps_to_delete


@pytest.mark.parametrize(
    ("steps", "keep", "keep_every", "deleted"),
    [
        pytest.param([], 3, None, [], id="nothing-to-delete"),
        pytest.param([1, 2, 3], 3, None, [], id="exactly-keep"),
        pytest.param([1, 2, 3, 4, 5], 2, None, [1, 2, 3], id="oldest-first"),
        pytest.param([5, 1, 3, 2, 4], 2, None, [1, 2, 3], id="unordered-input"),
        pytest.param([1, 2, 3, 4, 5], None, None, [], id="keep-all"),
        pytest.param([10, 20, 25, 30, 35], 1, 10, [25], id="keep-every-multiple"),
        pytest.param([7], 1, 5, [], id="newest-never-deleted-even-if-not-multiple"),
        pytest.param([1, 2], 0, None, [1], id="keep-zero-still-keeps-newest"),
    ],
)
def test_steps_to_delete(steps, keep, keep_every, deleted):
    assert steps_to_delete(steps, keep=keep, keep_every=keep_every) == deleted


def test_the_step_just_saved_is_kept_below_newer_ones():
    # A run restored step 200 past corrupt 280..300 and saved 210: 210 stays, the older one goes.
    steps = [100, 200, 210, 280, 290, 300]
    assert steps_to_delete(steps, keep=3, keep_every=None, saved=210) == [100, 200]
    assert steps_to_delete(steps, keep=3, keep_every=None) == [100, 200, 210]  # without it
