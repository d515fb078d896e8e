"""The reservation's plan by node and the per-node backfill test (backfill.py)."""

import dataclasses

import pytest

from preemptible.queue.core.backfill import may_backfill, plan_reservation

from .factories import config, job, running, snapshot

INF = float("inf")


def on(node_gpus, j, **kw):
    """A running job placed on the given (node, GPUs) pairs."""
    return dataclasses.replace(running(j, **kw), placement=tuple(node_gpus))


def plan(cfg, busy, head, now):
    st = snapshot(cfg, running_jobs=busy).state
    free = [cfg.cluster.gpus - st.used[0], INF, INF]
    return plan_reservation(head, now=now, state=st, free=free, pool=st.pool.copy())


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
    res = plan_reservation(job("head", gpus=4), now=100.0, state=st, free=[2, INF, INF])
    assert res.start_at == pytest.approx(3600.0) and res.node_spare == {}
    assert res.spare == [0, INF, INF]
