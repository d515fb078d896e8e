"""One test (or table) per rule of the cycle."""

import copy
import dataclasses

import pytest

from preemptible.queue.core import POLICIES, schedule

from .factories import config, job, running, snapshot

OURS = POLICIES["preemptible"]
INF = float("inf")


def admitted(result):
    return [a.job_id for a in result.admit]


def preempted(result):
    return [p.job_id for p in result.preempt]


def state_digest(snap):
    st = snap.state
    return copy.deepcopy(
        (
            dict(st.pending),
            {k: list(g.keys) for k, g in st.groups.items()},
            dict(st.running),
            {k: list(v) for k, v in st.alloc.items()},
            list(st.used),
            list(st.tier_gpus),
            list(st.pool.free) if st.pool else None,
            list(st.ends),
            dict(st.nominated),
            dict(st.nominated_nodes),
            sorted(st.moving),
            {k: list(v) for k, v in st.leaving.items()},
            dict(st.loans),
            dict(snap.usage),
        )
    )


def test_admits_within_nominal_quota_with_a_reason():
    cfg = config()
    r = schedule(snapshot(cfg, pending=[job("j1", gpus=2)]), 0.0, OURS, cfg)
    assert admitted(r) == ["j1"]
    assert r.reason_for("j1") == "admitted: within a's nominal quota"
    assert not r.admit[0].borrowing


def test_borrows_idle_capacity_beyond_nominal():
    cfg = config()
    r = schedule(snapshot(cfg, pending=[job("j1", gpus=6)]), 0.0, OURS, cfg)
    assert admitted(r) == ["j1"] and r.admit[0].borrowing
    assert "borrows idle capacity" in r.reason_for("j1")


def test_over_quota_and_no_idle_capacity_says_so():
    cfg = config()
    busy = [running(job("b1", queue="b", gpus=4), started=0.0)]
    mine = [running(job("a1", gpus=4), started=0.0)]
    r = schedule(
        snapshot(cfg, pending=[job("a2", gpus=1, at=5)], running_jobs=busy + mine), 10.0, OURS, cfg
    )
    assert admitted(r) == []
    assert r.reason_for("a2").startswith("pending: a over quota and no idle capacity to borrow")


def test_a_job_larger_than_its_nominal_quota_says_it_can_only_borrow():
    cfg = config()
    busy = [running(job("b1", queue="b", gpus=4), started=0.0)]
    r = schedule(snapshot(cfg, pending=[job("a6", gpus=6)], running_jobs=busy), 10.0, OURS, cfg)
    assert admitted(r) == []
    assert r.reason_for("a6").startswith(
        "pending: larger than a's nominal quota (4 GPUs), so it can run only on borrowed "
        "capacity, and too little is idle (needs 6 GPUs, 4 free)"
    )
    cfg = config(queues={"a": (1.0, 0, INF), "b": (1.0, 8, INF)})
    r = schedule(snapshot(cfg, pending=[job("a6", gpus=6)], running_jobs=busy), 10.0, OURS, cfg)
    assert r.reason_for("a6").startswith("pending: larger than a's nominal quota (0 GPUs), so it")


@pytest.mark.parametrize(
    ("aware", "setting"), [(False, True), (True, False)], ids=["saves-too-slow", "setting-off"]
)
def test_borrowing_limit_blocks_with_a_reason(aware, setting):
    cfg = config(queues={"a": (1.0, 2, 2), "b": (1.0, 2, INF)}, policy={"beyond_limit": setting})
    r = schedule(snapshot(cfg, pending=[job("a1", gpus=5, aware=aware)]), 0.0, OURS, cfg)
    assert admitted(r) == []
    assert "would exceed its quota (2 GPUs nominal + 2 borrowable)" in r.reason_for("a1")


# --- beyond the borrowing limit (`Policy.beyond_limit`) -----------------------------------------


def test_idle_capacity_goes_beyond_the_limit_to_work_that_saves_on_notice():
    cfg = config(queues={"a": (1.0, 2, 2), "b": (1.0, 6, INF)})
    pending = [job("a1", gpus=4), job("a2", gpus=2, at=1.0), job("a3", gpus=4, at=2.0)]
    r = schedule(snapshot(cfg, pending=pending), 10.0, OURS, cfg)
    # a1 fits within nominal + limit; a2 goes beyond it on the idle GPUs; a3 no longer fits.
    assert admitted(r) == ["a1", "a2"]
    a2 = next(a for a in r.admit if a.job_id == "a2")
    assert a2.borrowing and a2.reason.startswith("admitted beyond a's limit")
    assert "would exceed its quota" in r.reason_for("a3")
    kueue = schedule(snapshot(cfg, pending=pending), 10.0, POLICIES["kueue"], cfg)
    held = sum(j.request.gpus for j in pending if j.id in admitted(kueue))
    assert held <= 4  # the baseline leaves GPUs idle


def test_work_within_limits_goes_first_and_the_rest_goes_beyond():
    cfg = config(queues={"a": (1.0, 2, 0), "b": (1.0, 2, 2)})
    pending = [job("a1", gpus=2), job("a2", gpus=4, at=1.0), job("b1", queue="b", gpus=4, at=2.0)]
    r = schedule(snapshot(cfg, pending=pending), 10.0, OURS, cfg)
    # b1, later in line than a2, starts within b's limit before a2 is lent what is left.
    assert admitted(r) == ["a1", "b1"]
    assert "would exceed its quota" in r.reason_for("a2")


@pytest.mark.parametrize(
    "slow",
    [{"aware": False}, {"save": 900.0}, {"preempted_at": 0.0}],
    ids=["no-save-on-notice", "save-longer-than-grace", "in-cooldown"],
)
def test_only_work_cheap_to_take_back_goes_beyond_the_limit(slow):
    cfg = config(queues={"a": (1.0, 2, 2), "b": (1.0, 4, INF)})
    r = schedule(snapshot(cfg, pending=[job("a1", gpus=6, **slow)]), 60.0, OURS, cfg)
    assert admitted(r) == []


