"""From SIGTERM to process exit with a committed checkpoint, against step time + save time.

A child trains a state of ``--size-mib`` with steps of ``--step-seconds``; the parent sends a
real SIGTERM at a random moment and times until the checkpoint is committed (as the child
reports it) and until the process has exited. What we promise is one step plus one save; the
process exit after that is Python and torch tearing down (measured alone as ``bare exit``).

    python benchmarks/notice_latency.py --size-mib 256 --step-seconds 0.2 --trials 5
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from preemptible import Checkpointer

sys.path.insert(0, str(Path(__file__).parent))
from ratios import record

CHILD = """
import sys, time, torch
from preemptible import Context, preemptible
root, mib, step_seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])

@preemptible(root, every_steps=10**9)
def train(ctx: Context) -> None:
    state = {f"w{i}": torch.randn(int(mib * 2**20 / 4 / 8)) for i in range(8)}
    ctx.register(state=state)
    for step in ctx.steps(10**9):
        if step == 0:
            print("ready", flush=True)
        time.sleep(step_seconds)  # the step's compute
        for t in state.values():
            t.mul_(0.999)

train()
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=float, default=256)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    rows = []
    for trial in range(args.trials):
        root = Path(tempfile.mkdtemp(prefix="pbench-notice-"))
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(args.size_mib), str(args.step_seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.5, 1.5))
        sent = time.perf_counter()
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=300)
        latency = time.perf_counter() - sent
        info = Checkpointer(root).latest()
        assert child.returncode == 143 and info is not None, f"exit {child.returncode}: {err}"
        committed = float(
            re.search(r"checkpointed step \d+ ([\d.]+) s after the notice", err).group(1)
        )
        rows.append((latency, info.save_seconds, committed))
        print(
            f"  trial {trial + 1}: committed after {committed:.3f} s, exited after {latency:.3f} s, save {info.save_seconds:.3f} s"
        )
        shutil.rmtree(root, ignore_errors=True)
    latency = statistics.median(r[0] for r in rows)
    save = statistics.median(r[1] for r in rows)
    committed = statistics.median(r[2] for r in rows)
    bound = args.step_seconds + save
    bare = bare_exit_seconds(args.size_mib)
    print(
        f"\nstate {args.size_mib:.0f} MiB, step {args.step_seconds:.3f} s, save {save:.3f} s (medians)"
    )
    print(
        f"notice -> checkpoint committed {committed:.3f} s; bound step+save {bound:.3f} s; ratio {committed / bound:.2f}"
    )
    record(
        "notice",
        "notice -> checkpoint committed",
        committed,
        bound,
        "one step + one save",
        goal=1.0,
    )
    print(
        f"notice -> process exit {latency:.3f} s; a bare python+torch exit with this state takes {bare:.3f} s"
    )


def bare_exit_seconds(mib: float) -> float:
    code = f"import time, torch; x = torch.randn(int({mib} * 2**18)); print(time.time(), flush=True); raise SystemExit(3)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    started = float(proc.stdout.readline())
    proc.wait()
    return time.time() - started


if __name__ == "__main__":
    main()
