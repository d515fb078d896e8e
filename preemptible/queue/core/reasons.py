"""The words of every decision's reason, in one place.

`why`, the events and the dashboard show these to people: each says what happened or what the
job waits for, in the terms of `docs/user-guide/scheduling.md`. Reasons of pending jobs start with
"pending:", of admissions with "admitted", of notices with "preempted:".
"""

from __future__ import annotations

from collections.abc import Iterable

from preemptible.queue.core.model import GrowPrice, Job, Queue
from preemptible.queue.core.placement import Placement
from preemptible.queue.core.quota import QuotaVerdict, describe_limit, gpus

WAITING_TURN = "pending: waiting for its turn"
NOTHING_TO_PREEMPT = "pending: no free GPUs and nothing it may preempt"
ADMITTED_NOMINEE = "admitted: capacity freed by preemption"
NOMINEE_WAITS = "pending: waiting for the jobs preempted for it to exit"
CAPACITY_INCOMING = "pending: waiting for capacity that preempted jobs are freeing"
BORROWER_BLOCKED = (
    "pending: would borrow with a longer grace than work within nominal quota of another "
    "queue, which waits to reclaim borrowed capacity, can allow for"
)


def behind_strict_head(head: Job) -> str:
    return f"pending: behind the blocked head job {head.id} (strict)"


def over_quota(job: Job, queue: Queue) -> str:
    return f"pending: {job.queue} would exceed its quota ({describe_limit(queue)})"


def admitted(job: Job, verdict: QuotaVerdict, *, quotas: bool) -> str:
    if not quotas:
        return "admitted: capacity free"
    if verdict is QuotaVerdict.BORROWING:
        return f"admitted: {job.queue} borrows idle capacity (reclaimable)"
    return f"admitted: within {job.queue}'s nominal quota"


def admitted_beyond_limit(job: Job, queue: Queue, head: str | None) -> str:
    loan = f"; on loan ahead of {head}'s reservation" if head is not None else ""
    return (
        f"admitted beyond {job.queue}'s limit ({describe_limit(queue)}) on capacity nobody "
        f"else can use now: the first reclaimed when another queue needs it{loan}"
    )


def admitted_by_backfill(head: str) -> str:
    return f"admitted by backfill: does not delay {head}"


def admitted_on_loan(head: str) -> str:
    return (
        f"admitted on loan: may delay {head}, which may preempt it once it has run "
        "its minimum runtime"
    )


def would_delay(head: str) -> str:
    return f"pending: would delay the reservation of {head}"


def blocked(
    job: Job, verdict: QuotaVerdict, *, nominal_gpus: float, free_gpus: int, nodes: bool
) -> str:
    """Why `job` does not fit now; `nodes`: the cluster has nodes (so it may be fragmented)."""
    g = job.request.gpus
    if verdict is QuotaVerdict.BORROWING and g > nominal_gpus:
        head = (
            f"pending: larger than {job.queue}'s nominal quota ({gpus(nominal_gpus)}), so it "
            "can run only on borrowed capacity, and too little is idle"
        )
    elif verdict is QuotaVerdict.BORROWING:
        head = f"pending: {job.queue} over quota and no idle capacity to borrow"
    else:
        head = "pending: no free capacity"
    detail = f"needs {gpus(g)}, {free_gpus} free"
    if nodes and free_gpus >= g:
        detail += "; no node block fits it (fragmented)"
    return f"{head} ({detail})"


def reserved(blocked_reason: str, start_at: float, now: float) -> str:
    """The reservation's start, relative to `now`: the shell's clock may be epoch seconds or a
    trace's, and people read neither."""
    if start_at == float("inf"):
        when = "at a time not yet known"
    else:
        when = f"in {_duration(start_at - now)}" if start_at > now else "now"
    return (
        f"{blocked_reason}; first in line, so capacity is reserved for it (expected {when}) "
        "and smaller jobs backfill only if they do not delay it"
    )


def _duration(seconds: float) -> str:
    """'45s', '12m', '3h 20m': as precise as a reader of a reason needs."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    hours, minutes = divmod(s // 60, 60)
    return f"{hours}h {minutes}m" if minutes else f"{hours}h"


def preempted(
    victim: Job, kind: str, preemptor: Job, *, min_runtime: bool, lost_gpu_s: float
) -> str:
    """Why `victim` got a notice for `preemptor`; `kind` is the victim's `Candidate.kind`."""
    ran = "; ran past its minimum runtime" if min_runtime else ""
    if kind == "loan":
        why = f"preempted: ran on loan ahead of {preemptor.id}'s reservation, which is due{ran}"
    elif kind == "reclaim":
        why = (
            f"preempted: {preemptor.queue} reclaims capacity {victim.queue} borrowed, for "
            f"{preemptor.id} (within its nominal quota)"
        )
    elif kind == "beyond_limit":
        why = (
            f"preempted: ran beyond {victim.queue}'s borrowing limit on idle capacity, which "
            f"{preemptor.id} of {preemptor.queue} needs (within its limit)"
        )
    else:
        tiers = f"tier {victim.tier.value} yields to {preemptor.tier.value}"
        why = f"preempted: {tiers} job {preemptor.id}{ran}"
    return f"{why}; expected loss {_gpu_s(lost_gpu_s)}"


def preempting(victims: Iterable[str]) -> str:
    return f"pending: preempting {', '.join(victims)} to make room; starts when they exit"


def moved(preemptor: Job, restart_on: Placement, lost_gpu_s: float) -> str:
    where = ", ".join(f"node {n}" for n, _ in restart_on)
    return (
        f"preempted: moves to {where} so that {preemptor.id} gets a node block; "
        f"restarts there once saved; expected loss {_gpu_s(lost_gpu_s)}"
    )