def test_a_borrower_within_its_limit_takes_back_what_went_beyond_another_limit():
    cfg = config(queues={"a": (1.0, 2, 2), "b": (1.0, 2, 4)})
    # a holds 8 GPUs: nominal 2, limit 2, and 4 beyond its limit (two 2-GPU jobs).
    busy = [
        running(job("a4", gpus=4), started=0.0),
        running(job("a2x", gpus=2), started=50.0),
        running(job("a2y", gpus=2), started=60.0),
    ]
    pending = [job("b4", queue="b", gpus=4, at=100.0)]  # 2 within nominal + 2 borrowed
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 120.0, OURS, cfg)
    assert sorted(preempted(r)) == ["a2x", "a2y"]  # the excess only, before any minimum runtime
    assert [p.kind for p in r.preempt] == ["beyond_limit", "beyond_limit"]
    assert all(p.reclaim and not p.loan for p in r.preempt)
    assert "beyond a's borrowing limit" in r.preempt[0].reason
    kueue = schedule(
        snapshot(cfg, pending=pending, running_jobs=busy), 120.0, POLICIES["kueue"], cfg
    )
    assert "b4" not in admitted(kueue)


def test_a_borrower_takes_nothing_from_a_queue_within_its_limit():
    cfg = config(queues={"a": (1.0, 2, 6), "b": (1.0, 2, 4)})
    busy = [running(job("a8", gpus=8), started=0.0)]  # a borrows 6, within its limit
    pending = [job("b4", queue="b", gpus=4, at=100.0)]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 120.0, OURS, cfg)
    assert preempted(r) == []


@pytest.mark.parametrize("policy", list(POLICIES), ids=str)
def test_gang_jobs_are_all_or_nothing(policy):
    cfg = config(gpus=8)
    r = schedule(
        snapshot(cfg, pending=[job("big", gpus=4)], running_jobs=[running(job("x", gpus=5))]),
        10.0,
        POLICIES[policy],
        cfg,
    )
    assert "big" not in admitted(r)


@pytest.mark.parametrize(
    ("pending", "first"),
    [
        ([job("n", tier="normal", at=0), job("h", tier="high", at=5)], "h"),
        ([job("l", tier="low", at=0), job("c", tier="critical", at=5)], "c"),
        ([job("x", at=0), job("w", at=0)], "w"),  # tie: submit time equal -> job id
    ],
    ids=["high-before-normal", "critical-before-low", "tie-by-id"],
)
def test_order_by_tier_then_stable_tie_break(pending, first):
    cfg = config(gpus=1, queues={"a": (1.0, 1, INF)})
    r = schedule(snapshot(cfg, pending=pending), 10.0, OURS, cfg)
    assert admitted(r) == [first]


def test_queue_with_less_decayed_usage_goes_first():
    cfg = config(gpus=1, queues={"a": (1.0, 0, INF), "b": (1.0, 0, INF)})
    pending = [job("a1", queue="a", at=0), job("b1", queue="b", at=1)]
    r = schedule(snapshot(cfg, pending=pending, usage={"a": 0.6, "b": 0.1}), 2.0, OURS, cfg)
    assert admitted(r) == ["b1"]


def test_weight_divides_usage():
    cfg = config(gpus=1, queues={"a": (4.0, 0, INF), "b": (1.0, 0, INF)})
    pending = [job("a1", queue="a", at=1), job("b1", queue="b", at=0)]
    r = schedule(snapshot(cfg, pending=pending, usage={"a": 0.4, "b": 0.2}), 2.0, OURS, cfg)
    assert admitted(r) == ["a1"]  # a: 0.4/0.8 = 0.5 units; b: 0.2/0.2 = 1 unit


def test_aging_overtakes_fair_share_but_never_a_tier():
    cfg = config(gpus=1, queues={"a": (1.0, 0, INF), "b": (1.0, 0, INF)}, policy={"aging": "1h"})
    usage = {"a": 0.5, "b": 0.0}  # a is one fair-share unit ahead of b
    old = job("a-old", queue="a", at=0.0)
    new = job("b-new", queue="b", at=7000.0)
    r = schedule(snapshot(cfg, pending=[old, new], usage=usage), 7200.0, OURS, cfg)
    assert admitted(r) == ["a-old"]  # waited 2 h = 2 units > 1 unit of extra usage
    low_old = job("a-old", queue="a", at=0.0, tier="low")
    r = schedule(snapshot(cfg, pending=[low_old, new], usage=usage), 1e6, OURS, cfg)
    assert admitted(r) == ["b-new"]


def test_fifo_head_blocks_everyone_but_kueue_skips_it():
    cfg = config(gpus=4, queues={"a": (1.0, 4, INF)})
    pending = [job("big", gpus=4, at=0), job("small", gpus=1, at=1)]
    busy = [running(job("x", gpus=2))]
    fifo = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 5, POLICIES["fifo"], cfg)
    assert admitted(fifo) == []
    assert "behind the blocked head job big" in fifo.reason_for("small")
    kueue = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 5, POLICIES["kueue"], cfg)
    assert admitted(kueue) == ["small"]


def test_backfill_admits_only_jobs_that_do_not_delay_the_reservation():
    cfg = config(gpus=4, queues={"a": (1.0, 4, INF)})
    busy = [running(job("x", gpus=2, estimate=3600.0, restore=0.0), started=0.0)]
    pending = [
        job("head", gpus=4, at=0, tier="high"),
        job("short", gpus=1, at=1, estimate=600.0, restore=0.0),
        job("long", gpus=1, at=2, estimate=7200.0, restore=0.0),
    ]
    slurm = POLICIES["slurm"]  # the same EASY backfill as ours, without quotas or preemption
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 100.0, slurm, cfg)
    assert admitted(r) == ["short"]
    assert r.reserve[0].job_id == "head" and r.reserve[0].start_at == pytest.approx(3600.0)
    assert "capacity is reserved for it (expected in 58m)" in r.reason_for("head")
    assert r.admit[0].backfill
    assert "would delay the reservation of head" in r.reason_for("long")


