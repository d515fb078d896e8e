"""How many GPUs this machine has, for ``gpus = "auto"``, and how they are linked, for
``topology = "auto"``: asked of NVML, the driver's own library.

NVML (``pynvml``, from the ``nvml`` extra, package nvidia-ml-py) counts the devices the way
nvidia-smi numbers them, which is the numbering the executor hands out (it sets
``CUDA_DEVICE_ORDER=PCI_BUS_ID``). Rejected: ``torch.cuda.device_count()``, which would import
torch into the manager and initialise CUDA in it, and honours the manager's own
``CUDA_VISIBLE_DEVICES``; parsing ``nvidia-smi -L``, a text format with no promise of stability.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from preemptible.errors import ConfigError
from preemptible.queue.core.topology import Topology

_SET_A_NUMBER = 'or set `gpus` to a number in the [cluster] table instead of "auto"'


def detect_gpus() -> int:
    """Count the machine's NVIDIA GPUs (all of them: ``CUDA_VISIBLE_DEVICES`` is not applied).

    Raises:
        ConfigError: nvidia-ml-py is not installed, the NVIDIA driver is missing or not loaded,
            or NVML sees no GPU; the message says how to set the number by hand.
    """
    nvml = _import_nvml()
    try:
        nvml.nvmlInit()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        finally:
            nvml.nvmlShutdown()
    except nvml.NVMLError as error:
        raise ConfigError(
            f'gpus = "auto" needs an NVIDIA driver, and NVML failed: {error}; install or load '
            f"the driver, {_SET_A_NUMBER}"
        ) from error
    if count < 1:
        raise ConfigError(f'gpus = "auto" found no GPU through NVML; {_SET_A_NUMBER}')
    return count


def _import_nvml() -> ModuleType:
    try:
        # By name, not `import pynvml`: an optional extra, imported only when "auto" asks for it.
        return importlib.import_module("pynvml")
    except ImportError as error:
        raise ConfigError(
            'gpus = "auto" needs nvidia-ml-py and an NVIDIA driver: '
            f"pip install 'preemptible[nvml]', {_SET_A_NUMBER}"
        ) from error


# NVML's constants, as pynvml names them (stable parts of the driver's ABI).
_P2P_CAPS_INDEX_NVLINK = 3
_P2P_STATUS_OK = 0
_TOPOLOGY_MULTIPLE = 20
"""Common ancestor at most this far (several PCIe switches, no host bridge): one PCIe tree."""
_TOPOLOGY_NODE = 40
"""Common ancestor at most this far (host bridges within one NUMA node): one socket."""


def detect_topology() -> Topology:
    """The machine's GPU topology, from NVML: NVLink islands (GPUs that reach each other over
    NVLink, directly or through others), PCIe trees (no host bridge between them) and sockets
    (no link across NUMA nodes), as `nvidia-smi topo -m` shows them.

    Raises:
        ConfigError: as `detect_gpus`, with how to write the topology in the file instead.
    """
    nvml = _import_nvml()
    try:
        nvml.nvmlInit()
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

            def nvlinked(a: int, b: int) -> bool:
                status = nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], _P2P_CAPS_INDEX_NVLINK)
                return bool(status == _P2P_STATUS_OK)

            def within(level: int) -> Callable[[int, int], bool]:
                def close(a: int, b: int) -> bool:
                    ancestor = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
                    return bool(int(ancestor) <= level)

                return close

            groups = {
                "islands": _components(count, nvlinked),
                "pcie": _components(count, within(_TOPOLOGY_MULTIPLE)),
                "sockets": _components(count, within(_TOPOLOGY_NODE)),
            }
        finally:
            nvml.nvmlShutdown()
    except nvml.NVMLError as error:
        raise ConfigError(
            f'topology = "auto" needs an NVIDIA driver, and NVML failed: {error}; write the '
            "islands, pcie and sockets in [cluster.topology] instead"
        ) from error
    return Topology.from_groups(count, groups)


def _components(count: int, linked: Callable[[int, int], bool]) -> list[list[int]]:
    """The groups of 0..count-1 that `linked` joins, directly or through others."""
    parent = list(range(count))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a in range(count):
        for b in range(a + 1, count):
            if root(a) != root(b) and linked(a, b):
                parent[root(b)] = root(a)
    found: dict[int, list[int]] = {}
    for i in range(count):
        found.setdefault(root(i), []).append(i)
    return list(found.values())
