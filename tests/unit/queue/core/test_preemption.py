"""Victim choice: what a preemption may take, and that it takes no more than it needs."""

from preemptible.queue.core import POLICIES, RunningJob, schedule
from preemptible.queue.core.model import NO_LIMIT

from .factories import config, job, running, snapshot

OURS = POLICIES["preemptible"]
NOW = 10_000.0
TWO_QUEUES = {"a": (1.0, 4, NO_LIMIT), "b": (1.0, 4, NO_LIMIT)}


def preempted(result):
    return sorted(p.job_id for p in result.preempt)


def on(node: int, j, **kw) -> RunningJob:
    return running(j, node=node, **kw)


def expensive(id: str, **kw):
    """A job that does not save on notice and never checkpointed: costly to preempt."""
    return job(id, aware=False, interval=None, **kw)


def test_reclaim_takes_only_what_the_other_queue_borrows():
    # b holds 5 GPUs against a nominal 4. Its 4-GPU job is the cheapest per GPU, but taking it
    # would leave b with 1 GPU: 3 of its guaranteed GPUs reclaimed for a 1-GPU job.
    cfg = config(gpus=8, queues=TWO_QUEUES)
    busy = [
        running(job("b-big", queue="b", gpus=4)),
        running(expensive("b-small", queue="b")),
        running(job("a-run", queue="a", gpus=3)),
    ]
    snap = snapshot(cfg, pending=[job("a-new", queue="a")], running_jobs=busy)
    result = schedule(snap, NOW, OURS, cfg)
    assert preempted(result) == ["b-small"]
    assert result.preempt[0].kind == "reclaim" and result.preempt[0].reclaim


def test_kueue_takes_any_victim_of_a_queue_that_still_borrows():
    # kueue's only check: the victim's queue borrows before the victim goes. Newest first, it
    # takes b's 4-GPU job and leaves b 3 GPUs below its nominal quota.
    cfg = config(gpus=8, queues=TWO_QUEUES)
    busy = [
        running(job("b-big", queue="b", gpus=4), started=100.0),
        running(expensive("b-small", queue="b")),
        running(job("a-run", queue="a", gpus=3)),
    ]
    snap = snapshot(cfg, pending=[job("a-new", queue="a")], running_jobs=busy)
    assert preempted(schedule(snap, NOW, POLICIES["kueue"], cfg)) == ["b-big"]


def test_reclaim_takes_only_what_the_other_queue_borrows_on_nodes():
    # Two nodes of 4. b borrows 1 GPU; a needs 2 on one node: only node 1, by taking b's
    # expensive job there, frees them without touching b's nominal quota on node 0.
    cfg = config(gpus=8, nodes=2, queues=TWO_QUEUES)
    busy = [on(0, job(f"b{i}", queue="b")) for i in range(4)]
    busy += [on(1, expensive("b4", queue="b")), on(1, job("a-run", queue="a", gpus=2))]
    snap = snapshot(cfg, pending=[job("a-new", queue="a", gpus=2)], running_jobs=busy)
    assert preempted(schedule(snap, NOW, OURS, cfg)) == ["b4"]


def test_reclaim_may_take_a_job_that_straddles_the_quota_when_nothing_smaller_frees_enough():
    # b borrows 1 GPU with a single 5-GPU job: jobs are indivisible, and a's job within its
    # nominal quota is owed that GPU (the nominal guarantee), so the whole job goes.
    cfg = config(gpus=8, queues=TWO_QUEUES)
    busy = [running(job("b-five", queue="b", gpus=5)), running(job("a-run", queue="a", gpus=3))]
    snap = snapshot(cfg, pending=[job("a-new", queue="a")], running_jobs=busy)
    assert preempted(schedule(snap, NOW, OURS, cfg)) == ["b-five"]