def test_a_borrowers_reservation_never_holds_back_work_within_nominal_quota():
    cfg = config(gpus=4, queues={"a": (1.0, 2, INF), "b": (1.0, 2, INF)})
    busy = [running(job("x", queue="a", gpus=2, tier="high", estimate=3600.0), started=0.0)]
    pending = [
        job("a-head", queue="a", gpus=4, at=0, tier="high"),  # would borrow: reserves, no reclaim
        job("b-long", queue="b", gpus=1, at=1, estimate=7200.0),
    ]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 100.0, OURS, cfg)
    assert r.reserve[0].job_id == "a-head"
    assert admitted(r) == ["b-long"] and not r.admit[0].backfill


def test_a_borrowers_reservation_holds_back_its_own_queues_work():
    # a's nominal quota covers a-small but not a-head: a's own small job must not skip ahead of
    # a's older big one for ever (another queue's work within nominal quota would still go).
    cfg = config(gpus=4, queues={"a": (1.0, 3, INF), "b": (1.0, 1, INF)})
    busy = [running(job("x", queue="a", gpus=2, estimate=3600.0, restore=0.0), started=0.0)]
    pending = [
        job("a-head", queue="a", gpus=4, at=0),  # would borrow: reserves
        job("a-small", queue="a", gpus=1, at=1, estimate=9000.0, aware=False),
    ]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 100.0, OURS, cfg)
    assert r.reserve[0].job_id == "a-head"
    assert admitted(r) == []
    assert "would delay the reservation of a-head" in r.reason_for("a-small")


def test_a_reservation_holds_a_node_when_running_jobs_overran_their_estimates():
    # Each node has one free GPU; both nodes' jobs overran, so by counts the 2-GPU head "fits
    # now" with 6 GPUs to spare and 1-GPU work would take both free GPUs, one per node, every
    # time. The reservation holds the node it drains instead.
    cfg = config(gpus=8, nodes=2, queues={"a": (1.0, 8, INF)}, preemption={"enabled": False})
    busy = [
        dataclasses.replace(
            running(job(f"x{n}", gpus=3, estimate=600.0, restore=0.0)), placement=((n, 3),)
        )
        for n in range(2)
    ]
    pending = [
        job("pair", gpus=2, at=0),
        job("s1", gpus=1, at=1, estimate=36000.0),
        job("s2", gpus=1, at=2, estimate=36000.0),
    ]
    slurm = POLICIES["slurm"]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 7200.0, slurm, cfg)
    assert r.reserve[0].job_id == "pair"
    assert admitted(r) == ["s1"] and r.admit[0].placement == ((1, 1),)  # off the held node
    assert "would delay the reservation of pair" in r.reason_for("s2")


def test_work_within_nominal_quota_past_a_borrowers_reservation_uses_up_its_spare():
    # Without nominal_first the borrower's head comes first and reserves node 0, which frees
    # room for it plus one GPU at t=1h. b's job within nominal quota may pass the borrower's
    # reservation; it lands on node 0 and takes that one spare GPU, so c's long job may not.
    policy = dataclasses.replace(OURS, nominal_first=False, loan_backfill=False)
    cfg = config(
        gpus=8,
        nodes=2,
        queues={"a": (1.0, 0, INF), "b": (1.0, 4, INF), "c": (1.0, 0, INF)},
        preemption={"enabled": False},
    )
    busy = [
        dataclasses.replace(
            running(job("x0", gpus=2, estimate=3600.0, restore=0.0)), placement=((0, 2),)
        ),
        dataclasses.replace(
            running(job("x1", gpus=4, estimate=36000.0, restore=0.0)), placement=((1, 4),)
        ),
    ]
    pending = [
        job("head", gpus=3, at=0.0),
        job("b-small", queue="b", gpus=1, at=1.0),
        job("c-long", queue="c", gpus=1, at=2.0, estimate=36000.0, aware=False),
    ]
    snap = snapshot(cfg, pending=pending, running_jobs=busy, usage={"b": 0.9, "c": 0.95})
    r = schedule(snap, 100.0, policy, cfg)
    assert r.reserve[0].job_id == "head"
    assert admitted(r) == ["b-small"] and r.admit[0].placement == ((0, 1),)
    assert "would delay the reservation of head" in r.reason_for("c-long")


def test_within_a_queue_age_decides_whatever_the_job_size():
    # Both have aged past the cap in a queue above its fair share. Sized by the job, the small
    # one would always go first, and a big job in a backlog of small ones would starve.
    cfg = config(gpus=4, queues={"a": (1.0, 4, INF), "b": (1.0, 0, INF)})
    busy = [running(job("x", gpus=2))]
    pending = [job("big", gpus=2, at=0), job("small", gpus=1, at=100)]
    snap = snapshot(cfg, pending=pending, running_jobs=busy, usage={"a": 0.9})
    r = schedule(snap, 36000.0, OURS, cfg)
    assert admitted(r) == ["big"]


@pytest.mark.parametrize(
    ("limit", "now_h", "b_wait_h", "first"),
    [
        ("1d", 27, 3, "a-old"),
        ("2d", 27, 3, "b-new"),
        (0, 27, 3, "b-new"),
        ("1h", 1.5, 1, "a-old"),
    ],
    ids=["past-the-limit", "before-the-limit", "no-limit", "limit-below-the-aging-cap"],
)
def test_past_the_starvation_limit_the_oldest_job_goes_first_whatever_its_queues_share(
    limit, now_h, b_wait_h, first
):
    # a holds 3 of 4 GPUs, far above its half; b is below its share, and b's job is starving
    # once it has waited past the aging cap (2 h). Without a limit, a's burst waits as long
    # as b keeps busy.
    cfg = config(
        gpus=4,
        queues={"a": (1.0, 0, INF), "b": (1.0, 0, INF)},
        policy={"starvation_limit": limit},
        preemption={"enabled": False},
    )
    busy = [running(job("x", gpus=3))]
    now = now_h * 3600.0
    pending = [job("a-old", at=0.0), job("b-new", queue="b", at=now - b_wait_h * 3600.0)]
    snap = snapshot(cfg, pending=pending, running_jobs=busy, usage={"a": 0.9})
    assert admitted(schedule(snap, now, OURS, cfg)) == [first]


