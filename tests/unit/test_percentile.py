"""The one nearest-rank percentile: every answer is a value that was seen."""

import math

from hypothesis import given
from hypothesis import strategies as st

from preemptible._percentile import nearest_rank


def test_the_p95_of_twenty_values_is_the_nineteenth():
    values = [float(v) for v in range(20, 0, -1)]  # unsorted on purpose
    assert nearest_rank(values, 0.95) == 19.0
    assert nearest_rank(values, 0.5) == 10.0
    assert nearest_rank(values, 1.0) == 20.0
    assert nearest_rank(values, 0.0) == 1.0


def test_no_values_answers_what_the_caller_chose():
    assert nearest_rank([], 0.95) == 0.0
    assert math.isnan(nearest_rank([], 0.95, empty=math.nan))


@given(st.lists(st.floats(allow_nan=False), min_size=1), st.floats(0, 1))
def test_at_least_the_fraction_lies_at_or_below_and_it_was_seen(values, fraction):
    p = nearest_rank(values, fraction)
    assert p in values
    at_or_below = sum(v <= p for v in values)
    assert at_or_below >= fraction * len(values) - 1e-9
    assert sum(v < p for v in values) < max(1, math.ceil(fraction * len(values)))
