"""What keeping a job's processes together costs: each mechanism this host offers, side by side.

For every containment mechanism (``preemptible/queue/service/containment.py``) that works here,
in interleaved rounds so that a change in the machine's load falls on all of them alike:

- ``launch``: ``ProcessExecutor.launch`` (the attempt's cgroup made, the runner started);
- ``first instruction``: from the launch to the command's first instruction (the runner has
  joined its cgroup or become a subreaper, and started the command);
- ``kill to ended``: from ``kill`` to ``poll`` reporting the exit (nothing of it left);
- ``escaped holder``: the same for a job whose holder called ``setsid`` after a double fork;
  a process group alone never ends that one (it is killed by hand after the round).

    .venv/bin/python benchmarks/containment.py [--rounds 21]

Needs a writable cgroup hierarchy (root) for the cgroup rows; the others run anywhere on Linux.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from preemptible.queue.service.containment import Mechanism, probe
from preemptible.queue.service.executor import LaunchSpec, ProcessExecutor, ProcessHandle

STARTS = "import os; os.close(os.open('ready', os.O_CREAT)); import time; time.sleep(60)"
ESCAPES = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        open('holder.tmp', 'w').write(str(os.getpid()))\n"
    "        os.rename('holder.tmp', 'holder')\n"
    "        time.sleep(60)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "while not os.path.exists('holder'):\n"
    "    time.sleep(0.001)\n"
    "open('ready', 'w').close()\n"
    "time.sleep(60)\n"
)
GIVE_UP_S = 10.0
LAUNCHED: list[tuple[ProcessExecutor, ProcessHandle]] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    offered = {m: probe(m) for m in Mechanism}
    executors = {m: ProcessExecutor(containment=c) for m, c in offered.items() if c.available}
    timings: dict[Mechanism, dict[str, list[float]]] = {m: {} for m in executors}
    work = Path(tempfile.mkdtemp(prefix="containment-"))
    try:
        for round_ in range(args.rounds):
            for mechanism, executor in executors.items():
                for name, value in one_round(executor, work / f"{mechanism.name}-{round_}"):
                    timings[mechanism].setdefault(name, []).append(value)
    finally:
        for executor, handle in LAUNCHED:  # a round that failed leaves nothing running
            executor.kill(handle)
        shutil.rmtree(work, ignore_errors=True)
    print(f"median of {args.rounds} rounds, ms\n")
    print("| mechanism | launch | first instruction | kill to ended | escaped holder |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mechanism, times in timings.items():
        cells = [f"{statistics.median(times[k]) * 1000:.1f}" if k in times else "never" for k in
                 ("launch", "first instruction", "kill to ended", "escaped holder")]  # fmt: skip
        print(f"| {mechanism} | {' | '.join(cells)} |")
    for mechanism, found in offered.items():
        if not found.available:
            print(f"\n{mechanism}: not offered here ({found.why})")


def one_round(executor: ProcessExecutor, folder: Path) -> list[tuple[str, float]]:
    folder.mkdir(parents=True)
    started = time.perf_counter()
    handle = launch(executor, folder / "plain", STARTS)
    launched = time.perf_counter()
    wait_for(lambda: (folder / "plain" / "ready").exists())
    running = time.perf_counter()
    ended = kill_and_wait(executor, handle)
    results = [
        ("launch", launched - started),
        ("first instruction", running - started),
        ("kill to ended", ended),
    ]
    handle = launch(executor, folder / "escapes", ESCAPES)
    wait_for(lambda: (folder / "escapes" / "ready").exists())
    holder = int((folder / "escapes" / "holder").read_text())
    ended = kill_and_wait(executor, handle)
    if alive(holder):
        os.kill(holder, signal.SIGKILL)  # it escaped: the exit was reported while it lived
    else:
        results.append(("escaped holder", ended))
    return results


def launch(executor: ProcessExecutor, folder: Path, code: str) -> ProcessHandle:
    handle = executor.launch(spec(folder, code))
    LAUNCHED.append((executor, handle))
    return handle


def spec(folder: Path, code: str) -> LaunchSpec:
    folder.mkdir()
    return LaunchSpec(
        job_id="bench",
        attempt=1,
        command=[sys.executable, "-I", "-S", "-c", code],
        cwd=str(folder),
        env={},
        gpu_ids=[],
        log_path=folder / "log",
        status_path=folder / "status",
    )


def kill_and_wait(executor: ProcessExecutor, handle: ProcessHandle) -> float:
    started = time.perf_counter()
    executor.kill(handle)
    wait_for(lambda: executor.poll(handle) is not None)
    return time.perf_counter() - started


def wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.0002)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] not in "ZX"


if __name__ == "__main__":
    main()
