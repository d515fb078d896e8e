"""A fingerprint of every scheduling decision, to show that a refactor changed none.

Replays traces under every policy and writes, per trace and policy, the `--json` metrics
(without `sim_seconds`, the wall time) and a SHA-256 over every job's record: first start, end,
total wait, preemptions, moves, lost GPU-seconds and each run's (start, end). Run it before and
after a change that must not change decisions and compare the two files:

    .venv/bin/python benchmarks/decision_digest.py --out before.json
    ... change the core ...
    .venv/bin/python benchmarks/decision_digest.py --out after.json --compare before.json

Traces are the names of `preemptible.sim.evaluation.named_traces.TRACES` (default: synthetic,
chronus-mix1, itp-04, philly).
Exits 1 when `--compare` finds a difference and names each trace and policy that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from preemptible.queue.core import POLICIES, parse_config_text
from preemptible.sim import Simulator, summarize
from preemptible.sim.engine import SimResult
from preemptible.sim.evaluation.named_traces import TRACES, load_named

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
"""The shared traces folder next to the checkout (the Traces section of README.md)."""

DEFAULT_TRACES = "synthetic,chronus-mix1,itp-04,philly"


def fingerprint(result: SimResult) -> str:
    """SHA-256 over every job's record, in job-id order, floats written exactly (repr)."""
    digest = hashlib.sha256()
    for rec in sorted(result.records, key=lambda r: r.trace.job_id):
        fields = (
            rec.trace.job_id,
            rec.first_start_s,
            rec.end_s,
            rec.wait_s,
            rec.preemptions,
            rec.moves,
            rec.lost_gpu_s,
            rec.runs,
        )
        digest.update(repr(fields).encode())
    return digest.hexdigest()


def replay(trace: str, policy: str) -> tuple[str, str, dict[str, Any]]:
    jobs, config_text = load_named(trace, SHARED)
    result = Simulator(jobs, parse_config_text(config_text), POLICIES[policy]).run()
    metrics = summarize(result)
    metrics["overall"].pop("sim_seconds", None)
    return trace, policy, {"records_sha256": fingerprint(result), "metrics": metrics}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=DEFAULT_TRACES, help="comma-separated trace names")
    parser.add_argument("--out", type=Path, required=True, help="where to write the digest JSON")
    parser.add_argument("--compare", type=Path, help="an earlier digest to compare against")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    args = parser.parse_args()
    names = [t.strip() for t in args.traces.split(",") if t.strip()]
    unknown = [t for t in names if t not in TRACES]
    if unknown:
        parser.error(f"unknown trace {unknown[0]!r}; choose from {', '.join(TRACES)}")
    if args.compare is not None and not args.compare.is_file():
        parser.error(f"--compare {args.compare}: no such file")

    started = time.perf_counter()
    digests: dict[str, dict[str, Any]] = {t: {} for t in names}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(replay, t, p) for t in names for p in POLICIES]
        for done, future in enumerate(futures, 1):
            trace, policy, digest = future.result()
            digests[trace][policy] = digest
            print(f"[{done}/{len(futures)}] {trace} {policy}: {digest['records_sha256'][:16]}")
    args.out.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")

    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    differ = [
        f"{t} {p}" for t in names for p in POLICIES if before.get(t, {}).get(p) != digests[t][p]
    ]
    if differ:
        print("decisions differ: " + "; ".join(differ))
        return 1
    print(f"identical to {args.compare}: {len(names)} traces x {len(POLICIES)} policies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
