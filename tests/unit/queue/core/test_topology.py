"""Placement by topology: which GPUs a job gets on machines of several shapes, and which of
equally cheap victims goes first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preemptible.errors import ConfigError
from preemptible.queue.core import POLICIES, parse_config_text, schedule
from preemptible.queue.core.model import NO_LIMIT
from preemptible.queue.core.topology import Topology

from .factories import config, job, running, snapshot

FULLY_CONNECTED = Topology.from_groups(
    8, {"islands": [list(range(8))], "sockets": [list(range(8))]}
)
"""An NVSwitch machine: every GPU reaches every other over NVLink."""
TWO_ISLANDS = Topology.from_groups(
    8, {"islands": [[0, 1, 2, 3], [4, 5, 6, 7]], "sockets": [[0, 1, 2, 3], [4, 5, 6, 7]]}
)
PCIE_ONLY = Topology.from_groups(
    8, {"pcie": [[0, 1], [2, 3], [4, 5], [6, 7]], "sockets": [[0, 1, 2, 3], [4, 5, 6, 7]]}
)
"""No NVLink: pairs under one PCIe switch, two switches a socket."""
MIXED = Topology.from_groups(
    8,
    {"islands": [[0, 1], [2, 3], [4, 5, 6, 7]], "sockets": [[0, 1, 2, 3], [4, 5, 6, 7]]},
)
"""Two NVLink pairs on one socket, a 4-GPU island on the other."""


@pytest.mark.parametrize(
    ("topology", "free", "count", "expected"),
    [
        # one island that fits, the one with the least to spare
        (TWO_ISLANDS, {1, 2, 3, 4, 5, 6, 7}, 3, [1, 2, 3]),
        (TWO_ISLANDS, {1, 2, 3, 4, 5, 6, 7}, 4, [4, 5, 6, 7]),  # lowest ids would split it
        (TWO_ISLANDS, {0, 1, 4, 5, 6}, 2, [0, 1]),
        # no island fits: the fewest islands, the fullest first
        (TWO_ISLANDS, {0, 1, 4, 5, 6}, 4, [0, 4, 5, 6]),
        (FULLY_CONNECTED, {0, 3, 5, 7}, 3, [0, 3, 5]),
        # no NVLink: one PCIe switch, then one socket
        (PCIE_ONLY, {0, 2, 3, 4, 6}, 2, [2, 3]),
        (PCIE_ONLY, {0, 2, 4, 5, 6}, 3, [4, 5, 6]),
        # an island, else a socket: 2 GPUs in one pair before a pair across sockets
        (MIXED, {1, 2, 3, 4, 5}, 2, [2, 3]),
        (MIXED, {0, 2, 4, 5, 6, 7}, 3, [4, 5, 6]),
        (MIXED, {0, 2, 4}, 2, [0, 2]),  # one socket, though not one island
        (Topology.flat(8), {6, 1, 4}, 2, [1, 4]),  # unknown: the lowest ids, as before
    ],
)
def test_a_job_gets_the_closest_gpus_that_fit(topology, free, count, expected):
    assert topology.pick(free, count) == expected


@given(
    st.sampled_from([TWO_ISLANDS, PCIE_ONLY, MIXED, FULLY_CONNECTED]),
    st.sets(st.integers(0, 7), min_size=1),
    st.data(),
)
def test_a_job_spans_as_few_islands_as_the_free_gpus_allow(topology, free, data):
    count = data.draw(st.integers(1, len(free)))
    picked = topology.pick(free, count)
    assert len(picked) == count and set(picked) <= free
    # the fewest islands any choice could span: the islands with the most free GPUs first
    sizes = sorted((len(g & free) for g in topology.islands), reverse=True)
    fewest = next(k for k in range(1, 9) if sum(sizes[:k]) >= count)
    assert topology.islands_spanned(picked) == fewest


def test_a_grow_stays_near_and_a_shrink_keeps_the_fullest_island():
    assert TWO_ISLANDS.grow([4, 5], {0, 1, 6, 7}, 2) == [6, 7]
    assert TWO_ISLANDS.keep([2, 3, 4, 5, 6], 3) == [4, 5, 6]
    assert Topology.flat(8).keep([2, 3, 4, 5, 6], 3) == [2, 3, 4], "as before: the first"


def test_freeing_a_whole_island():
    assert TWO_ISLANDS.frees_an_island(held=[4, 5], free={6, 7})
    assert TWO_ISLANDS.frees_an_island(held=[3, 4], free={5, 6, 7}), "island 1, with 5-7"
    assert not TWO_ISLANDS.frees_an_island(held=[3], free={4, 5, 6, 7}), "not its own island"
    assert not PCIE_ONLY.frees_an_island(held=[0, 1], free=set()), "no island of two there"


def test_a_topology_in_the_config_is_checked_and_described():
    base = '[cluster]\ngpus = 8\n{}\n[[queues]]\nname = "a"\nnominal = {{ gpus = 8 }}\n'
    cfg = parse_config_text(
        base.format("[cluster.topology]\nislands = [[0, 1, 2, 3], [4, 5, 6, 7]]")
    )
    assert cfg.topology is not None and cfg.topology.describe() == "2 NVLink islands of 4"
    assert parse_config_text(base.format('topology = "auto"')).topology_auto
    for table, says in [
        ("[cluster.topology]\nislands = [[0, 1], [1, 2]]", "GPU 1 is in groups 0 and 1"),
        ("[cluster.topology]\nislands = [[0, 8]]", "8 is not a GPU of this machine (0 to 7)"),
        ("[cluster.topology]\nnvlink = [[0, 1]]", "unknown level 'nvlink'"),
        ('topology = "nvml"', 'expected "auto" or a table'),
    ]:
        with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
            parse_config_text(base.format(table))


def test_among_victims_that_lose_as_much_the_one_that_frees_an_island_goes_first():
    cfg = config(gpus=8, queues={"a": (1.0, 4, NO_LIMIT), "b": (1.0, 4, NO_LIMIT)})
    busy = [running(job(f"b{i}", queue="b", gpus=2)) for i in range(3)]
    busy.append(running(job("a-run", queue="a", gpus=2)))
    pending = [job("a-new", queue="a", gpus=2)]

    def victims(rank: dict[str, int]) -> list[str]:
        snap = snapshot(cfg, pending=pending, running_jobs=busy)
        snap.state.victim_rank.update(rank)
        return [p.job_id for p in schedule(snap, 10_000.0, POLICIES["preemptible"], cfg).preempt]

    assert victims({}) == ["b0"], "all alike: the order of old"
    assert victims({"b0": 1, "b1": 1, "b2": 0}) == ["b2"]
