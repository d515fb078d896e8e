"""Bad names given to the core raise the project's errors, still catchable as ValueError."""

import pytest

from preemptible.errors import ConfigError, PreemptibleError
from preemptible.queue.core import get_policy
from preemptible.queue.core.model import Tier


def test_unknown_tier_is_a_config_error_listing_the_tiers():
    with pytest.raises(ConfigError, match="unknown tier 'urgent': use one of critical, high"):
        Tier.parse("urgent")


def test_known_tier_parses_case_insensitively():
    assert Tier.parse(" HIGH ") is Tier.HIGH


def test_unknown_policy_is_a_config_error_listing_the_policies():
    with pytest.raises(ConfigError, match="unknown policy 'lottery'; choose one of fifo"):
        get_policy("lottery")


@pytest.mark.parametrize(
    "call", [lambda: Tier.parse("x"), lambda: get_policy("x")], ids=["tier", "policy"]
)
def test_name_errors_are_ours_and_value_errors(call):
    with pytest.raises(PreemptibleError) as info:
        call()
    assert isinstance(info.value, ValueError)
