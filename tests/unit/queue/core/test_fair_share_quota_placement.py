import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptible.queue.core import Cluster, UsageTracker, dominant_share, fair_share_value
from preemptible.queue.core.placement import NodePool
from preemptible.queue.core.quota import QuotaVerdict, check_quota
from preemptible.queue.core.resources import Amounts

from .factories import queue


@pytest.mark.parametrize(
    ("gpus", "cpus", "mem", "share"),
    [(2, 0, 0, 0.25), (1, 32, 0, 0.5), (0, 0, 192, 0.75), (8, 64, 256, 1.0)],
    ids=["gpu-dominant", "cpu-dominant", "memory-dominant", "everything"],
)
def test_dominant_share_is_the_largest_fraction(gpus, cpus, mem, share):
    cluster = Cluster(gpus=8, cpus=64, memory_gb=256)
    assert dominant_share(gpus, cpus, mem, cluster) == pytest.approx(share)


def test_resources_without_capacity_are_not_scheduled():
    assert dominant_share(2, 1000, 1000, Cluster(gpus=8)) == pytest.approx(0.25)


def test_usage_decays_by_half_each_half_life():
    tracker = UsageTracker(["a"], half_life_s=3600.0)
    tracker.add("a", 1.0)
    tracker.advance(36000.0)  # ten half-lives at full share: average ~ 1
    assert tracker.averages()["a"] == pytest.approx(1.0, rel=1e-3)
    tracker.add("a", -1.0)
    tracker.advance(36000.0 + 3600.0)
    assert tracker.averages()["a"] == pytest.approx(0.5, rel=1e-3)


def test_usage_never_goes_backwards_in_time():
    tracker = UsageTracker(["a"], half_life_s=60.0, now=100.0)
    tracker.add("a", 0.5)
    tracker.advance(50.0)
    assert tracker.averages()["a"] == 0.0


@pytest.mark.parametrize(
    ("usage", "now", "weight", "value"),
    [(0.5, 0.5, 0.5, 1.0), (0.0, 0.0, 0.5, 0.0), (1.0, 1.0, 0.25, 4.0), (0.2, 0.0, 0.1, 1.8)],
    ids=["exactly-fair", "unused", "four-times-fair", "history-only"],
)
def test_fair_share_value_is_blended_share_over_weight(usage, now, weight, value):
    assert fair_share_value(usage, now, weight) == pytest.approx(value)


Q = queue("a", nominal=4, borrow=2)


@pytest.mark.parametrize(
    ("alloc", "req", "verdict"),
    [
        (0, 4, QuotaVerdict.WITHIN_NOMINAL),
        (3, 1, QuotaVerdict.WITHIN_NOMINAL),
        (3, 2, QuotaVerdict.BORROWING),
        (4, 2, QuotaVerdict.BORROWING),
        (4, 3, QuotaVerdict.OVER_LIMIT),
        (0, 7, QuotaVerdict.OVER_LIMIT),
    ],
    ids=[
        "fills-nominal",
        "inside",
        "crosses-into-borrowing",
        "borrows-to-limit",
        "over-limit",
        "too-big",
    ],
)
def test_quota_verdicts(alloc, req, verdict):
    assert check_quota(Q, Amounts(alloc), Amounts(req)) is verdict


def test_missing_borrowing_limit_means_unlimited():
    assert check_quota(queue("a", nominal=1), Amounts(1), Amounts(100)) is QuotaVerdict.BORROWING


def test_small_job_goes_to_the_fullest_node_that_fits():
    pool = NodePool(3, 8)
    pool.take([(0, 6), (1, 3)])
    assert pool.find(2) == ((0, 2),)  # best fit: node 0 has exactly 2 free
    assert pool.find(3) == ((1, 3),)  # node 0 too small; node 1 (5 free) beats empty node 2


def test_large_job_takes_whole_free_nodes():
    pool = NodePool(3, 8)
    pool.take([(1, 1)])
    assert pool.find(16) == ((0, 8), (2, 8))
    assert pool.find(12) == ((0, 8), (1, 4))  # the remainder goes best-fit to a partial node
    pool.take([(0, 1)])
    assert pool.find(16) is None


def test_gang_job_waits_for_a_block_even_when_enough_gpus_are_free():
    pool = NodePool(2, 8)
    pool.take([(0, 4), (1, 4)])
    assert pool.total_free == 8
    assert pool.find(8) is None
    assert pool.fragmentation([8]) == pytest.approx(1.0)
    assert pool.fragmentation([4]) == pytest.approx(0.0)
    assert pool.fragmentation([]) == pytest.approx(1.0)


def test_take_and_give_keep_buckets_consistent():
    pool = NodePool(4, 4)
    places = []
    for g in (3, 1, 4, 2):
        p = pool.find(g)
        assert p is not None
        pool.take(p)
        places.append(p)
    assert pool.total_free == 16 - 10
    for p in places:
        pool.give(p)
    assert pool.total_free == 16 and pool.free == [4, 4, 4, 4]


def _naive_find(free: list[int], per: int, gpus: int, avoid: set[int]):
    """`NodePool.find` by its definition, visiting every node: the fullest node with room for
    a single-node job (lowest index first); whole empty nodes by index plus the best fit for a
    remainder for a larger one."""

    def fullest(room: int, outside: set[int]):
        fits = [n for n in range(len(free)) if n not in outside and free[n] >= room]
        return min(fits, key=lambda n: (free[n], n), default=None)

    if gpus <= per:
        node = fullest(gpus, avoid)
        return None if node is None else ((node, gpus),)
    whole, rest = divmod(gpus, per)
    chosen = [n for n in range(len(free)) if free[n] == per and n not in avoid][:whole]
    if len(chosen) < whole:
        return None
    placement = [(n, per) for n in chosen]
    if rest:
        node = fullest(rest, {*chosen, *avoid})
        if node is None:
            return None
        placement.append((node, rest))
    return tuple(placement)


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.integers(1, 12),
    steps=st.lists(
        st.tuples(st.integers(1, 20), st.sets(st.integers(0, 11), max_size=4), st.booleans()),
        max_size=40,
    ),
)
def test_placement_is_the_fullest_node_lowest_index_first(nodes, steps):
    """The buckets are an index only: every answer is the one a walk over all nodes gives, and
    a copy answers as the original until either changes."""
    per = 4
    pool, placed = NodePool(nodes, per), []
    for gpus, avoid, release in steps:
        if release and placed:
            pool.give(placed.pop(0))
        avoid = {n for n in avoid if n < nodes}
        got = pool.find(gpus, avoid=avoid)
        assert got == _naive_find(pool.free, per, gpus, avoid)
        assert pool.copy().find(gpus, avoid=avoid) == got
        if got is not None:
            pool.take(got)
            placed.append(got)
        assert pool.by_free == [
            [n for n, f in enumerate(pool.free) if f == k] for k in range(per + 1)
        ]
