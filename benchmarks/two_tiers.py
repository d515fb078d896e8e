"""Two tiers (a local disk, then S3) against saving to S3 alone, side by side in one run.

An S3 server runs on 127.0.0.1 (moto by default, ``--server seaweedfs`` for SeaweedFS), spoken
to over HTTP by s3fs as a training job would. The state is the mixed 1 GiB of save_restore.py
(``--size-gib``). Three parts, each method in rotating order, median of ``--repeat`` runs:

1. Notice to committed. The step time is 0: the save starts at the notice, on the main thread.

   * disk write     the state's bytes written to files in the local dir + fsync, by 1 and by 4
                    threads (raw-1 / raw-4 of save_restore.py): the disk's own write time is the
                    faster of the two
   * local only     Checkpointer(DIR).save(step, state): one tier, on the same disk
   * two tiers      Checkpointer(remote, local=DIR).save(step, state): "committed locally" when
                    save returns, "durable remotely" when wait_durable() returns
   * remote only    Checkpointer(remote).save(step, state), blocking: durable when it returns

   Goal: notice to local commit within one step plus 1.2x the disk's own write time; with a
   step of 0, local commit / disk write <= 1.2.

2. Periodic background saves. A loop of ``--steps`` fake steps (a ``--matmul`` square fp32
   matmul) that calls save(blocking=False) every ``--every`` steps. "stall" is the time one
   save call blocks the loop (the snapshot copy, plus waiting for the previous save when it is
   still in flight: for remote only, its whole upload; for two tiers, its local commit). The
   loop time is compared with the same loop without saves. "durable" counts the saves that
   reached the remote: two tiers skip an older step waiting for its upload when a newer one
   commits.

3. Restore. A fresh two-tier Checkpointer on the same local dir (reads the local tier) against
   one on another, empty local dir, as on a new node (reads the remote tier). ``--cold`` (root
   only) drops the page cache before each restore.

The load average is printed at the start and the end: other work on the machine skews the
absolute times, so read the ratios. Temp dirs and the S3 server are removed at the end, on
Ctrl-C too.

    python benchmarks/two_tiers.py --size-gib 1 --repeat 3
    python benchmarks/two_tiers.py --size-gib 0.25 --repeat 1 --server seaweedfs  # quick
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.s3servers
from save_restore import drop_caches, make_state, nbytes, save_raw, save_raw_parallel

from preemptible import Checkpointer
from tests.s3servers import S3Server, start_moto, start_seaweedfs

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


_signalled: list[int] = []


def _on_signal(signum: int, frame: object) -> None:
    _signalled.append(signum)
    raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)


def check_signal() -> None:
    """Raise again a Ctrl-C or SIGTERM that arrived while ``save`` waited for the previous
    save: Checkpointer.wait swallows any exception of that wait, KeyboardInterrupt included."""
    if _signalled:
        _on_signal(_signalled[-1], None)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Bench:
    """The S3 server, a bucket, temp dirs and every checkpointer opened, for the clean-up."""

    def __init__(self, server: S3Server, base: Path, state: dict[str, torch.Tensor]):
        import s3fs

        self.server, self.base, self.state = server, base, state
        self.options = server.storage_options()
        self.fs = s3fs.S3FileSystem(**self.options)  # type: ignore[arg-type]
        self.bucket = f"bench-{uuid.uuid4().hex[:8]}"
        self.fs.mkdir(self.bucket)
        self.open: list[Checkpointer] = []
        self.restore_from: tuple[str, Path] | None = None  # the two tiers' last save

    def remote(self) -> str:
        return f"s3://{self.bucket}/{uuid.uuid4().hex[:8]}"

    def drop_remote(self, url: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(url.removeprefix("s3://"), recursive=True)

    def local(self) -> Path:
        path = self.base / uuid.uuid4().hex[:8]
        path.mkdir()
        return path

    def ckpt(self, url: str, local: Path | None = None, **kwargs: Any) -> Checkpointer:
        ckpt = Checkpointer(url, local=local, storage_options=self.options, **kwargs)
        self.open.append(ckpt)
        return ckpt

    def close(self, ckpt: Checkpointer) -> None:
        ckpt.close()
        self.open.remove(ckpt)

    def close_all(self) -> None:
        for ckpt in self.open:
            with contextlib.suppress(Exception):
                ckpt.close(wait_durable=False)
        self.open.clear()


# --- 1. notice to committed ----------------------------------------------------------------


def notice_disk(b: Bench, write: Callable[..., None]) -> dict[str, float]:
    out = b.local()
    os.sync()
    t0 = time.perf_counter()
    write(b.state, out)
    t = time.perf_counter() - t0
    shutil.rmtree(out)
    return {"disk": t}


def notice_two_tiers(b: Bench) -> dict[str, float]:
    url, out = b.remote(), b.local()
    ckpt = b.ckpt(url, out, keep=1)  # opened before the notice, as in a running job
    os.sync()
    t0 = time.perf_counter()
    ckpt.save(1, b.state)
    local = time.perf_counter() - t0
    assert ckpt.wait_durable(), "the upload did not finish"
    durable = time.perf_counter() - t0
    b.close(ckpt)
    b.restore_from = (url, out)  # part 3 reads this checkpoint back
    return {"local": local, "durable": durable}


def notice_local_only(b: Bench) -> dict[str, float]:
    out = b.local()
    ckpt = Checkpointer(out / "ckpt", keep=1)
    os.sync()
    t0 = time.perf_counter()
    ckpt.save(1, b.state)
    t = time.perf_counter() - t0
    shutil.rmtree(out)
    return {"local": t}


def notice_remote_only(b: Bench) -> dict[str, float]:
    url = b.remote()
    ckpt = b.ckpt(url, keep=1)
    t0 = time.perf_counter()
    ckpt.save(1, b.state)
    t = time.perf_counter() - t0
    b.close(ckpt)
    b.drop_remote(url)
    return {"remote": t}


# --- 3. restore ----------------------------------------------------------------------------


def restore(b: Bench, cold: bool) -> dict[str, float]:
    assert b.restore_from is not None
    url, out = b.restore_from
    times = {}
    for tier, local in (("local", out), ("remote", b.local())):
        ckpt = b.ckpt(url, local)
        if cold:
            drop_caches()
        t0 = time.perf_counter()
        ckpt.load()
        times[tier] = time.perf_counter() - t0
        assert ckpt._restored_tier == tier, f"read {ckpt._restored_tier}, not {tier}"
        b.close(ckpt)
        shutil.rmtree(local)
    b.drop_remote(url)
    return times


# --- 2. periodic background saves ----------------------------------------------------------


def loop(b: Bench, args: argparse.Namespace, ckpt: Checkpointer | None) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.matmul, args.matmul, generator=g)
    w = torch.randn(args.matmul, args.matmul, generator=g) / args.matmul**0.5
    stalls = []
    t0 = time.perf_counter()
    for i in range(1, args.steps + 1):
        x = torch.tanh(x @ w)  # the step
        if ckpt is not None and i % args.every == 0:
            s0 = time.perf_counter()
            ckpt.save(i, b.state, blocking=False)
            stalls.append(time.perf_counter() - s0)
            check_signal()
    row: dict[str, Any] = {"loop": time.perf_counter() - t0, "stalls": stalls}
    if ckpt is not None:
        assert ckpt.wait_durable(), "the upload did not finish"
        row["durable"] = time.perf_counter() - t0
        remote = ckpt.remote or ckpt
        row["steps"] = [c.step for c in remote.list()]
    return row


def periodic(b: Bench, args: argparse.Namespace, method: str) -> dict[str, Any]:
    if method == "no save":
        return loop(b, args, None)
    url = b.remote()
    local = b.local() if method == "two tiers" else None
    ckpt = b.ckpt(url, local, keep=None)  # keep every step, to count what became durable
    row = loop(b, args, ckpt)
    b.close(ckpt)
    b.drop_remote(url)
    if local is not None:
        shutil.rmtree(local)
    return row


# --- report --------------------------------------------------------------------------------


def med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report_notice(rows: dict[str, list[dict[str, float]]], size: int, repeat: int) -> None:
    gb = size / 1e9
    disk = min(med(rows["raw-1"], "disk"), med(rows["raw-4"], "disk"))
    remote = med(rows["remote only"], "remote")
    local, durable = med(rows["two tiers"], "local"), med(rows["two tiers"], "durable")
    print(f"\n1. NOTICE -> COMMITTED (median of {repeat}; step time 0; GB/s = 1e9 bytes/s)")
    print(f"{'':40} {'seconds':>8} {'GB/s':>7} {'its time / remote only':>23}")
    table = [
        ("disk write, raw-1 (1 file, fsync)", med(rows["raw-1"], "disk")),
        ("disk write, raw-4 (4 files, fsync)", med(rows["raw-4"], "disk")),
        ("local only: blocking save (one tier)", med(rows["local only"], "local")),
        ("two tiers: committed locally", local),
        ("two tiers: durable remotely", durable),
        ("remote only: blocking save (durable)", remote),
    ]
    for name, t in table:
        print(f"{name:40} {t:8.3f} {gb / t:7.2f} {t / remote:22.2f}x")
    ok = "met" if local <= 1.2 * disk else "MISSED"
    print(
        f"local commit / disk write = {local / disk:.2f} (goal <= 1.20: {ok}); the loop"
        f" resumes {remote / local:.1f}x sooner than with remote only"
    )
    one = med(rows["local only"], "local")
    print(f"two tiers' local commit / one tier's save on the same disk = {local / one:.2f}")
    print(f"durable remotely / remote only = {durable / remote:.2f} (the detour through the disk)")


def report_periodic(rows: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    saves = args.steps // args.every
    print(
        f"\n2. PERIODIC BACKGROUND SAVES: {args.steps} steps of a {args.matmul}^2 matmul, a save"
        f" every {args.every} ({saves} saves); median of {args.repeat}"
    )
    print(
        f"{'':12} {'stall med s':>11} {'stall max s':>11} {'stalls s':>9} {'loop s':>7}"
        f" {'loop/no save':>12} {'durable s':>9} {'durable':>8}"
    )
    base = med(rows["no save"], "loop")
    for name, runs in rows.items():
        loop_s = med(runs, "loop")
        if name == "no save":
            print(f"{name:12} {'':>11} {'':>11} {'':>9} {loop_s:7.2f} {1:11.2f}x")
            continue
        stall_med = statistics.median(s for r in runs for s in r["stalls"])
        stall_max = statistics.median(max(r["stalls"]) for r in runs)
        stalls = statistics.median(sum(r["stalls"]) for r in runs)
        durable = statistics.median(len(r["steps"]) for r in runs)
        print(
            f"{name:12} {stall_med:11.3f} {stall_max:11.3f} {stalls:9.3f} {loop_s:7.2f}"
            f" {loop_s / base:11.2f}x {med(runs, 'durable'):9.2f} {durable:4.0f}/{saves}"
        )
    remote, two = med(rows["remote only"], "loop"), med(rows["two tiers"], "loop")
    print(
        f"loop time added by saving: remote only {remote - base:.2f} s, two tiers"
        f" {two - base:.2f} s; two tiers' loop / remote only's = {two / remote:.2f}"
    )


def report_restore(rows: list[dict[str, float]], size: int, repeat: int, cold: bool) -> None:
    gb = size / 1e9
    cache = "cold page cache" if cold else "warm page cache"
    print(f"\n3. RESTORE (median of {repeat}, {cache}; load() of the newest step)")
    print(f"{'':40} {'seconds':>8} {'GB/s':>7} {'its time / local':>17}")
    local = med(rows, "local")
    for name, key in (("local tier (same node)", "local"), ("remote tier (new node)", "remote")):
        t = med(rows, key)
        print(f"{name:40} {t:8.3f} {gb / t:7.2f} {t / local:16.2f}x")


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=_Help)
    parser.add_argument("--size-gib", type=float, default=1.0, help="state size in GiB")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method (median)")
    parser.add_argument(
        "--server", choices=["moto", "seaweedfs"], default="moto", help="the S3 server"
    )
    parser.add_argument("--dir", default=None, help="local tier's parent (None: a temp dir)")
    parser.add_argument("--steps", type=int, default=45, help="steps of the periodic loop")
    parser.add_argument("--every", type=int, default=15, help="a save every N steps")
    parser.add_argument("--matmul", type=int, default=2048, help="the fake step's matrix size")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before restores")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["notice", "periodic", "restore"],
        help="leave a part out (repeatable); restore reads what notice saved",
    )
    args = parser.parse_args()
    if "notice" in args.skip and "restore" not in args.skip:
        parser.error("restore reads the checkpoint of the notice part: skip both or neither")
    for signum in (signal.SIGINT, signal.SIGTERM):  # both run the clean-up below
        signal.signal(signum, _on_signal)

    print(f"load average at start: {loadavg()} (1, 5, 15 min); {os.cpu_count()} CPUs")
    parent = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="pbench-tiers-", dir=parent))
    server: S3Server | None = None
    bench: Bench | None = None
    try:
        server = start_moto() if args.server == "moto" else start_seaweedfs()
        state = make_state(args.size_gib)
        size = nbytes(state)
        bench = Bench(server, base, state)
        print(
            f"state: {len(state)} tensors, {size / 2**30:.2f} GiB; local tier under {base};"
            f" remote: {server.name} at {server.endpoint}; torch {torch.__version__},"
            f" threads={torch.get_num_threads()}"
        )
        notice: dict[str, Callable[[Bench], dict[str, float]]] = {
            "raw-1": lambda b: notice_disk(b, save_raw),
            "raw-4": lambda b: notice_disk(b, save_raw_parallel),
            "local only": notice_local_only,
            "two tiers": notice_two_tiers,
            "remote only": notice_remote_only,
        }
        n_rows: dict[str, list[dict[str, float]]] = {m: [] for m in notice}
        r_rows: list[dict[str, float]] = []
        p_rows: dict[str, list[dict[str, Any]]] = {
            m: [] for m in ("no save", "remote only", "two tiers")
        }
        for write in (save_raw, save_raw_parallel):  # warm-up: the first write runs slow
            notice_disk(bench, write)
        for rep in range(args.repeat):
            if "notice" not in args.skip:
                names = list(notice)
                for name in names[rep % len(names) :] + names[: rep % len(names)]:
                    n_rows[name].append(notice[name](bench))
                    check_signal()
                    if name == "two tiers" and "restore" not in args.skip:
                        r_rows.append(restore(bench, args.cold))
                    elif name == "two tiers" and bench.restore_from is not None:
                        bench.drop_remote(bench.restore_from[0])
            if "periodic" not in args.skip:
                names = list(p_rows)
                for name in names[rep % len(names) :] + names[: rep % len(names)]:
                    p_rows[name].append(periodic(bench, args, name))
                    check_signal()
            print(f"  run {rep + 1}/{args.repeat} done (load average {loadavg()})", flush=True)
        if "notice" not in args.skip:
            report_notice(n_rows, size, args.repeat)
        if "periodic" not in args.skip:
            report_periodic(p_rows, args)
        if "restore" not in args.skip:
            report_restore(r_rows, size, args.repeat, args.cold)
    finally:
        if bench is not None:
            bench.close_all()
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)
        print(f"\nload average at end: {loadavg()} (1, 5, 15 min)")


if __name__ == "__main__":
    main()