def test_reserve_only_starving_lets_others_skip_ahead_until_the_head_starves():
    policy = dataclasses.replace(OURS, reserve_only_starving=True, loan_backfill=False)
    cfg = config(
        gpus=4,
        queues={"a": (1.0, 4, INF), "b": (1.0, 0, INF)},
        policy={"aging": "1h", "aging_max_units": 2},
        preemption={"enabled": False},
    )
    busy = [running(job("x", queue="b", gpus=2, tier="normal", estimate=3600.0), started=0.0)]
    pending = [
        job("big", queue="a", gpus=4, at=0.0, estimate=600.0),
        job("small", queue="b", gpus=1, at=7000.0, estimate=36000.0),
    ]
    fresh = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 3600.0, policy, cfg)
    assert fresh.reserve == () and admitted(fresh) == ["small"]  # not starving yet: skip ahead
    late = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 7300.0, policy, cfg)
    assert [r.job_id for r in late.reserve] == ["big"]
    assert admitted(late) == [] and "would delay the reservation of big" in late.reason_for("small")


def test_work_that_would_delay_the_reservation_starts_on_loan_if_it_saves_on_notice():
    cfg = config(gpus=4, queues={"a": (1.0, 0, INF)})  # all borrowing: no reclaim
    busy = [running(job("x", gpus=2, estimate=3600.0, restore=0.0), started=0.0)]
    pending = [
        job("head", gpus=4, at=0, tier="high"),  # first in line
        job("plain", gpus=1, at=1, estimate=7200.0, aware=False),
        job("aware", gpus=1, at=2, estimate=7200.0),
        job("burnt", gpus=1, at=3, estimate=7200.0, preempted_at=90.0),  # within the cooldown
    ]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 100.0, OURS, cfg)
    assert r.reserve[0].job_id == "head"
    assert admitted(r) == ["aware"] and r.admit[0].loan_for == "head" and r.admit[0].backfill
    assert "admitted on loan: may delay head" in r.reason_for("aware")
    assert "would delay the reservation of head" in r.reason_for("plain")
    assert "would delay the reservation of head" in r.reason_for("burnt")
    slurm = schedule(
        snapshot(cfg, pending=pending, running_jobs=busy), 100.0, POLICIES["slurm"], cfg
    )
    assert admitted(slurm) == []  # plain EASY backfill: nothing may delay the head


def test_the_reservation_stays_on_the_node_its_loans_run_on():
    cfg = config(gpus=8, nodes=2, queues={"a": (1.0, 0, INF)})  # 2 x 4 GPUs, all borrowing
    lent = job("lent", gpus=2, estimate=36_000.0, restore=0.0)  # due back after 300 s
    busy = [
        dataclasses.replace(running(lent, started=0.0, loan_for="head"), placement=((0, 2),)),
        dataclasses.replace(
            running(job("plain", gpus=4, estimate=3_600.0, restore=0.0), started=0.0),
            placement=((1, 4),),
        ),
    ]
    pending = [job("head", gpus=4, at=0), job("small", gpus=1, at=1)]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 100.0, OURS, cfg)
    # Judged by the loan's expected end, node 1 would drain first and "small" would backfill
    # node 0 for good, where the head could have taken its loan back at t=300.
    assert r.reserve[0].job_id == "head" and r.reserve[0].start_at == pytest.approx(300.0)
    assert admitted(r) == ["small"] and r.admit[0].loan_for == "head"


def test_the_reserved_job_takes_its_loans_back_after_their_minimum_runtime():
    cfg = config(gpus=4, queues={"a": (1.0, 0, INF)})  # all borrowing: no reclaim
    loan = running(job("loan", gpus=2, save=10.0, restore=10.0), started=0.0, loan_for="head")
    plain = running(job("plain", gpus=2, save=10.0, restore=10.0), started=0.0)  # not on loan
    head = job("head", gpus=2, at=0)
    both = snapshot(cfg, pending=[head], running_jobs=[loan, plain])
    assert preempted(schedule(both, 299.0, OURS, cfg)) == []  # floor: max(300 s, 10 x 20 s)
    r = schedule(both, 300.0, OURS, cfg)
    assert preempted(r) == ["loan"] and r.preempt[0].kind == "loan"
    assert r.preempt[0].loan and not r.preempt[0].reclaim
    assert "ran on loan ahead of head's reservation" in r.preempt[0].reason
    assert r.preempt[0].lost_gpu_s == pytest.approx(2 * (10.0 + 10.0))


def test_loans_go_back_only_to_the_first_blocked_job_of_an_equal_or_higher_tier():
    cfg = config(gpus=4, queues={"a": (1.0, 0, INF)})  # all borrowing: no reclaim
    long_ago = 1e5
    high_loan = running(job("high-loan", gpus=2, tier="high"), started=0.0, loan_for="head")
    other = running(job("x", gpus=2, estimate=1e6), started=0.0)
    lower = snapshot(cfg, pending=[job("head", gpus=2)], running_jobs=[high_loan, other])
    assert preempted(schedule(lower, long_ago, OURS, cfg)) == []
    loan = running(job("loan", gpus=2), started=0.0, loan_for="head")
    # The head needs the whole cluster: the loan alone does not make it fit, so it reserves,
    # and the job behind it may not take the loan back.
    pending = [job("head", gpus=4, at=0), job("second", gpus=2, at=1)]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=[loan, other]), long_ago, OURS, cfg)
    assert preempted(r) == [] and r.reserve[0].job_id == "head"


def test_a_loan_goes_back_only_to_the_job_it_was_lent_ahead_of():
    cfg = config(gpus=4, queues={"a": (1.0, 0, INF)})
    lent_elsewhere = running(job("loan", gpus=2), started=0.0, loan_for="someone-else")
    other = running(job("x", gpus=2, estimate=1e6), started=0.0)
    snap = snapshot(cfg, pending=[job("head", gpus=4)], running_jobs=[lent_elsewhere, other])
    r = schedule(snap, 1e5, OURS, cfg)
    assert preempted(r) == [] and r.reserve[0].job_id == "head"


def test_work_within_its_queues_nominal_quota_is_never_taken_back_as_a_loan():
    cfg = config(gpus=8, queues={"a": (1.0, 4, INF), "b": (1.0, 4, INF)})
    b_loan = running(job("b-loan", queue="b", gpus=4), started=0.0, loan_for="a-big")
    snap = snapshot(cfg, pending=[job("a-big", queue="a", gpus=8)], running_jobs=[b_loan])
    assert preempted(schedule(snap, 1e5, OURS, cfg)) == []  # b holds only its nominal 4 GPUs


