"""detect_gpus: the NVML inventory behind `gpus = "auto"`.

There is no GPU and no nvidia-ml-py on the test machines, so the missing-module path runs for
real, and the NVML paths use a small fake `pynvml` put into `sys.modules`: the only mock in the
service tests, because the real library needs an NVIDIA driver. tests/gpu/ is where a real
device would be counted.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable

import pytest

from preemptible.errors import ConfigError
from preemptible.queue.service.gpus import detect_gpus


class FakeNVMLError(Exception):
    """Stands for pynvml.NVMLError (the driver's error codes are its subclasses)."""


def install_fake_nvml(
    monkeypatch: pytest.MonkeyPatch, *, count: int = 4, init_error: str | None = None
) -> list[str]:
    """Put a fake `pynvml` in sys.modules; returns the list of NVML calls it receives."""
    calls: list[str] = []

    def call(name: str, result: object = None) -> Callable[[], object]:
        def nvml_function() -> object:
            calls.append(name)
            if name == "nvmlInit" and init_error is not None:
                raise FakeNVMLError(init_error)
            return result

        return nvml_function

    fake = types.ModuleType("pynvml")
    fake.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    fake.nvmlInit = call("nvmlInit")  # type: ignore[attr-defined]
    fake.nvmlDeviceGetCount = call("nvmlDeviceGetCount", count)  # type: ignore[attr-defined]
    fake.nvmlShutdown = call("nvmlShutdown")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return calls


def test_without_nvidia_ml_py_auto_is_a_config_error_that_says_what_to_do() -> None:
    if importlib.util.find_spec("pynvml") is not None:
        pytest.skip("nvidia-ml-py is installed here; this test needs it absent")

    with pytest.raises(ConfigError) as caught:
        detect_gpus()

    message = str(caught.value)
    assert 'gpus = "auto" needs nvidia-ml-py and an NVIDIA driver' in message
    assert "preemptible[nvml]" in message and "set `gpus` to a number" in message
    assert isinstance(caught.value.__cause__, ImportError)


def test_counts_the_gpus_nvml_sees_and_shuts_nvml_down(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = install_fake_nvml(monkeypatch, count=8)

    assert detect_gpus() == 8
    assert calls == ["nvmlInit", "nvmlDeviceGetCount", "nvmlShutdown"]


def test_a_missing_driver_is_a_config_error_naming_nvmls_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_fake_nvml(monkeypatch, init_error="Driver Not Loaded")

    with pytest.raises(ConfigError, match=r"NVIDIA driver.*Driver Not Loaded.*to a number"):
        detect_gpus()


def test_no_gpu_at_all_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = install_fake_nvml(monkeypatch, count=0)

    with pytest.raises(ConfigError, match="found no GPU"):
        detect_gpus()
    assert calls[-1] == "nvmlShutdown"
