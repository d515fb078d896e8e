"""Moves: small jobs leave a node so that a job blocked only by fragmentation gets a block."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preemptible.queue.core import POLICIES, schedule
from preemptible.queue.core.defrag import _cheapest_first
from preemptible.queue.core.model import NO_LIMIT

from .factories import config, job, running, snapshot
from .test_cycle import state_digest

OURS = POLICIES["preemptible"]
NOW = 10_000.0
ONE_QUEUE = {"a": (1.0, 16, NO_LIMIT)}


def fragmented(small, *, pending=None, **kw):
    """Two nodes of 8: node 0 runs `small` (three 1-GPU jobs), node 1 a 5-GPU job. 8 GPUs are
    free by count, 5 on node 0 and 3 on node 1: no block of 8."""
    cfg = config(gpus=16, nodes=2, queues=ONE_QUEUE, **kw)
    busy = [running(j, node=0) for j in small]
    busy += [running(job("wide", gpus=5), node=1)]
    pending = pending if pending is not None else [job("gang", gpus=8, at=NOW)]
    return cfg, snapshot(cfg, pending=pending, running_jobs=busy)


def test_small_jobs_move_to_free_gpus_elsewhere_so_a_gang_starts():
    cfg, snap = fragmented([job(f"s{i}") for i in range(3)])
    result = schedule(snap, NOW, OURS, cfg)
    moved = sorted(p.job_id for p in result.preempt)
    assert moved == ["s0", "s1", "s2"]
    for p in result.preempt:
        assert p.for_job == "gang" and p.for_nodes == ((0, 8),)
        assert p.restart_on == ((1, 1),)
        assert p.lost_gpu_s == pytest.approx(1 * (10.0 + 10.0))  # one save, one restore
        assert "moves to node 1" in p.reason
    assert "moving s0, s1, s2" in result.pending["gang"]
    assert not result.admit


def test_the_gpus_held_for_the_moved_jobs_are_not_given_away():
    # A 1-GPU job also waits: the three free GPUs on node 1 are the moved jobs', and the five
    # free on node 0 are the gang's.
    late = job("late", at=NOW + 1)
    cfg, snap = fragmented(
        [job(f"s{i}") for i in range(3)], pending=[job("gang", gpus=8, at=NOW), late]
    )
    result = schedule(snap, NOW, OURS, cfg)
    assert len(result.preempt) == 3
    assert not result.admit


@pytest.mark.parametrize(
    "small, why",
    [
        ([job("s0", aware=False), job("s1"), job("s2")], "does not save on notice"),
        ([job("s0", tier="high"), job("s1"), job("s2")], "higher tier than the gang"),
        ([job("s0", preempted_at=NOW - 60), job("s1"), job("s2")], "preempted a minute ago"),
        ([job("s0", save=700.0), job("s1"), job("s2")], "save longer than its grace"),
    ],
)
def test_a_node_moves_only_if_every_job_needed_may_move(small, why):
    cfg, snap = fragmented(small)
    assert not schedule(snap, NOW, OURS, cfg).preempt, why


def test_a_job_moves_only_after_its_minimum_runtime():
    cfg, snap = fragmented([job(f"s{i}") for i in range(3)])
    assert not schedule(snap, 100.0, OURS, cfg).preempt  # started at 0: min runtime 300 s


def test_moves_take_at_most_half_the_gpus_they_make_room_for():
    # Three nodes of 8: five 1-GPU jobs on each of nodes 0 and 1, a 6-GPU job on node 2. 8 GPUs
    # are free by count (3 + 3 + 2), but a block of 8 anywhere means moving 5 GPUs or more.
    cfg = config(gpus=24, nodes=3, queues=ONE_QUEUE)
    busy = [running(job(f"s{n}{i}"), node=n) for n in (0, 1) for i in range(5)]
    busy += [running(job("six", gpus=6), node=2)]
    snap = snapshot(cfg, pending=[job("gang", gpus=8, at=NOW)], running_jobs=busy)
    assert not schedule(snap, NOW, OURS, cfg).preempt
    # With one of node 0's jobs gone, moving its other four (half of 8) is allowed.
    snap = snapshot(cfg, pending=[job("gang", gpus=8, at=NOW)], running_jobs=busy[1:])
    assert sorted(p.job_id for p in schedule(snap, NOW, OURS, cfg).preempt) == [
        "s01",
        "s02",
        "s03",
        "s04",
    ]


def test_moved_jobs_must_fit_elsewhere():
    # Four nodes of 8. Node 0 runs a 2-GPU and a 1-GPU job (5 free); nodes 1 to 3 run 7-GPU
    # jobs (1 free each): 8 free by count, but the 2-GPU job has no block of 2 to move to.
    cfg = config(gpus=32, nodes=4, queues={"a": (1.0, 32, NO_LIMIT)})
    node_0 = [running(job("pair", gpus=2), node=0), running(job("one"), node=0)]
    others = [running(job(f"big{n}", gpus=7), node=n) for n in (1, 2, 3)]
    snap = snapshot(cfg, pending=[job("gang", gpus=8, at=NOW)], running_jobs=node_0 + others)
    assert not schedule(snap, NOW, OURS, cfg).preempt
    # With 2 free on node 3, the pair moves there and the single job to node 1 (best fit).
    others[-1] = running(job("big3", gpus=6), node=3)
    snap = snapshot(cfg, pending=[job("gang", gpus=8, at=NOW)], running_jobs=node_0 + others)
    moves = {p.job_id: p.restart_on for p in schedule(snap, NOW, OURS, cfg).preempt}
    assert moves == {"pair": ((3, 2),), "one": ((1, 1),)}


def test_the_baselines_never_move():
    cfg, snap = fragmented([job(f"s{i}") for i in range(3)])
    for name in ("fifo", "priority", "kueue", "slurm"):
        assert not schedule(snap, NOW, POLICIES[name], cfg).preempt, name


def test_a_moved_job_still_saving_keeps_its_place_and_restarts_there_first():
    cfg = config(gpus=16, nodes=2, queues=ONE_QUEUE)
    s0_moves_to_node_1 = {
        "nominated": {"s0": NOW - 30},
        "nominated_nodes": {"s0": ((1, 1),)},
        "moving": ["s0"],
    }
    saving = running(job("s0"), node=0, terminating=True)
    busy = [saving, running(job("wide", gpus=7), node=1)]
    # Node 1 has one free GPU: s0's new place. A newcomer must not take it while s0 saves.
    pending = [job("newcomer", at=NOW - 5)]
    snap = snapshot(cfg, pending=pending, running_jobs=busy, **s0_moves_to_node_1)
    result = schedule(snap, NOW, OURS, cfg)
    assert [(a.job_id, a.placement) for a in result.admit] == [("newcomer", ((0, 1),))]
    # Once it has exited and is pending again, it takes that place before the older newcomer.
    busy = [running(job("wide", gpus=7), node=1), running(job("fill", gpus=8), node=0)]
    pending += [job("s0", at=NOW - 1, preempted_at=NOW - 30)]
    snap = snapshot(cfg, pending=pending, running_jobs=busy, **s0_moves_to_node_1)
    result = schedule(snap, NOW, OURS, cfg)
    assert [(a.job_id, a.placement) for a in result.admit] == [("s0", ((1, 1),))]


def test_a_cycle_that_moves_does_not_change_its_snapshot():
    cfg, snap = fragmented([job(f"s{i}") for i in range(3)])
    snap.state.nominate("held", NOW - 10, nodes=((1, 1),), moving=True)
    before = state_digest(snap)
    assert schedule(snap, NOW, OURS, cfg).preempt
    assert state_digest(snap) == before


def test_the_defragment_switch_turns_moves_off():
    cfg, snap = fragmented([job(f"s{i}") for i in range(3)], policy={"defragment": False})
    result = schedule(snap, NOW, OURS, cfg)
    assert not result.preempt
    assert "fragmented" in result.pending["gang"]


def test_a_two_node_gang_never_counts_on_a_node_an_earlier_move_fills():
    # Four nodes of 8, each running four 1-GPU jobs: 16 free by count, no whole node. Clearing
    # node 0 moves its jobs to node 1 (best fit, lowest index), so node 1 is no longer a
    # candidate: node 2 is cleared instead, its jobs moving to node 3.
    cfg = config(gpus=32, nodes=4, queues={"a": (1.0, 32, NO_LIMIT)})
    busy = [running(job(f"s{n}{i}"), node=n) for n in range(4) for i in range(4)]
    snap = snapshot(cfg, pending=[job("gang", gpus=16, at=NOW)], running_jobs=busy)
    result = schedule(snap, NOW, OURS, cfg)
    moves = {p.job_id: p.restart_on for p in result.preempt}
    assert moves == {
        **{f"s0{i}": ((1, 1),) for i in range(4)},
        **{f"s2{i}": ((3, 1),) for i in range(4)},
    }
    assert result.preempt[0].for_nodes == ((0, 8), (2, 8))


def test_a_moved_job_that_would_borrow_still_restarts_first():
    # a borrows (8 GPUs against a nominal 4); b has work within its nominal quota waiting. A
    # requeued borrower would take its turn after b's work, but a moved job only changes node.
    cfg = config(gpus=16, nodes=2, queues={"a": (1.0, 4, NO_LIMIT), "b": (1.0, 12, NO_LIMIT)})
    busy = [running(job("fill", gpus=8), node=0), running(job("wide", queue="b", gpus=7), node=1)]
    pending = [job("s0", at=0.0, preempted_at=NOW - 30), job("b-new", queue="b", at=NOW - 60)]
    kw = {"running_jobs": busy, "nominated": {"s0": NOW - 30}, "nominated_nodes": {"s0": ((1, 1),)}}
    result = schedule(snapshot(cfg, pending=pending, moving=["s0"], **kw), NOW, OURS, cfg)
    assert [(a.job_id, a.placement) for a in result.admit] == [("s0", ((1, 1),))]
    # The same job requeued after an ordinary preemption waits its turn behind b's.
    result = schedule(snapshot(cfg, pending=pending, **kw), NOW, OURS, cfg)
    assert [a.job_id for a in result.admit] == ["b-new"]


def test_a_move_holds_only_the_free_gpus_of_the_block_so_others_still_start():
    # Node 0: a movable 3-GPU job (5 free); node 1: 3 free; node 2: 2 free. The gang's block is
    # node 0's 5 free GPUs plus the mover's 3, which nobody else can take anyway: the 2-GPU job
    # behind it still starts on node 2.
    cfg = config(gpus=24, nodes=3, queues={"a": (1.0, 24, NO_LIMIT)})
    busy = [
        running(job("m3", gpus=3), node=0),
        running(job("y5", gpus=5, aware=False), node=1),
        running(job("z6", gpus=6, aware=False), node=2),
    ]
    pending = [job("gang", gpus=8, at=NOW), job("c2", gpus=2, at=NOW + 1)]
    result = schedule(snapshot(cfg, pending=pending, running_jobs=busy), NOW, OURS, cfg)
    assert [(p.job_id, p.restart_on) for p in result.preempt] == [("m3", ((1, 3),))]
    assert [(a.job_id, a.placement) for a in result.admit] == [("c2", ((2, 2),))]


def test_one_bigger_job_moves_when_that_moves_fewer_gpus_than_the_smallest_first():
    # A 6-GPU job: node 0 has 4 free beside a 1-GPU and a 3-GPU job, node 1 has 3 free. The
    # smallest first would move 1 + 3 = 4 GPUs (over the limit of 3); the 3-GPU job alone does.
    cfg = config(gpus=16, nodes=2, queues=ONE_QUEUE)
    busy = [
        running(job("one"), node=0),
        running(job("three", gpus=3), node=0),
        running(job("five", gpus=5, aware=False), node=1),
    ]
    snap = snapshot(cfg, pending=[job("six", gpus=6, at=NOW)], running_jobs=busy)
    result = schedule(snap, NOW, OURS, cfg)
    assert [(p.job_id, p.restart_on) for p in result.preempt] == [("three", ((1, 3),))]


def test_no_move_when_a_node_is_about_to_be_free():
    # Node 0's only job is already leaving: in a moment node 0 is whole, so node 1's three
    # small jobs stay where they are.
    cfg = config(gpus=16, nodes=2, queues=ONE_QUEUE)
    busy = [running(job("v4", gpus=4), node=0, terminating=True)]
    busy += [running(job(f"s{i}"), node=1) for i in range(3)]
    snap = snapshot(cfg, pending=[job("gang", gpus=8, at=NOW)], running_jobs=busy)
    assert not schedule(snap, NOW, OURS, cfg).preempt


def test_a_search_that_finds_no_move_leaves_the_last_victim_search_to_preemption():
    # One victim search per cycle. j is within a's nominal quota and blocked only by
    # fragmentation (3 + 3 free); no move is possible (b's jobs are 5 GPUs, over half of 4),
    # so the one search goes to reclaim, which waits patiently for capacity first.
    cfg = config(gpus=16, nodes=2, queues={"a": (1.0, 8, 16), "b": (1.0, 8, 16)})
    busy = [
        running(job("b0", queue="b", gpus=5), node=0, started=NOW - 10),
        running(job("b1", queue="b", gpus=5), node=1, started=NOW - 10),
    ]
    snap = snapshot(cfg, pending=[job("j", queue="a", gpus=4, at=NOW)], running_jobs=busy)
    one_search = dataclasses.replace(OURS, max_preemption_plans=1)
    assert "before reclaiming what b0 borrowed" in schedule(snap, NOW, one_search, cfg).pending["j"]


def test_the_state_counts_per_node_the_gpus_of_jobs_told_to_go():
    cfg = config(gpus=16, nodes=2, queues=ONE_QUEUE)
    busy = [
        running(job("a", gpus=3), node=0, terminating=True),
        running(job("b", gpus=2), node=0),
        running(job("c", gpus=4), node=1),
    ]
    st = snapshot(cfg, running_jobs=busy).state
    assert st.node_leaving == {0: 3}
    st.mark_terminating("b", expected_end=NOW)
    st.mark_terminating("c", expected_end=NOW)
    assert st.node_leaving == {0: 5, 1: 4}
    st.finish("a")
    st.finish("c")
    assert st.node_leaving == {0: 2}
    st.finish("b")
    assert st.node_leaving == {}


def test_no_move_while_a_node_full_of_leaving_jobs_is_about_to_be_whole():
    # Node 0 has nothing free, but its one 8-GPU job is leaving: it counts as about to be free
    # even though moving anything off it would exceed the limit.
    cfg = config(gpus=24, nodes=3, queues=ONE_QUEUE)
    busy = [running(job("v8", gpus=8), node=0, terminating=True)]
    busy += [running(job(f"s{i}"), node=1) for i in range(3)]
    busy += [running(job("wide", gpus=5, aware=False), node=2)]
    snap = snapshot(cfg, pending=[job("gang", gpus=8, at=NOW)], running_jobs=busy)
    assert schedule(snap, NOW, OURS, cfg).preempt == ()


@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 4)), max_size=30))
def test_options_found_lazily_come_in_the_order_of_sorting_them_all(nodes):
    # Each node: its shortfall, and how many GPUs over it its option moves (0..3), or none (4).
    shortfalls = sorted((short, node) for node, (short, _) in enumerate(nodes))
    looked_at = []

    def option(node, short):
        looked_at.append(node)
        extra = nodes[node][1]
        return None if extra == 4 else (short + extra, node, [])

    every = sorted(o for s, n in shortfalls if (o := option(n, s)) is not None)
    looked_at.clear()
    lazily = _cheapest_first(shortfalls, option)
    assert list(lazily) == every
    looked_at.clear()
    next(_cheapest_first(shortfalls, option), None)
    if shortfalls and nodes[shortfalls[0][1]][1] == 0:
        assert looked_at == [shortfalls[0][1]]  # it moves no more than its shortfall: enough


def test_a_zero_gpu_job_on_a_node_leaves_no_count_behind():
    cfg = config(gpus=16, nodes=2, queues=ONE_QUEUE)
    busy = [running(job("z", gpus=0), node=0, terminating=True), running(job("y", gpus=0), node=1)]
    st = snapshot(cfg, running_jobs=busy).state
    st.mark_terminating("y", expected_end=NOW)
    st.finish("z")
    st.finish("y")
    assert st.node_leaving == {}


def test_a_moved_job_still_saving_keeps_its_place_from_an_earlier_nominee():
    # Nodes of 4. G's block is nodes 1 and 2, where B still saves; B moves to node 3. Node 3 is
    # whole now, so G's best fit would be nodes 1 and 3, although G comes first in the
    # nomination order: B's place stays B's and G waits for B.
    cfg = config(gpus=16, nodes=4, queues=ONE_QUEUE)
    busy = [
        running(job("X", gpus=3, aware=False), node=0),
        running(job("A"), node=0),
        running(job("B", save=30.0), node=2, terminating=True),
    ]
    snap = snapshot(
        cfg,
        pending=[job("G", gpus=8, tier="high", at=NOW - 10)],
        running_jobs=busy,
        nominated={"G": NOW - 5, "B": NOW - 5},
        nominated_nodes={"G": ((1, 4), (2, 4)), "B": ((3, 1),)},
        moving=["B"],
    )
    result = schedule(snap, NOW, OURS, cfg)
    assert result.admit == ()
    assert "preempted for it" in result.reason_for("G")


def test_a_moved_job_that_saved_restarts_while_the_job_it_moved_for_waits_for_another():
    # M2 saved at once and is back; M1 still saves. G's hold must not take M2's place.
    cfg = config(gpus=16, nodes=4, queues=ONE_QUEUE)
    busy = [
        running(job("X", gpus=3, aware=False), node=0),
        running(job("M1", save=100.0), node=1, terminating=True),
        running(job("Y", gpus=3, aware=False), node=3),
    ]
    snap = snapshot(
        cfg,
        pending=[job("G", gpus=8, tier="high", at=NOW - 10), job("M2", preempted_at=NOW - 5)],
        running_jobs=busy,
        nominated={"M1": NOW - 5, "G": NOW - 5, "M2": NOW - 5},
        nominated_nodes={"M1": ((0, 1),), "G": ((1, 4), (2, 4)), "M2": ((3, 1),)},
        moving=["M1", "M2"],
    )
    result = schedule(snap, NOW, OURS, cfg)
    assert [(a.job_id, a.placement) for a in result.admit] == [("M2", ((3, 1),))]
