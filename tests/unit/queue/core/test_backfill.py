"""The reservation's plan by node and the per-node backfill test (backfill.py)."""

import dataclasses
import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptible.queue.core import POLICIES, Resources
from preemptible.queue.core.backfill import (
    Release,
    _merged,
    _plan_nodes,
    may_backfill,
    plan_reservation,
)
from preemptible.queue.core.negotiation import min_runtime_seconds
from preemptible.queue.core.placement import NodePool
from preemptible.queue.core.preemption import loans_due
from preemptible.queue.core.resources import Amounts

from .factories import config, job, running, snapshot

INF = float("inf")


def on(node_gpus, j, **kw):
    """A running job placed on the given (node, GPUs) pairs."""
    return dataclasses.replace(running(j, **kw), placement=tuple(node_gpus))


def plan(cfg, busy, head, now, *, loans=False):
    st = snapshot(cfg, running_jobs=busy).state
    free = Amounts(cfg.cluster.gpus - st.used.gpus, INF, INF)
    due = due_back(cfg, st, head, now) if loans else None
    return plan_reservation(head, now=now, state=st, free=free, pool=st.pool.copy(), loans_due=due)


def due_back(cfg, st, head, now, policy=POLICIES["preemptible"]):
    return loans_due(
        head, now=now, state=st, alloc=st.alloc, policy=policy, settings=cfg.preemption
    )


def test_a_gang_reserves_the_node_that_empties_first_plus_one_for_its_remainder():
    cfg = config(gpus=12, nodes=3)  # 3 nodes x 4 GPUs
    busy = [
        on([(0, 4)], job("a", gpus=4, estimate=100.0, restore=0.0)),
        on([(1, 2)], job("b", gpus=2, estimate=50.0, restore=0.0)),
        on([(1, 2)], job("c", gpus=2, estimate=500.0, restore=0.0)),
        on([(2, 4)], job("d", gpus=4, estimate=300.0, restore=0.0)),
    ]
    res = plan(cfg, busy, job("gang", gpus=6), now=0.0)
    # t=50: b frees 2 on node 1, no node is empty yet; t=100: a empties node 0.
    assert res.start_at == pytest.approx(100.0)
    assert res.node_spare == {0: 0, 1: 0}
    elsewhere, held = job("x", gpus=2, estimate=1000.0), job("y", gpus=2, estimate=1000.0)
    assert may_backfill(elsewhere, ((2, 2),), res, now=0.0, default_estimate_s=3600.0)
    assert not may_backfill(held, ((1, 2),), res, now=0.0, default_estimate_s=3600.0)
    assert res.node_spare == {0: 0, 1: 0}  # a refused job takes nothing


def test_spare_on_a_held_node_counts_only_gpus_sure_to_be_free_by_the_start():
    cfg = config(gpus=8, nodes=2)  # 2 nodes x 4 GPUs
    busy = [
        on([(0, 2)], job("late", gpus=2, estimate=10.0, restore=0.0)),  # overran by t=100
        on([(0, 1)], job("soon", gpus=1, estimate=200.0, restore=0.0)),
        on([(1, 4)], job("full", gpus=4, estimate=5000.0, restore=0.0)),
    ]
    res = plan(cfg, busy, job("pair", gpus=2), now=100.0)
    # Node 0 has 1 GPU free; "late" counts as ending now, so the pair is due now on node 0. But
    # nobody knows when "late" really ends: its GPUs are not spare, and the free one is needed.
    assert res.start_at == pytest.approx(100.0)
    assert res.node_spare == {0: 0}
    small = job("s", gpus=1, estimate=1000.0)
    assert not may_backfill(small, ((0, 1),), res, now=100.0, default_estimate_s=3600.0)


def test_without_nodes_the_plan_counts_gpus():
    cfg = config(gpus=4, queues={"a": (1.0, 4, INF)})
    busy = [running(job("x", gpus=2, estimate=3600.0, restore=0.0), started=0.0)]
    st = snapshot(cfg, running_jobs=busy).state
    res = plan_reservation(job("head", gpus=4), now=100.0, state=st, free=Amounts(2, INF, INF))
    assert res.start_at == pytest.approx(3600.0) and res.node_spare == {}
    assert res.spare == Amounts(0, INF, INF)