def test_a_loan_refused_to_one_job_still_goes_to_the_rest_of_its_group():
    cfg = config(gpus=4, queues={"a": (1.0, 0, INF)})
    busy = [running(job("x", gpus=2, estimate=3600.0, restore=0.0), started=0.0)]
    pending = [
        job("head", gpus=4, at=0, tier="high"),
        job("burnt", gpus=1, at=1, preempted_at=90.0),  # within the cooldown: no loan
        job("fresh", gpus=1, at=2),  # same group, no estimate
        job("slow", gpus=1, at=3, save=1000.0),  # its save exceeds any grace: no loan
    ]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 100.0, OURS, cfg)
    assert admitted(r) == ["fresh"] and r.admit[0].loan_for == "head"
    assert "would delay the reservation of head" in r.reason_for("slow")


def test_without_backfill_setting_no_reservation_is_made():
    cfg = config(gpus=4, queues={"a": (1.0, 4, INF)}, policy={"backfill": False})
    busy = [running(job("x", gpus=2, estimate=3600.0), started=0.0)]
    pending = [job("head", gpus=4, at=0), job("long", gpus=1, at=1, estimate=7200.0)]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 100.0, POLICIES["slurm"], cfg)
    assert r.reserve == () and admitted(r) == ["long"]


def test_lower_tier_victim_with_least_lost_work_is_preempted():
    cfg = config(gpus=2, queues={"a": (1.0, 2, INF)})
    fresh_ckpt = running(job("v-fresh", tier="low", aware=False), started=0.0, ckpt=3500.0)
    stale_ckpt = running(job("v-stale", tier="low", aware=False), started=0.0, ckpt=1000.0)
    r = schedule(
        snapshot(
            cfg, pending=[job("h", tier="high", at=3590)], running_jobs=[stale_ckpt, fresh_ckpt]
        ),
        3600.0,
        OURS,
        cfg,
    )
    assert preempted(r) == ["v-fresh"]
    p = r.preempt[0]
    assert p.for_job == "h" and p.kind == "tier" and not p.reclaim
    assert p.lost_gpu_s == pytest.approx(100.0 + 10.0)  # since checkpoint + restore
    assert "tier low yields to high job h" in p.reason
    assert "preempting v-fresh" in r.reason_for("h")


def test_checkpoint_on_notice_victims_lose_only_save_and_restore():
    cfg = config(gpus=1, queues={"a": (1.0, 1, INF)})
    victim = running(job("v", tier="low", aware=True, save=20.0, restore=15.0), started=0.0)
    r = schedule(
        snapshot(cfg, pending=[job("h", tier="high")], running_jobs=[victim]), 4000.0, OURS, cfg
    )
    assert r.preempt[0].lost_gpu_s == pytest.approx(35.0)
    assert r.preempt[0].grace_s == pytest.approx(40.0)  # 1.5 * 20 + 10


def test_no_tier_preemption_before_minimum_runtime():
    cfg = config(gpus=1, queues={"a": (1.0, 1, INF)})
    victim = running(job("v", tier="low", save=30.0, restore=30.0), started=0.0)  # floor 600 s
    r = schedule(
        snapshot(cfg, pending=[job("h", tier="high")], running_jobs=[victim]), 599.0, OURS, cfg
    )
    assert preempted(r) == []
    r = schedule(
        snapshot(cfg, pending=[job("h", tier="high")], running_jobs=[victim]), 600.0, OURS, cfg
    )
    assert preempted(r) == ["v"]


def test_equal_tier_is_never_preempted_without_reclaim():
    cfg = config(gpus=1, queues={"a": (1.0, 1, INF)})
    victim = running(job("v", tier="high"), started=0.0)
    r = schedule(
        snapshot(cfg, pending=[job("h", tier="high")], running_jobs=[victim]), 1e5, OURS, cfg
    )
    assert preempted(r) == []


def test_reclaim_takes_back_borrowed_capacity_regardless_of_tier_and_runtime():
    cfg = config(gpus=4, queues={"a": (1.0, 2, INF), "b": (1.0, 2, INF)})
    borrowers = [running(job(f"a{i}", queue="a", tier="critical"), started=999.0) for i in range(4)]
    r = schedule(
        snapshot(cfg, pending=[job("b1", queue="b", tier="low", at=0)], running_jobs=borrowers),
        1000.0,
        OURS,
        cfg,
    )
    assert len(r.preempt) == 1 and r.preempt[0].reclaim
    assert "b reclaims capacity a borrowed" in r.preempt[0].reason


# Borrowers' saves of 10 s and 200 s: graces of 30 s and 310 s, so a job submitted at 0 may
# wait until 600 - 30 - 60 = 510 s, or 600 - 310 - 60 = 230 s, before it reclaims when it is
# owed its quota within 600 s; within 1800 s, 1200 s longer.
@pytest.mark.parametrize(
    "save, within, until",
    [(10.0, "10m", 510.0), (200.0, "10m", 230.0), (10.0, "30m", 1710.0), (200.0, "30m", 1430.0)],
)
def test_a_job_within_nominal_waits_for_capacity_before_reclaiming_while_the_guarantee_allows(
    save, within, until
):
    cfg = config(
        gpus=4,
        queues={"a": (1.0, 2, INF), "b": (1.0, 2, INF)},
        preemption={"reclaim_within": within},
    )
    borrowers = [running(job(f"a{i}", queue="a", save=save), started=0.0) for i in range(4)]
    pending = [job("b1", queue="b", at=0.0)]

    def cycle(now, policy=OURS):
        return schedule(snapshot(cfg, pending=pending, running_jobs=borrowers), now, policy, cfg)

    early = cycle(until - 1)
    assert early.preempt == () and early.wake_at == until
    assert early.reason_for("b1").startswith("pending: no free capacity; waits up to 1s")
    due = cycle(until)
    assert [p.reclaim for p in due.preempt] == [True] and due.wake_at is None
    assert len(cycle(1.0, POLICIES["kueue"]).preempt) == 1  # the baseline reclaims at once


