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
from preemptible.queue.service.gpus import detect_gpus, detect_topology


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


def install_fake_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake `pynvml` for a machine of 8 GPUs: NVLink within 0-3 and within 4-7, a PCIe
    switch per pair, a socket per half (as `nvidia-smi topo -m` would show: NV4, PIX, NODE,
    SYS)."""

    def p2p(a: int, b: int, index: int) -> int:
        assert index == 3, "asks for NVLink (NVML_P2P_CAPS_INDEX_NVLINK)"
        return 0 if a // 4 == b // 4 else 2  # NVML_P2P_STATUS_OK or not supported

    def ancestor(a: int, b: int) -> int:
        if a // 2 == b // 2:
            return 10  # NVML_TOPOLOGY_SINGLE: one PCIe switch
        return 40 if a // 4 == b // 4 else 50  # NODE, SYSTEM

    fake = types.ModuleType("pynvml")
    fake.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    fake.nvmlInit = lambda: None  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    fake.nvmlDeviceGetCount = lambda: 8  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    fake.nvmlDeviceGetP2PStatus = p2p  # type: ignore[attr-defined]
    fake.nvmlDeviceGetTopologyCommonAncestor = ancestor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_the_topology_is_read_from_nvml_links(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_topology(monkeypatch)
    topology = detect_topology()
    assert topology.islands == (frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7}))
    assert topology.pcie == tuple(frozenset({i, i + 1}) for i in range(0, 8, 2))
    assert topology.sockets == topology.islands
    assert topology.describe() == "2 NVLink islands of 4, 4 PCIe switches of 2, 2 sockets of 4"


def test_a_topology_nvml_cannot_read_says_how_to_write_it(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_nvml(monkeypatch, init_error="Driver Not Loaded")
    with pytest.raises(ConfigError, match=r"write the islands, pcie and sockets in \[cluster"):
        detect_topology()