def test_a_queue_whose_borrowed_job_is_already_leaving_is_not_reclaimed_from():
    # b holds 5 against a nominal 4, but the fifth is already saving to exit: b borrows nothing
    # once it leaves, so a's 2-GPU job waits for it instead of reclaiming b's guaranteed work.
    cfg = config(gpus=8, queues=TWO_QUEUES)
    busy = [running(job(f"b{i}", queue="b")) for i in range(4)]
    busy.append(running(job("b-leaving", queue="b"), terminating=True))
    busy.append(running(job("a-run", queue="a", gpus=2)))
    snap = snapshot(cfg, pending=[job("a-new", queue="a", gpus=2)], running_jobs=busy)
    assert preempted(schedule(snap, NOW, OURS, cfg)) == []


def test_two_reclaims_in_one_cycle_share_what_the_other_queue_borrows():
    # b borrows 1 GPU. Two jobs of a within nominal quota (two groups: tiers differ) may
    # reclaim it once between them, not once each.
    cfg = config(gpus=8, queues=TWO_QUEUES)
    busy = [running(job(f"b{i}", queue="b")) for i in range(5)]
    busy.append(running(job("a-run", queue="a", gpus=3)))
    pending = [job("a-high", queue="a", tier="high"), job("a-normal", queue="a", at=1.0)]
    result = schedule(snapshot(cfg, pending=pending, running_jobs=busy), NOW, OURS, cfg)
    assert [(p.for_job, p.job_id.startswith("b")) for p in result.preempt] == [("a-high", True)]


def test_clearing_whole_nodes_does_not_depend_on_the_order_a_node_lists_its_jobs():
    # Four nodes of 4. b borrows 2 GPUs with b1 and b2 on node 0; c and d use nodes 1 and 3
    # within their quotas. a's 8-GPU job needs two whole nodes: 2 and 0. kueue may take a
    # queue's jobs while it still borrows before each goes, so whether node 0 can be cleared
    # depends on which of b1 and b2 is considered first: that must be price order (kueue's:
    # newest first), not the order in which a set happens to list them.
    queues = {"a": (1.0, 8, NO_LIMIT), "b": (1.0, 1, NO_LIMIT), "c": (1.0, 4, NO_LIMIT)}
    cfg = config(gpus=16, nodes=4, queues={**queues, "d": (1.0, 3, NO_LIMIT)})
    busy = [
        on(0, job("b1", queue="b"), started=200.0),
        on(0, job("b2", queue="b", gpus=2), started=100.0),
        on(1, job("c4", queue="c", gpus=4)),
        on(3, job("d3", queue="d", gpus=3)),
    ]
    outcomes = set()
    for order in (["b1", "b2"], ["b2", "b1"]):
        snap = snapshot(cfg, pending=[job("a-new", queue="a", gpus=8)], running_jobs=busy)
        snap.state.node_jobs[0] = order  # as a set may list them under another hash seed
        outcomes.add(tuple(preempted(schedule(snap, NOW, POLICIES["kueue"], cfg))))
    assert outcomes == {("b1", "b2")}


def test_the_queue_budget_holds_within_one_cycle():
    # One preemption left this hour: the second high-tier job must not take a second victim,
    # even though its victim search could reuse the first one's candidates.
    cfg = config(gpus=3, queues={"a": (1.0, 3, NO_LIMIT)}, preemption={"queue_budget_per_hour": 1})
    lows = [running(job("low-1", tier="low")), running(job("low-2", tier="low", gpus=2))]
    highs = [job("high-1", tier="high", at=5_000.0), job("high-2", tier="high", gpus=2, at=5_001.0)]
    result = schedule(snapshot(cfg, pending=highs, running_jobs=lows), NOW, OURS, cfg)
    assert preempted(result) == ["low-1"]
    assert "reserved" in result.reason_for("high-2")


def test_a_single_node_job_takes_only_the_victims_it_needs_on_its_node():
    cfg = config(gpus=4, nodes=1, queues={"a": (1.0, 4, NO_LIMIT)})
    busy = [on(0, job("low-1", tier="low")), on(0, job("low-3", tier="low", gpus=3))]
    snap = snapshot(cfg, pending=[job("high", tier="high", gpus=3)], running_jobs=busy)
    assert preempted(schedule(snap, NOW, OURS, cfg)) == ["low-3"]