def test_the_plan_counts_loans_as_the_heads_once_it_may_take_them_back():
    cfg = config(gpus=8, nodes=2)  # 2 nodes x 4 GPUs
    lent = job("lent", gpus=4, estimate=10_000.0, restore=0.0)
    busy = [
        on([(0, 4)], lent, loan_for="head"),  # expected to run long, but the head's to take back
        on([(1, 4)], job("plain", gpus=4, estimate=2_000.0, restore=0.0)),
    ]
    head = job("head", gpus=4)
    back = min_runtime_seconds(lent.save_s, lent.restore_s, cfg.preemption)
    assert back < 2_000.0
    # By expected ends, node 1 drains first: the reservation would move off the node its loan
    # runs on, and backfill would fill node 0 with work the head cannot take back.
    by_ends = plan(cfg, busy, head, now=100.0)
    assert (by_ends.start_at, by_ends.node_spare) == (pytest.approx(2_000.0), {1: 0})
    res = plan(cfg, busy, head, now=100.0, loans=True)
    assert (res.start_at, res.node_spare) == (pytest.approx(back), {0: 0})
    # Once the loan is due, the plan says "now".
    later = plan(cfg, busy, head, now=back + 50.0, loans=True)
    assert (later.start_at, later.node_spare) == (pytest.approx(back + 50.0), {0: 0})


def test_a_due_loan_breaks_the_tie_between_nodes_that_free_up_at_once():
    cfg = config(gpus=8, nodes=2)
    # Both nodes hold a job past its estimate (expected to end now); node 1 has one more GPU
    # free, node 0 has two GPUs on loan to the head that are due back.
    busy = [
        on([(0, 2)], job("old-0", gpus=2, estimate=10.0, restore=0.0)),
        on([(0, 2)], job("lent", gpus=2, estimate=9_000.0, restore=0.0), loan_for="head"),
        on([(1, 3)], job("old-1", gpus=3, estimate=10.0, restore=0.0)),
    ]
    res = plan(cfg, busy, job("head", gpus=4), now=5_000.0, loans=True)
    assert res.node_spare == {0: 0}
    assert plan(cfg, busy, job("head", gpus=4), now=5_000.0).node_spare == {1: 0}


@pytest.mark.parametrize(
    ("case", "loan", "counted"),
    [
        ("own queue", {}, True),
        ("borrowing queue", {"queue": "b"}, True),
        ("lower tier", {"tier": "low"}, True),
        ("queue within its nominal quota", {"queue": "c"}, False),
        ("higher tier", {"tier": "high"}, False),
        ("lent to another job", {"loan_for": "other"}, False),
        ("already told to go", {"terminating": True}, False),
    ],
)
def test_loans_due_are_those_the_head_may_take_back(case, loan, counted):
    cfg = config(gpus=16, queues={"a": (1.0, 8, INF), "b": (1.0, 4, INF), "c": (1.0, 4, INF)})
    lent = job("loan", gpus=2, queue=loan.get("queue", "a"), tier=loan.get("tier", "normal"))
    busy = [
        running(lent, started=0.0, loan_for=loan.get("loan_for", "head")),
        # Another loan keeps the head among those with loans, so each row tests its own rule.
        running(job("steady", gpus=1), started=0.0, loan_for="head"),
        running(job("b-own", queue="b", gpus=4), started=0.0),  # b at its quota
    ]
    st = snapshot(cfg, running_jobs=busy).state
    if loan.get("terminating"):
        st.mark_terminating("loan", expected_end=60.0)
    due = due_back(cfg, st, job("head", gpus=8), now=1.0)
    back = pytest.approx(min_runtime_seconds(10.0, 10.0, cfg.preemption))
    assert due == ({"loan": back, "steady": back} if counted else {"steady": back}), case


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, "after the minimum runtime"),
        ({"protect_min_runtime": False}, "now"),
        ({"loan_backfill": False}, "never"),
    ],
)
def test_when_a_loan_is_due_depends_on_the_policy(change, expected):
    cfg = config(gpus=8, queues={"a": (1.0, 8, INF)})
    st = snapshot(cfg, running_jobs=[running(job("loan", gpus=2), loan_for="head")]).state
    policy = dataclasses.replace(POLICIES["preemptible"], **change)
    due = due_back(cfg, st, job("head", gpus=8), now=1.0, policy=policy)
    back = min_runtime_seconds(10.0, 10.0, cfg.preemption)
    want = {"after the minimum runtime": {"loan": back}, "now": {"loan": 1.0}, "never": {}}
    assert due == pytest.approx(want[expected])


