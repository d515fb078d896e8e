from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def small_trace() -> Path:
    return DATA / "small_trace.csv"


@pytest.fixture(scope="session")
def small_config() -> Path:
    return DATA / "small_queue.toml"


@pytest.fixture(scope="session")
def small_report(small_trace, small_config):
    from preemptible.cli.sim import run_sim

    return run_sim(trace=small_trace, config=small_config, policy="all")
