"""preemptible.sim.evaluation.trace_goals: a policy judged against the goals on the named traces
(as benchmarks/policy_quality.py judges them)."""

import pytest

from preemptible.sim.evaluation.trace_goals import checks, dominated_by, peer_counts


def summary(p95_by_queue: dict[str, float], least_served_max_s: float) -> dict:
    """The parts of a `summarize()` result that the checks read."""
    return {
        "overall": {
            "demand_ratio": 1.2,
            "goodput_while_arriving": 0.95,
            "lost_share_of_delivered": 0.001,
            "p95_wait_s": max(p95_by_queue.values()),  # a stand-in for the overall p95
            "max_wait_least_served_s": least_served_max_s,
            "utilization": 0.9,
        },
        "queues": {q: {"p95_wait_s": s} for q, s in p95_by_queue.items()},
    }


def test_p95_is_judged_per_queue_against_the_best_other_policy():
    policies = {
        "a": summary({"x": 1000, "y": 1000}, 500),
        "b": summary({"x": 500, "y": 4000}, 900),
        "c": summary({"x": 4000, "y": 800}, 900),
    }
    c = checks(policies, judged="a")
    # x: 1000 against b's 500; y: 1000 against c's 800. The worst is x at 2x.
    assert c["worst_queue"] == "x"
    assert c["worst_p95_ratio"] == pytest.approx(2.0)
    assert not c["p95_ok"]
    assert c["least_served_ok"]  # 500 s against 900 s
    assert c["least_served_ratio"] == pytest.approx(500 / 900)


def test_the_milder_readings_use_one_policy_for_p95_and_same_quota_peers_for_max_wait():
    policies = {
        "preemptible": summary({"x": 1000, "y": 1000}, 500),
        "fifo": summary({"x": 4000, "y": 4000}, 300),  # no quotas: left out of the max wait
        "kueue": summary({"x": 500, "y": 1050}, 900),  # the best overall p95 of the others
        "slurm": summary({"x": 3000, "y": 800}, 400),
    }
    c = checks(policies)
    assert c["single_best_p95_policy"] == "kueue"
    assert c["worst_p95_ratio_single_best"] == pytest.approx(2.0)  # x: 1000 against 500
    assert not c["p95_single_best_ok"]
    assert c["least_served_ratio_same_quotas"] == pytest.approx(500 / 900)
    assert c["least_served_same_quotas_ok"]
    assert not c["milder_ok"]  # the p95 reading fails
    policies["preemptible"] = summary({"x": 520, "y": 1000}, 500)  # x within 10% of kueue's
    assert checks(policies)["milder_ok"]
    assert not c["least_served_ok"]  # fifo's 300 s is lower


def test_waits_under_a_minute_count_as_a_minute():
    policies = {"a": summary({"x": 50}, 100), "b": summary({"x": 5}, 100)}
    c = checks(policies, judged="a")
    assert c["worst_p95_ratio"] == pytest.approx(1.0)
    assert c["p95_ok"]


def test_an_equal_max_wait_is_not_lower():
    policies = {"a": summary({"x": 60}, 100), "b": summary({"x": 60}, 100)}
    assert not checks(policies, judged="a")["least_served_ok"]
    assert not checks(policies, judged="b")["least_served_ok"]


def test_peer_counts_judges_every_policy_against_the_others():
    trace_1 = {
        "policies": {
            "a": summary({"x": 100}, 500),  # best p95 and best max wait: both goals
            "b": summary({"x": 400}, 900),
        }
    }
    trace_2 = {
        "policies": {
            "a": summary({"x": 400}, 900),  # worse p95, lower max wait: one goal
            "b": summary({"x": 100}, 950),  # best p95, higher max wait: the other goal
        }
    }
    counts = peer_counts({"t1": trace_1, "t2": trace_2})
    assert counts == {
        "a": {"p95_ok": 1, "least_served_ok": 2, "both": 1, "undominated": 2},
        "b": {"p95_ok": 1, "least_served_ok": 0, "both": 0, "undominated": 1},
    }


def test_a_policy_is_dominated_only_by_one_better_on_both_waits():
    policies = {
        "a": summary({"x": 1000}, 5000),
        "b": summary({"x": 800}, 5000),  # better p95, same max wait: dominates a
        "c": summary({"x": 500}, 9000),  # better p95, worse max wait: dominates nobody
        "d": summary({"x": 30}, 40),  # both under a minute: the same point as e
        "e": summary({"x": 50}, 59),
    }
    assert dominated_by(policies, "a") == ["b", "d", "e"]
    assert dominated_by(policies, "c") == ["d", "e"]
    assert dominated_by(policies, "d") == []
    assert dominated_by(policies, "e") == []


def test_checks_on_a_real_replay_judge_ours_by_default(small_report):
    policies = small_report["policies"]
    assert checks(policies) == checks(policies, judged="preemptible")
    counts = peer_counts({"small": {"policies": policies}})
    assert set(counts) == set(policies)
    for policy, n in counts.items():
        c = checks(policies, judged=policy)
        assert n["both"] == (c["p95_ok"] and c["least_served_ok"])
        assert n["undominated"] == (not dominated_by(policies, policy))
