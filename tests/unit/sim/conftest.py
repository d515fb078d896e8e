import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

DATA = Path(__file__).parent / "data"
BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