def test_with_reclaim_within_one_grace_a_victim_at_grace_max_is_reclaimed_at_once():
    # The promise is kept up to EXIT_SLACK_S late here: the victim may take all of grace_max
    # to save, so there is no time left to wait for capacity, and the reclaim goes at once.
    cfg = config(
        gpus=4,
        queues={"a": (1.0, 2, INF), "b": (1.0, 2, INF)},
        preemption={"reclaim_within": "10m"},
    )
    borrowers = [running(job(f"a{i}", queue="a", save=500.0), started=0.0) for i in range(4)]
    r = schedule(
        snapshot(cfg, pending=[job("b1", queue="b", at=0.0)], running_jobs=borrowers),
        0.0,
        OURS,
        cfg,
    )
    assert [(p.reclaim, p.grace_s) for p in r.preempt] == [(True, 600.0)] and r.wake_at is None


@pytest.mark.parametrize("patience", [600.0, 1800.0])
def test_a_higher_tier_waits_for_capacity_before_preempting_a_lower_one(patience):
    cfg = config(gpus=2, queues={"a": (1.0, 2, INF)}, preemption={"tier_patience": patience})
    low = [running(job("low", tier="low"), started=0.0)]
    pending = [job("high", tier="high", gpus=2, at=1000.0)]

    def cycle(now, policy=OURS):
        return schedule(snapshot(cfg, pending=pending, running_jobs=low), now, policy, cfg)

    early = cycle(1000.0 + patience - 1)
    assert early.preempt == () and early.wake_at == 1000.0 + patience
    assert early.reason_for("high") == (
        "pending: no free capacity; waits up to 1s for some to free before preempting "
        "lower-tier low"
    )
    due = cycle(1000.0 + patience)
    assert preempted(due) == ["low"] and not due.preempt[0].reclaim
    impatient = dataclasses.replace(OURS, patient_tier_preemption=False)
    assert preempted(cycle(1000.0, impatient)) == ["low"]
    assert preempted(cycle(1000.0, POLICIES["kueue"])) == ["low"]  # the baseline at once


def test_a_guaranteed_job_taking_a_lower_tier_borrower_waits_as_a_reclaim_does():
    # b's high-tier job is within b's nominal quota and a's low-tier jobs run on what a
    # borrows: that is b's to reclaim, whatever the victims' tier, so it waits as a reclaim
    # does, until 1800 - 30 (their grace) - 60 s after its submission, not `tier_patience`.
    cfg = config(
        gpus=4,
        queues={"a": (1.0, 2, INF), "b": (1.0, 2, INF)},
        preemption={"tier_patience": "10m", "reclaim_within": "30m"},
    )
    a_low = [running(job(f"a{i}", tier="low", gpus=2), started=0.0) for i in range(2)]
    pending = [job("b-high", queue="b", tier="high", gpus=2, at=1000.0)]

    def cycle(now):
        return schedule(snapshot(cfg, pending=pending, running_jobs=a_low), now, OURS, cfg)

    early = cycle(2709.0)
    assert early.preempt == () and early.wake_at == 2710.0
    assert "before reclaiming" in early.reason_for("b-high")
    due = cycle(2710.0)
    assert len(due.preempt) == 1 and due.preempt[0].for_job == "b-high"
    assert due.preempt[0].reclaim and "b reclaims capacity a borrowed" in due.preempt[0].reason
    # Its own queue's lower tier is another matter: that it waits for.
    own = [running(job(f"b{i}", queue="b", tier="low", gpus=2), started=0.0) for i in range(2)]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=own), 1000.0, OURS, cfg)
    assert r.preempt == () and r.wake_at == 1600.0


def test_a_requeued_higher_tier_job_does_not_wait_again():
    # Patience counts from the submission, which a requeue keeps: a job preempted by a still
    # higher tier has waited its turn already.
    cfg = config(gpus=2, queues={"a": (1.0, 2, INF)}, preemption={"tier_patience": "10m"})
    low = [running(job("low", tier="low"), started=0.0)]
    requeued = job("high", tier="high", gpus=2, at=0.0, preempted_at=5000.0)
    r = schedule(snapshot(cfg, pending=[requeued], running_jobs=low), 5100.0, OURS, cfg)
    assert preempted(r) == ["low"]  # 100 s after its requeue, 5,100 s after its submission


def test_while_a_reclaim_waits_later_work_of_its_queue_does_not_reclaim_ahead_of_it():
    # b's new high-tier job waits to reclaim; b's requeued low-tier job, whose own wait is long
    # over, would otherwise take b's nominal room first, and be tier-preempted for it later.
    cfg = config(gpus=4, queues={"a": (1.0, 2, INF), "b": (1.0, 2, INF)})
    borrowers = [running(job(f"a{i}", queue="a", save=10.0), started=0.0) for i in range(4)]
    pending = [
        job("b-new", queue="b", tier="high", gpus=2, at=0.0),
        job("b-old", queue="b", tier="low", gpus=2, at=-5000.0),
    ]

    def cycle(now):
        return schedule(snapshot(cfg, pending=pending, running_jobs=borrowers), now, OURS, cfg)

    early = cycle(100.0)
    assert early.preempt == () and early.wake_at == 510.0
    assert early.reason_for("b-old") == "pending: b-new of b waits to reclaim first"
    assert {p.for_job for p in cycle(510.0).preempt} >= {"b-new"}


