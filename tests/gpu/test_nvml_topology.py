"""The GPU topology read from a real NVML, and placement on it. Not part of `make test` (no
GPU there): run with `.venv/bin/pytest -m gpu tests/gpu` on a machine with NVIDIA GPUs."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from preemptible.queue.service.gpus import detect_gpus, detect_topology

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("pynvml") is None,
        reason="needs NVIDIA GPUs and nvidia-ml-py",
    ),
]


def test_the_real_topology_covers_every_gpu_once_and_places_jobs_inside_it():
    topology = detect_topology()
    print(f"\n{torch.cuda.get_device_name()} x {topology.gpus}: {topology.describe()}")
    assert topology.gpus == detect_gpus()
    for level in (topology.islands, topology.pcie, topology.sockets):
        assert sorted(g for group in level for g in group) == list(range(topology.gpus))
    everything = set(range(topology.gpus))
    for count in range(1, topology.gpus + 1):
        picked = topology.pick(everything, count)
        assert len(set(picked)) == count and set(picked) <= everything
        largest = max(len(g) for g in topology.islands)
        if count <= largest:
            assert topology.islands_spanned(picked) == 1
