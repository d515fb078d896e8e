"""The victim index: price terms kept between cycles, and never served for a run that changed."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from preemptible.queue.core import POLICIES, schedule

from .factories import config, job, running, snapshot

OURS = POLICIES["preemptible"]
NOW = 10_000.0
TWO_QUEUES = {"a": (1.0, 4, float("inf")), "b": (1.0, 4, float("inf"))}


def expensive(id: str, **kw):
    """A job that does not save on notice: preempting it loses what it did since its checkpoint."""
    return job(id, aware=False, interval=None, **kw)


def borrowed_pair(cfg):
    # b borrows 4 GPUs; its 2-GPU jobs lose their work since their last checkpoint.
    busy = [
        running(expensive("b-old", queue="b", gpus=2), ckpt=1_000.0),
        running(expensive("b-new", queue="b", gpus=2), ckpt=9_000.0),
        running(expensive("b-own", queue="b", gpus=4)),  # never saved: the dearest
    ]
    return snapshot(cfg, pending=[job("a-new", queue="a", gpus=2)], running_jobs=busy)


def victims(result):
    return sorted(p.job_id for p in result.preempt)


def test_facts_are_kept_between_cycles_and_dropped_when_the_job_ends():
    cfg = config(gpus=8, queues=TWO_QUEUES)
    snap = borrowed_pair(cfg)
    schedule(snap, NOW, OURS, cfg)
    index = snap.state.victim_index
    rj = snap.state.running["b-old"]
    kept = index.facts(rj, OURS, cfg.preemption)
    schedule(snap, NOW + 10, OURS, cfg)
    assert index.facts(rj, OURS, cfg.preemption) is kept
    assert "b-old" in index
    snap.state.finish("b-old")
    assert "b-old" not in index


def test_a_reported_checkpoint_changes_the_price_in_the_next_cycle():
    cfg = config(gpus=8, queues=TWO_QUEUES)
    snap = borrowed_pair(cfg)
    assert victims(schedule(snap, NOW, OURS, cfg)) == ["b-new"]  # saved 1,000 s ago
    snap.state.checkpointed("b-old", NOW - 5)  # now b-old has the least to lose
    assert victims(schedule(snap, NOW, OURS, cfg)) == ["b-old"]


def test_other_settings_are_not_served_the_facts_of_the_last():
    short = config(gpus=8, queues=TWO_QUEUES, preemption={"grace_min": "30s"})
    long = config(gpus=8, queues=TWO_QUEUES, preemption={"grace_min": "200s"})
    snap = borrowed_pair(short)
    assert [p.grace_s for p in schedule(snap, NOW, OURS, short).preempt] == [30.0]
    assert [p.grace_s for p in schedule(snap, NOW, OURS, long).preempt] == [200.0]
    assert [p.grace_s for p in schedule(snap, NOW, OURS, short).preempt] == [30.0]


def test_a_fixed_price_follows_the_rank_it_was_computed_for():
    # Two jobs that save on notice lose the same; the one whose going frees a whole island
    # (rank 0) goes first, and a rank set before the next cycle is seen by it.
    cfg = config(gpus=8, queues=TWO_QUEUES)
    busy = [
        running(job("b-1", queue="b", gpus=2)),
        running(job("b-2", queue="b", gpus=2)),
        running(job("b-own", queue="b", gpus=4)),
    ]
    snap = snapshot(cfg, pending=[job("a-new", queue="a", gpus=2)], running_jobs=busy)
    snap.state.victim_rank.update({"b-1": 0, "b-2": 1})
    assert victims(schedule(snap, NOW, OURS, cfg)) == ["b-1"]
    snap.state.victim_rank.update({"b-1": 1, "b-2": 0})
    assert victims(schedule(snap, NOW, OURS, cfg)) == ["b-2"]


def test_a_new_save_cost_changes_the_grace_in_the_next_cycle():
    cfg = config(gpus=8, queues=TWO_QUEUES)
    snap = borrowed_pair(cfg)
    assert [p.grace_s for p in schedule(snap, NOW, OURS, cfg).preempt] == [30.0]
    slower = snap.state.running["b-new"].job
    snap.state.refresh(dataclasses.replace(slower, save_s=100.0))  # a report: saves take 100 s
    assert [p.grace_s for p in schedule(snap, NOW, OURS, cfg).preempt] == [160.0]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["start", "start-leaving", "leave", "checkpoint", "finish"]),
            st.integers(0, 7),  # which job
            st.sampled_from(["low", "normal", "high", "critical"]),
        ),
        max_size=40,
    )
)
def test_the_staying_lists_are_the_running_jobs_not_told_to_go(ops):
    cfg = config(gpus=64, queues=TWO_QUEUES)
    state = snapshot(cfg).state
    for op, n, tier in ops:
        jid = f"j{n}"
        if op.startswith("start") and jid not in state.running:
            j = job(jid, queue="ab"[n % 2], tier=tier)
            state.start(running(j, terminating=op == "start-leaving"), expected_end=NOW)
        elif jid in state.running and op == "leave":
            state.mark_terminating(jid, expected_end=NOW)
        elif jid in state.running and op == "checkpoint":
            state.checkpointed(jid, NOW)
        elif jid in state.running and op == "finish":
            state.finish(jid)
    expected = {
        (rj.job.queue, rj.job.tier.rank, rj.job.id): rj
        for rj in state.running.values()
        if not rj.terminating
    }
    seen = {
        (queue, rank, jid): rj
        for queue, tiers in state.staying.items()
        for rank, by_id in enumerate(tiers)
        for jid, rj in by_id.items()
    }
    assert seen == expected
    assert all(seen[k] is expected[k] for k in expected)  # the current record, not an old one