def test_a_preemption_names_the_nodes_its_job_will_start_on():
    cfg = config(gpus=8, nodes=2, queues={"a": (1.0, 8, NO_LIMIT)})
    busy = [on(0, job("low", tier="low", gpus=4)), on(1, job("normal", gpus=4))]
    snap = snapshot(cfg, pending=[job("high", tier="high", gpus=4)], running_jobs=busy)
    [notice] = schedule(snap, NOW, OURS, cfg).preempt
    assert (notice.job_id, notice.for_nodes) == ("low", ((0, 4),))


def test_the_nodes_a_nominated_job_waits_for_are_held_for_it():
    # N's last victim is saving on node 0, where 2 GPUs are free; node 1 has 2 free too. A
    # 1-GPU job placed best-fit could land on node 0 and leave N (3 GPUs on one node) nowhere
    # to go once the victim exits: the nomination holds node 0.
    cfg = config(gpus=8, nodes=2, queues={"a": (1.0, 8, NO_LIMIT)})
    busy = [
        on(0, job("other")),
        on(0, job("victim", tier="low"), terminating=True),
        on(1, job("two", gpus=2)),
    ]
    pending = [job("N", tier="high", gpus=3, at=0.0), job("small", at=500.0)]
    snap = snapshot(
        cfg,
        pending=pending,
        running_jobs=busy,
        nominated={"N": NOW - 5},
        nominated_nodes={"N": ((0, 3),)},
    )
    result = schedule(snap, NOW, OURS, cfg)
    [admit] = result.admit
    assert admit.job_id == "small" and admit.placement == ((1, 1),)
    assert "preempted for it" in result.reason_for("N")


def test_without_a_minimum_runtime_the_reason_does_not_claim_one():
    cfg = config(gpus=1, queues={"a": (1.0, 1, NO_LIMIT)})
    snap = snapshot(
        cfg,
        pending=[job("high", tier="high", at=100.0)],
        running_jobs=[running(job("low", tier="low"), started=95.0)],
    )
    [kueue] = schedule(snap, 100.0, POLICIES["kueue"], cfg).preempt
    assert "minimum runtime" not in kueue.reason
    snap = snapshot(
        cfg,
        pending=[job("high", tier="high", at=100.0)],
        running_jobs=[running(job("low", tier="low"), started=0.0)],
    )
    [ours] = schedule(snap, NOW, OURS, cfg).preempt
    assert "ran past its minimum runtime" in ours.reason


def test_loans_become_ordinary_work_when_their_job_starts():
    cfg = config(gpus=4, queues={"a": (1.0, 4, NO_LIMIT)})
    snap = snapshot(
        cfg,
        pending=[job("J", gpus=3)],
        running_jobs=[running(job("L"), loan_for="J")],
    )
    st = snap.state
    assert st.loans == {"J": {"L"}}
    st.withdraw("J")  # J is admitted (or cancelled)
    assert st.loans == {}
    assert st.running["L"].loan_for is None
    assert st.running_by_queue["a"]["L"].loan_for is None
    st.finish("L")  # and the loan's exit leaves no stale count behind
    assert st.loans == {} and tuple(st.used) == (0, 0.0, 0.0)


def test_a_huge_restore_claim_does_not_make_a_job_the_last_victim():
    # Two borrowed jobs of b; a's new job needs one GPU back. The claimant saves in a second but
    # claims a week of restore; the honest one has two hours of unsaved work. Counted as
    # negotiated (max_claimed_restore: 30 min by default) the claimant costs less: it goes.
    cfg = config(gpus=4, queues={"a": (1.0, 4, NO_LIMIT), "b": (1.0, 0, NO_LIMIT)})
    claimant = running(job("b-claims", queue="b", save=1.0, restore=7 * 86400.0), started=0.0)
    honest = running(expensive("b-honest", queue="b"), started=NOW - 7200.0)
    others = [running(expensive(f"b-{k}", queue="b"), started=NOW - 7200.0) for k in range(2)]
    snap = snapshot(
        cfg, pending=[job("a-new", queue="a")], running_jobs=[claimant, honest, *others]
    )
    result = schedule(snap, NOW, OURS, cfg)
    assert preempted(result) == ["b-claims"]
