"""The simulator's argument checks raise the project's errors."""

import pytest

from preemptible.errors import ConfigError
from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim import SimOptions, Simulator

CFG = parse_config_text("[cluster]\ngpus = 2\n[[queues]]\nname = 'a'\nnominal = { gpus = 2 }\n")


def test_unknown_checkpoint_mode_is_a_config_error_naming_the_value():
    options = SimOptions(checkpoint_mode="sometimes")
    with pytest.raises(
        ConfigError, match="checkpoint_mode must be 'aware' or 'periodic', not 'sometimes'"
    ):
        Simulator([], CFG, POLICIES["fifo"], options)
