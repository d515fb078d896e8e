"""How many GPUs this machine has, for ``gpus = "auto"``: asked of NVML, the driver's own library.

NVML (``pynvml``, from the ``nvml`` extra, package nvidia-ml-py) counts the devices the way
nvidia-smi numbers them, which is the numbering the executor hands out (it sets
``CUDA_DEVICE_ORDER=PCI_BUS_ID``). Rejected: ``torch.cuda.device_count()``, which would import
torch into the manager and initialise CUDA in it, and honours the manager's own
``CUDA_VISIBLE_DEVICES``; parsing ``nvidia-smi -L``, a text format with no promise of stability.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from preemptible.errors import ConfigError

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