@pytest.mark.parametrize("within_s", [600.0, 1800.0])
def test_while_a_reclaim_waits_no_queue_starts_to_borrow_with_a_longer_grace(within_s):
    # b's 4-GPU job waits to reclaim from a (graces of 30 s); two GPUs are free, and c is at its
    # nominal quota: a c job with a 310 s grace would make c a borrower it could not count on.
    # That is the price of a longer `reclaim_within`: c-long is held back for as long as b4
    # waits, until b4 reclaims (`reclaim_within` - 30 s - 60 s after b4's submission).
    cfg = config(
        gpus=8,
        queues={"a": (1.0, 2, INF), "b": (1.0, 4, INF), "c": (1.0, 2, INF)},
        preemption={"reclaim_within": within_s},
    )
    busy = [running(job(f"a{i}", queue="a", gpus=2), started=0.0) for i in range(2)]
    busy += [running(job(f"c{i}", queue="c"), started=0.0) for i in range(2)]
    pending = [
        job("b4", queue="b", gpus=4, at=100.0),
        job("c-long", queue="c", save=200.0, at=0.0),
        job("c-short", queue="c", at=1.0),
        job("b-own", queue="b", tier="low", at=0.0),
    ]

    def cycle(now):
        return schedule(snapshot(cfg, pending=pending, running_jobs=busy), now, OURS, cfg)

    due = 100.0 + within_s - 30 - 60
    for now in (200.0, due - 1):
        r = cycle(now)
        assert r.preempt == () and r.wake_at == due
        assert admitted(r) == ["b-own", "c-short"]
        assert "with a longer grace" in r.reason_for("c-long")
    assert {p.for_job for p in cycle(due).preempt} == {"b4"}
    # When c's running jobs are the slow savers, any c job would make them victims.
    slow_c = busy[:2] + [running(job(f"c{i}", queue="c", save=200.0)) for i in range(2)]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=slow_c), 200.0, OURS, cfg)
    assert admitted(r) == ["b-own"] and "with a longer grace" in r.reason_for("c-long")


def test_reclaim_never_touches_work_within_nominal():
    cfg = config(gpus=4, queues={"a": (1.0, 2, INF), "b": (1.0, 2, INF)})
    own = [running(job(f"a{i}", queue="a", tier="low"), started=0.0) for i in range(2)]
    theirs = [running(job(f"b{i}", queue="b", tier="low"), started=0.0) for i in range(2)]
    r = schedule(
        snapshot(cfg, pending=[job("b9", queue="b", tier="normal")], running_jobs=own + theirs),
        1e5,
        OURS,
        cfg,
    )
    # b is at nominal: it may preempt its own lower tier, never a's guaranteed share
    assert preempted(r) in (["b0"], ["b1"])


def test_recently_preempted_job_is_not_preempted_again_within_cooldown():
    cfg = config(gpus=1, queues={"a": (1.0, 1, INF)}, preemption={"cooldown": "30m"})
    victim = running(job("v", tier="low", preempted_at=9000.0), started=0.0)
    r = schedule(
        snapshot(cfg, pending=[job("h", tier="high")], running_jobs=[victim]), 10000.0, OURS, cfg
    )
    assert preempted(r) == []
    r = schedule(
        snapshot(cfg, pending=[job("h", tier="high")], running_jobs=[victim]), 10801.0, OURS, cfg
    )
    assert preempted(r) == ["v"]


def test_queue_budget_caps_preemptions_per_hour():
    cfg = config(gpus=2, queues={"a": (1.0, 2, INF)}, preemption={"queue_budget_per_hour": 1})
    victims = [running(job(f"v{i}", tier="low"), started=0.0) for i in range(2)]
    pending = [job("h1", tier="high", at=0), job("h2", tier="high", at=1)]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=victims), 5000.0, OURS, cfg)
    assert len(r.preempt) == 1
    r = schedule(
        snapshot(cfg, pending=pending, running_jobs=victims, recent_preemptions={"a": [4000.0]}),
        5000.0,
        OURS,
        cfg,
    )
    assert r.preempt == ()
    # A preemption more than an hour ago no longer counts.
    snap = snapshot(cfg, pending=pending, running_jobs=victims, recent_preemptions={"a": [1300.0]})
    assert len(schedule(snap, 5000.0, OURS, cfg).preempt) == 1


def test_nominated_job_gets_freed_capacity_before_others():
    cfg = config(gpus=2, queues={"a": (1.0, 2, INF)})
    pending = [job("early", at=0.0, tier="high"), job("nominee", gpus=2, at=50.0)]
    r = schedule(snapshot(cfg, pending=pending, nominated={"nominee": 90.0}), 100.0, OURS, cfg)
    assert admitted(r) == ["nominee"]
    assert r.reason_for("nominee") == "admitted: capacity freed by preemption"


# Of any tier: a low-tier nominee would be reclaimed by the normal-tier job just as well.
@pytest.mark.parametrize("tier", ["normal", "low"])
def test_a_nominee_that_would_now_borrow_takes_its_turn_behind_work_within_nominal(tier):
    # a reclaimed a GPU for "a-nominee" within its quota; since then a's other job took a's
    # last nominal GPU, so started now it would borrow the GPU b1 is owed, and b1 reclaim it.
    cfg = config(gpus=3, queues={"a": (1.0, 2, INF), "b": (1.0, 1, INF)})
    busy = [running(job(f"a{i}", queue="a"), started=0.0) for i in range(2)]
    pending = [job("a-nominee", queue="a", tier=tier, at=0.0), job("b1", queue="b", at=50.0)]
    nominated = {"a-nominee": 90.0}
    r = schedule(
        snapshot(cfg, pending=pending, running_jobs=busy, nominated=nominated), 100.0, OURS, cfg
    )
    assert admitted(r) == ["b1"] and r.preempt == ()
    alone = snapshot(cfg, pending=pending[:1], running_jobs=busy, nominated=nominated)
    assert schedule(alone, 100.0, OURS, cfg).reason_for("a-nominee") == (
        "admitted: capacity freed by preemption"
    )


def test_baselines_use_a_fixed_grace_and_newest_victim():
    cfg = config(gpus=1, queues={"a": (1.0, 1, INF)})
    old = running(job("old", tier="low", save=300.0), started=0.0)
    r = schedule(
        snapshot(cfg, pending=[job("h", tier="high")], running_jobs=[old]),
        10.0,
        POLICIES["kueue"],
        cfg,
    )
    assert preempted(r) == ["old"] and r.preempt[0].grace_s == 30.0  # no min runtime in kueue
    assert (
        schedule(
            snapshot(cfg, pending=[job("h", tier="high")], running_jobs=[old]),
            10.0,
            POLICIES["slurm"],
            cfg,
        ).preempt
        == ()
    )


