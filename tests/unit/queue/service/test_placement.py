"""Placement by topology under the real manager: real jobs see the GPUs it chose in
CUDA_VISIBLE_DEVICES, and its victim ranks follow what their going would free."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.views import JobState, SubmitRequest
from tests.unit.queue.service.real_managers import no_job_outlives_its_test, real_manager  # noqa: F401 (a fixture)
from tests.unit.queue.service.test_manager import until

PY = sys.executable
# Writes the GPUs it was given, then waits until the test removes the gate.
HOLDER = (
    "import os, sys, time\n"
    "open(sys.argv[1], 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    "while os.path.exists(sys.argv[2]):\n"
    "    time.sleep(0.02)\n"
)


def manager(state: Path, topology: dict | None) -> QueueManager:
    cluster: dict = {"gpus": 8}
    if topology is not None:
        cluster["topology"] = topology
    config = {"cluster": cluster, "queues": [{"name": "a", "nominal": {"gpus": 8}}]}
    return real_manager(config, state)


@pytest.mark.parametrize(
    ("topology", "expected"),
    [
        ({"islands": [[0, 1, 2, 3], [4, 5, 6, 7]]}, ["0,1", "4,5,6,7", "2,3"]),
        (None, ["0,1", "2,3,4,5", "6,7"]),  # no topology: the lowest free ids split the 4
    ],
    ids=["two-islands", "unknown"],
)
def test_a_four_gpu_job_gets_a_whole_island_after_a_two_gpu_one(tmp_path, topology, expected):
    m = manager(tmp_path / "state", topology)
    gate = tmp_path / "gate"
    gate.touch()
    seen = []
    for k, gpus in enumerate((2, 4, 2)):
        out = tmp_path / f"gpus-{k}"
        command = [PY, "-c", HOLDER, str(out), str(gate)]
        job = m.submit(SubmitRequest(queue="a", command=command, gpus=gpus))
        until(m, lambda job=job: m.get_job(job.id).state is JobState.RUNNING)
        until(m, out.exists)
        seen.append((job.id, out))
    assert [until(m, out.read_text) for _, out in seen] == expected
    m.runs.rank_victims()
    ranks = [m.shell.state.victim_rank.get(job_id) for job_id, _ in seen]
    if topology is None:
        assert ranks == [None] * 3, "nothing to rank without islands"
    else:
        # the whole island's job frees it; either 2-GPU job would only with the other
        assert ranks == [1, 0, 1]
    gate.unlink()
    until(m, lambda: all(m.get_job(j).state is JobState.COMPLETED for j, _ in seen))