def test_a_loan_expected_to_end_before_it_is_due_frees_its_gpus_at_its_end():
    cfg = config(gpus=8, nodes=2)
    short = job("short", gpus=4, estimate=50.0, restore=0.0)  # ends long before its min runtime
    busy = [
        on([(0, 4)], short, loan_for="head"),
        on([(1, 4)], job("plain", gpus=4, estimate=9_000.0, restore=0.0)),
    ]
    head = job("head", gpus=4)
    assert min_runtime_seconds(short.save_s, short.restore_s, cfg.preemption) > 50.0
    for loans in (False, True):
        res = plan(cfg, busy, head, now=10.0, loans=loans)
        assert (res.start_at, res.node_spare) == (pytest.approx(50.0), {0: 0})


@given(
    first=st.lists(st.integers(0, 20), max_size=30).map(sorted),
    extra=st.lists(st.integers(0, 20), max_size=6).map(sorted),
)
def test_the_releases_merge_as_heapq_merge_does(first, extra):
    # Ties decide which node a reservation drains: running jobs' ends come before the rest's.
    def releases(times, tag):
        return [Release(float(t), Resources(gpus=1), ((i, 1),), tag) for i, t in enumerate(times)]

    a, b = releases(first, True), releases(extra, False)
    expected = list(heapq.merge(a, b, key=lambda r: r.at))
    assert list(_merged(iter(a), b)) == expected


def _first_node_by_definition(free, per, gpus, releases, now):
    """The earliest time, by the releases in time order, at which some node has room for a head
    of `gpus` (up to one node): every node is looked at after each time's releases. Among those
    that fit, the node with the most GPUs free or certainly back now, lowest index first."""
    avail, sure, ready = list(free), list(free), list(free)
    fits = [n for n in range(len(avail)) if avail[n] >= gpus]
    t = now
    rest = sorted(releases, key=lambda r: max(now, r.at))
    while not fits and rest:
        t = max(now, rest[0].at)
        while rest and max(now, rest[0].at) == t:
            r = rest.pop(0)
            for n, g in r.placement:
                avail[n] += g
                if r.certain:
                    sure[n] += g
                    ready[n] += g if t == now else 0
        fits = [n for n in range(len(avail)) if avail[n] >= gpus]
    if not fits:
        return INF, {}
    node = min(fits, key=lambda n: (-ready[n], n))
    return t, {node: max(0, sure[node] - gpus)}


@settings(max_examples=400)
@given(
    used=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    gpus=st.integers(1, 4),
    ends=st.lists(
        st.tuples(
            st.sampled_from([50.0, 100.0, 150.0, 150.0, 300.0]),
            st.integers(0, 5),
            st.integers(1, 2),
            st.booleans(),
        ),
        max_size=12,
    ),
)
def test_a_single_node_plan_is_the_first_time_a_node_has_room(used, gpus, ends):
    """The walk that looks only at the nodes each time's releases touched finds what looking at
    every node after each time finds."""
    now, per = 100.0, 4
    pool = NodePool(len(used), per)
    pool.take([(n, u) for n, u in enumerate(used) if u])
    releases = sorted(
        (
            Release(at, Resources(gpus=g), ((node % len(used), g),), certain)
            for at, node, g, certain in ends
        ),
        key=lambda r: r.at,
    )
    want = _first_node_by_definition(pool.free, per, gpus, releases, now)
    assert _plan_nodes(job("head", gpus=gpus), now, pool, iter(releases)) == want
