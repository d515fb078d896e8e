"""The victim search's tier lists, shared by the searches of a cycle, list exactly whom one pass
over every running job by the rules of `preemption.py` would, with the same reason each."""

from hypothesis import given, settings
from hypothesis import strategies as st

from preemptible.queue.core import POLICIES
from preemptible.queue.core.ledger import Ledger
from preemptible.queue.core.policy import Policy
from preemptible.queue.core.preemption import (
    VictimSearch,
    _Scope,
    min_runtime_end,
    queue_budget_left,
)
from preemptible.queue.core.quota import QuotaVerdict

from .factories import config, job, running, snapshot

NOW = 10_000.0
QUEUES = ("a", "b", "c")
TIERS = ("low", "normal", "high")


def by_the_rules(search: VictimSearch, head, scope: _Scope) -> list[tuple]:
    """Who may be a victim of `head`, visiting every running job once (the rules, as written)."""
    policy, settings, now, rank = search.policy, search.settings, search.now, head.tier.rank
    across = policy.tier_preemption_across_queues and scope.verdict is not QuotaVerdict.BORROWING
    found = []
    for vq, jobs in search.state.running_by_queue.items():
        borrowing = scope.borrowing[vq]
        reclaim_q = scope.reclaim and borrowing and vq != head.queue
        tier_q = scope.tier and (vq == head.queue or (across and borrowing))
        loan_q = scope.loans and (vq == head.queue or borrowing)
        beyond_q = vq in scope.beyond
        if tier_q and policy.anti_thrashing:
            used = search.budget_used.get(vq, 0)
            left = queue_budget_left(search.state, vq, now, settings, used)
            tier_q = left > 0
        for rj in jobs.values():
            v = rj.job
            if rj.terminating or v.id in search.taken:
                continue
            mature = not policy.protect_min_runtime or now >= min_runtime_end(rj, settings)
            cooled = not policy.anti_thrashing or (
                v.last_preempted_at is None or now - v.last_preempted_at >= settings.cooldown_s
            )
            tier_ok = tier_q and v.tier.rank < rank and mature and cooled
            loan_ok = loan_q and v.tier.rank <= rank and rj.loan_for == head.id and mature
            if not (reclaim_q or beyond_q or tier_ok or loan_ok):
                continue
            if reclaim_q and not loan_ok:
                kind = "reclaim"
            elif tier_ok:
                kind = "tier"
            elif loan_ok:
                kind = "loan"
            else:
                kind = "beyond_limit"
            found.append((v.id, kind))
    return sorted(found)


running_jobs = st.lists(
    st.fixed_dictionaries(
        {
            "queue": st.sampled_from(QUEUES),
            "tier": st.sampled_from(TIERS),
            "started": st.sampled_from([0.0, NOW - 30, NOW - 5_000]),
            "aware": st.booleans(),
            "preempted_at": st.sampled_from([None, NOW - 10, NOW - 50_000]),
            "loan": st.booleans(),
            "terminating": st.booleans(),
        }
    ),
    max_size=14,
)
scopes = st.fixed_dictionaries(
    {
        "reclaim": st.booleans(),
        "tier": st.booleans(),
        "loans": st.booleans(),
        "borrowing": st.sets(st.sampled_from(QUEUES)),
        "beyond": st.sets(st.sampled_from(QUEUES)),
        "verdict": st.sampled_from(list(QuotaVerdict)),
    }
)


@settings(max_examples=300, deadline=None)
@given(
    jobs=running_jobs,
    head_queue=st.sampled_from(QUEUES),
    head_tier=st.sampled_from(TIERS),
    scope=scopes,
    others=st.lists(scopes, max_size=2),
    taken=st.sets(st.integers(0, 13), max_size=3),
    policy=st.sampled_from(["preemptible", "priority", "kueue", "slurm", "fifo"]),
)
def test_the_shared_lists_list_whom_the_rules_do(
    jobs, head_queue, head_tier, scope, others, taken, policy
):
    cfg = config(gpus=64, queues={q: (1.0, 8, float("inf")) for q in QUEUES})
    busy = [
        running(
            job(
                f"r{i}",
                queue=d["queue"],
                tier=d["tier"],
                aware=d["aware"],
                preempted_at=d["preempted_at"],
            ),
            started=d["started"],
            loan_for="head" if d["loan"] else None,
            terminating=d["terminating"],
        )
        for i, d in enumerate(jobs)
    ]
    head = job("head", queue=head_queue, tier=head_tier)
    snap = snapshot(cfg, pending=[head], running_jobs=busy)
    chosen: Policy = POLICIES.get(policy, POLICIES["preemptible"])
    search = VictimSearch(
        now=NOW, state=snap.state, ledger=Ledger(snap.state), policy=chosen, settings=cfg.preemption
    )

    def scope_of(d) -> _Scope:
        borrowing = {q: q in d["borrowing"] for q in QUEUES}
        beyond = frozenset(q for q in d["beyond"] if q != head_queue)
        return _Scope(d["verdict"], d["reclaim"], d["tier"], d["loans"], {}, borrowing, beyond)

    # Earlier searches of the cycle fill the shared lists; then some victims are taken.
    for other in others:
        search._find_eligible(head, scope_of(other))
    for i in taken:
        if i < len(busy):
            search.take(busy[i].job)
    got = search._find_eligible(head, scope_of(scope))
    assert sorted((c.running.job.id, c.kind) for c in got) == by_the_rules(
        search, head, scope_of(scope)
    )
    assert [c.order for c in got] == sorted(c.order for c in got)