def test_node_placement_and_fragmentation_are_reported():
    cfg = config(gpus=16, nodes=2, queues={"a": (1.0, 16, INF)})
    busy = [running(job("x", gpus=4)), running(job("y", gpus=4))]
    r = schedule(snapshot(cfg, pending=[job("g", gpus=8)], running_jobs=busy), 1.0, OURS, cfg)
    # x and y were placed best-fit on the same node, so the other node is whole for g
    assert admitted(r) == ["g"] and r.admit[0].placement == ((1, 8),)
    cfg = config(gpus=24, nodes=3, queues={"a": (1.0, 24, INF)})
    busy = [running(job("x", gpus=4)), running(job("y", gpus=5)), running(job("z", gpus=6))]
    r = schedule(snapshot(cfg, pending=[job("g", gpus=8)], running_jobs=busy), 1.0, OURS, cfg)
    assert admitted(r) == [] and r.fragmentation == pytest.approx(1.0)
    assert "fragmented" in r.reason_for("g")


@pytest.mark.parametrize("policy", list(POLICIES), ids=str)
def test_the_cycle_does_not_change_its_snapshot(policy):
    cfg = config(gpus=16, nodes=2)
    busy = [running(job(f"r{i}", queue="ab"[i % 2], tier="low"), started=0.0) for i in range(12)]
    pending = [job(f"p{i}", queue="ab"[i % 2], gpus=1 + i % 4, tier="high", at=i) for i in range(9)]
    snap = snapshot(cfg, pending=pending, running_jobs=busy, usage={"a": 0.3, "b": 0.1})
    before = state_digest(snap)
    schedule(snap, 5000.0, POLICIES[policy], cfg)
    assert state_digest(snap) == before


def test_capacity_already_being_freed_is_used_before_preempting_more():
    cfg = config(gpus=8, queues={"a": (1.0, 0, INF), "b": (1.0, 8, INF)})
    borrowers = [running(job(f"a{i}", queue="a", gpus=2), started=0.0) for i in range(4)]
    pending = [job("b0", queue="b", gpus=1, at=0.0), job("b1", queue="b", gpus=1, tier="low")]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=borrowers), 1000.0, OURS, cfg)
    assert len(r.preempt) == 1 and r.preempt[0].for_job == "b0"
    assert r.reason_for("b1") == "pending: waiting for capacity that preempted jobs are freeing"
    kueue = schedule(
        snapshot(cfg, pending=pending, running_jobs=borrowers), 1000.0, POLICIES["kueue"], cfg
    )
    assert len(kueue.preempt) == 2  # the baseline preempts again for the second job


def test_a_higher_tier_borrower_yields_free_capacity_to_lower_tier_work_within_nominal():
    # a is at its nominal quota (4), so its high job would borrow; b's low job is within its
    # nominal quota and would reclaim whatever a got. The free GPU goes to b, nobody is preempted.
    cfg = config()
    busy = [running(job(f"a{i}", queue="a", gpus=1), started=0.0) for i in range(4)]
    busy += [running(job(f"b{i}", queue="b", gpus=1), started=0.0) for i in range(3)]
    pending = [
        job("a-high", queue="a", tier="high", at=0.0),
        job("b-low", queue="b", tier="low", at=5.0),
    ]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 10.0, OURS, cfg)
    assert admitted(r) == ["b-low"] and preempted(r) == []
    # Without lower-tier work within nominal, tier order is unchanged: the borrower goes first.
    r = schedule(snapshot(cfg, pending=pending[:1], running_jobs=busy), 10.0, OURS, cfg)
    assert admitted(r) == ["a-high"]


def test_a_borrower_yields_free_capacity_to_same_tier_work_within_nominal():
    # a has had less than b, so fair share alone would give the free GPU to a, which is at its
    # nominal quota and would borrow it; b, within its nominal quota, would then reclaim it.
    cfg = config()
    busy = [running(job(f"a{i}", queue="a", gpus=1), started=0.0) for i in range(4)]
    busy += [running(job(f"b{i}", queue="b", gpus=1), started=0.0) for i in range(3)]
    pending = [job("a-more", queue="a", at=0.0), job("b-own", queue="b", at=5.0)]
    usage = {"a": 0.1, "b": 0.5}
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy, usage=usage), 10.0, OURS, cfg)
    assert admitted(r) == ["b-own"] and preempted(r) == []
    # kueue orders the same way; with nothing within nominal pending, fair share decides.
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 10.0, POLICIES["kueue"], cfg)
    assert admitted(r) == ["b-own"]
    only_a = snapshot(cfg, pending=pending[:1], running_jobs=busy, usage=usage)
    assert admitted(schedule(only_a, 10.0, OURS, cfg)) == ["a-more"]


@pytest.mark.parametrize("tier", ["low", "normal", "critical"])
def test_a_queues_own_work_within_nominal_never_demotes_its_older_borrower(tier):
    cfg = config()
    busy = [running(job(f"{q}{i}", queue=q, gpus=1), started=0.0) for q in "ab" for i in range(3)]
    pending = [
        job("big", queue="a", gpus=2, tier=tier, at=0.0),  # would borrow: a holds 3 of 4
        job("small", queue="a", gpus=1, tier=tier, at=100.0),  # within a's nominal quota
    ]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 200.0, OURS, cfg)
    assert admitted(r) == ["big"]


def test_a_borrower_does_not_preempt_another_queues_borrowed_work():
    # Both a and b run beyond their nominal quota. a's high job would borrow too: taking b's
    # borrowed low job would only let b reclaim it back, so it waits. Within a's own queue, tier
    # preemption still works.
    cfg = config(queues={"a": (1.0, 2, INF), "b": (1.0, 2, INF), "c": (1.0, 4, INF)})
    busy = [running(job(f"a{i}", queue="a", gpus=1, tier="high"), started=0.0) for i in range(4)]
    busy += [running(job(f"b{i}", queue="b", gpus=1, tier="low"), started=0.0) for i in range(4)]
    pending = [job("a-high", queue="a", tier="high", at=0.0)]
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 7200.0, OURS, cfg)
    assert preempted(r) == []
    busy[0] = running(job("a0", queue="a", gpus=1, tier="low"), started=0.0)
    r = schedule(snapshot(cfg, pending=pending, running_jobs=busy), 7200.0, OURS, cfg)
    assert preempted(r) == ["a0"]