def moving(movers: Iterable[str]) -> str:
    return (
        f"pending: moving {', '.join(movers)} to other nodes to make a node block for it; "
        "starts when they have saved"
    )


def reclaimer_waits(waiter: str, queue: str) -> str:
    return f"pending: {waiter} of {queue} waits to reclaim first"


def waits_to_preempt(seconds: float, victims: Iterable[str]) -> str:
    return (
        f"pending: no free capacity; waits up to {seconds:.0f}s for some to free "
        f"before preempting lower-tier {', '.join(victims)}"
    )


def clamped(claim: str, claimed_s: float, counted_s: float, setting: str) -> str:
    """A claim the negotiation counted as less (`negotiation.Clamped`)."""
    claimed, counted = _seconds(claimed_s), _seconds(counted_s)
    if claim == "minimum runtime":
        return f"claims buy a minimum runtime of {claimed} s, counted as {counted} s ({setting})"
    return f"claimed {claim} {claimed} s, counted as {counted} s ({setting})"


def _gpu_s(gpu_seconds: float) -> str:
    """'1440 GPU-s', '0.4 GPU-s': a tenth where whole numbers would read 0 for a real cost."""
    return f"{gpu_seconds:.0f} GPU-s" if gpu_seconds >= 10 else f"{gpu_seconds:.1f} GPU-s"


def _seconds(seconds: float) -> str:
    """'604800', '2.5': whole seconds as such (never '6.048e+05'), else to a tenth."""
    return str(int(seconds)) if seconds == int(seconds) else f"{seconds:.1f}"


def waits_to_reclaim(seconds: float, victims: Iterable[str]) -> str:
    return (
        f"pending: no free capacity; waits up to {seconds:.0f}s for some to free "
        f"before reclaiming what {', '.join(victims)} borrowed"
    )


def admitted_smaller(job: Job, gpus: int, admitted_reason: str) -> str:
    """An elastic job admitted below its full size: "admitted at 4 of 8 GPUs (min 2): ..."."""
    _, _, why = admitted_reason.partition(": ")
    return (
        f"admitted at {gpus} of {job.request.gpus} GPUs (min {job.min_gpus}): "
        f"{why or admitted_reason}; its full size does not fit now, it grows when GPUs free"
    )


def shrunk(
    victim: Job,
    size: int,
    gpus_after: int,
    kind: str,
    preemptor: Job,
    *,
    lost_gpu_s: float,
    plan_lost_gpu_s: float,
    evict_lost_gpu_s: float | None,
    by_priority: bool,
) -> str:
    """Why `victim` shrinks from `size` to `gpus_after` GPUs for `preemptor`."""
    why = preempted(victim, kind, preemptor, min_runtime=False, lost_gpu_s=lost_gpu_s)
    why = why.removeprefix("preempted: ").partition("; expected loss")[0]
    cost = (
        f"shrinking loses {_gpu_s(lost_gpu_s)} ({size} GPUs x save + {gpus_after} GPUs x "
        "restore; it keeps its progress)"
    )
    if by_priority:
        choice = "shrinks the lowest-priority elastic jobs first, whatever it costs"
        if evict_lost_gpu_s is not None:
            choice += f" (evicting instead would lose {_gpu_s(evict_lost_gpu_s)})"
    elif evict_lost_gpu_s is None:
        choice = "no eviction alone would make room"
    else:
        choice = (
            f"chosen over evicting, which would lose {_gpu_s(evict_lost_gpu_s)} (this plan: "
            f"{_gpu_s(plan_lost_gpu_s)})"
        )
    return (
        f"resized: shrinks from {size} to {gpus_after} GPUs (min {victim.min_gpus}) instead of "
        f"being evicted: {why}; {cost}; {choice}"
    )


def evicted_over_shrink(reason: str, shrink_lost_gpu_s: float, plan_lost_gpu_s: float) -> str:
    """A preemption chosen although shrinking elastic jobs could have made room."""
    return (
        f"{reason}; evicting loses {_gpu_s(plan_lost_gpu_s)} in all, shrinking elastic jobs "
        f"instead would lose {_gpu_s(shrink_lost_gpu_s)}"
    )


def evicted_while_shrinking(reason: str, gpus_after: int) -> str:
    """A preemption of a job whose shrink was under way: the notice replaces the resize."""
    return f"{reason}; replaces its shrink to {gpus_after} GPUs, which was saving"


def making_room(evicted: Iterable[str], shrunk: Iterable[str]) -> str:
    """The preemptor's reason when its plan shrinks some jobs."""
    parts = []
    if evicted := list(evicted):
        parts.append(f"preempting {', '.join(evicted)}")
    parts.append(f"shrinking {', '.join(shrunk)}")
    return f"pending: {' and '.join(parts)} to make room; starts when they have saved"


def grown(job: Job, size: int, gpus_after: int, price: GrowPrice, *, by_priority: bool) -> str:
    """Why an elastic job grows; `by_priority`: whenever GPUs idle, whatever it costs."""
    head = f"resized: grows from {size} to {gpus_after} of {job.request.gpus} GPUs on idle GPUs"
    if by_priority:
        return f"{head} no pending job can use; resizing loses {_gpu_s(price.resize_gpu_s)}"
    idle = (
        "no pending job is expected to want"
        if price.idle_s == float("inf")
        else (f"no pending job is expected to want for {price.idle_s / 3600:.1f} h")
    )
    back = f" and {_gpu_s(price.back_gpu_s)} for being shrunk back" if price.back_gpu_s else ""
    return (
        f"{head} {idle}: it gains {_gpu_s(price.gained_gpu_s)}, at least {price.payback:g} x "
        f"the {_gpu_s(price.resize_gpu_s)} the resize loses{back}"
    )
