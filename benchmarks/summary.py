"""Run the benchmarks one after another and print every ratio against its peer in one table.

Each benchmark runs as its own process, its report written to `--out`/NAME.log as it goes (one
line of progress here per benchmark); each appends the ratios it prints through
`benchmarks/ratios.py`. The table at the end has one row per ratio: ours, the peer's (or the
goal's) value, ours / theirs, and whether the goal is met where the measure has one. Exits 1
when a benchmark fails or a goal is missed, naming them.

    .venv/bin/python benchmarks/summary.py [--only save,async,...] [--runs 1] [--out bench-out]

`make bench` runs it with its defaults (about 4 minutes on a 2-core VM); the figures recorded
in docs/evaluation/benchmarks.md come from each script run as its section says, three times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ratios import ENV

HERE = Path(__file__).resolve().parent


def parts(runs: int) -> dict[str, list[str]]:
    """Benchmark name -> its command line (sizes that keep `make bench` under 10 minutes)."""
    cold = ["--cold"] if os.geteuid() == 0 else []  # dropping the page cache needs root
    return {
        "save": ["save_restore.py", "--size-gib", "1", "--repeat", "3", "--dir", "DIR", *cold],
        "async": ["async_save.py", "--size-gib", "1", "--runs", str(runs), "--dir", "DIR"],
        "cycle": ["cycle_latency.py", "--repeat", "30"],
        "cycle-100k": [
            "cycle_latency.py",
            "--pending",
            "100000",
            "--running",
            "10000",
            "--repeat",
            "10",
        ],
        "sim": ["sim_scale.py"],
        "queue": ["queue_service.py", "--parts", "cycle,handoff"],
        "notice": ["notice_latency.py", "--trials", "3"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="", help="comma-separated benchmark names (all)")
    parser.add_argument("--runs", type=int, default=1, help="runs of the background-save loops")
    parser.add_argument("--out", type=Path, default=None, help="where the reports go")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="pbench-summary-"))
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / "scratch"
    chosen = parts(args.runs)
    if args.only:
        wanted = args.only.split(",")
        unknown = [n for n in wanted if n not in chosen]
        if unknown:
            parser.error(f"unknown benchmarks {', '.join(unknown)}; known: {', '.join(chosen)}")
        chosen = {n: chosen[n] for n in wanted}
    ratios = out / "ratios.jsonl"
    ratios.unlink(missing_ok=True)
    env = {**os.environ, ENV: str(ratios)}
    failed: list[str] = []
    for i, (name, argv) in enumerate(chosen.items(), 1):
        command = [sys.executable, str(HERE / argv[0])]
        command += [str(scratch / name) if a == "DIR" else a for a in argv[1:]]
        print(f"[{i}/{len(chosen)}] {name}: {' '.join(argv)}", end=" ... ", flush=True)
        started = time.perf_counter()
        with open(out / f"{name}.log", "w", encoding="utf-8") as log:
            code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        took = time.perf_counter() - started
        print(f"{'ok' if code == 0 else f'FAILED (exit {code})'} in {took:.0f} s")
        if code:
            failed.append(f"{name} (exit {code}; see {out / f'{name}.log'})")
    rows = [json.loads(line) for line in ratios.read_text().splitlines()] if ratios.exists() else []
    missed = print_table(rows)
    print(f"\nreports: {out}")
    for what in failed + missed:
        print(f"FAILED: {what}")
    return 1 if failed or missed else 0


def print_table(rows: list[dict]) -> list[str]:
    """One line per ratio; returns the goals missed."""
    print(
        f"\n{'benchmark':<12}{'measure':<44}{'ours':>10}{'theirs':>10}  {'against':<22}"
        f"{'ratio':>8}  goal"
    )
    missed = []
    for r in rows:
        goal = r["goal"]
        verdict = ""
        if goal is not None:
            met = r["ratio"] <= goal
            verdict = f"<= {goal:.2f}x {'met' if met else 'MISSED'}"
            if not met:
                missed.append(f"{r['benchmark']}: {r['measure']} {r['ratio']:.2f}x")
        unit = r["unit"]
        print(
            f"{r['benchmark']:<12}{r['measure'][:43]:<44}{_value(r['ours'], unit):>10}"
            f"{_value(r['peer'], unit):>10}  {r['against'][:21]:<22}{r['ratio']:>7.2f}x  {verdict}"
        )
    return missed


def _value(v: float, unit: str) -> str:
    if unit == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    if unit == "ms":
        return f"{v:.1f} ms"
    return f"{v:,.0f} {unit}"


if __name__ == "__main__":
    sys.exit(main())
