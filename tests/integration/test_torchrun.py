"""Real torchrun, real worker processes, gloo on the CPU: `examples/torchrun_elastic.py`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from preemptible import Checkpointer, ResumableSampler
from tests.helpers import assert_same
from tests.polling import wait_until
from tests.s3servers import free_port

SCRIPT = Path(__file__).parents[2] / "examples" / "torchrun_elastic.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def torchrun_command(*args: str, nproc: int = 2, max_restarts: int = 0) -> list[str]:
    """torchrun on this node, on a free rendezvous port, running ``args`` (a script, its
    arguments)."""
    return [
        TORCHRUN,
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        *args,
    ]


def spawn(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``command`` with its output piped, leading a process group of its own, so that a
    failed test kills every worker."""
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def torchrun(
    root: Path, *args: str, nproc: int = 2, max_restarts: int = 0
) -> subprocess.Popen[str]:
    command = torchrun_command(str(SCRIPT), "--dir", str(root), *args, nproc=nproc,
                               max_restarts=max_restarts)  # fmt: skip
    return spawn(command)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL torchrun and its workers (they would otherwise outlive a failed test)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise
    return proc.returncode, out


class Output:
    """A process's output, read by a thread, so that waiting for a line can time out (a blocking
    read hangs the whole run when the line never comes). The process leads its own group."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        self.lines: list[str] = []  # appended by the reader thread
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def _killed(self) -> str:
        kill_group(self.proc)
        return self.text

    def until(self, pattern: str, timeout: float = 120) -> None:
        """Wait for a line matching `pattern`; fail (and kill the process) if none comes."""
        regex = re.compile(pattern)

        def seen() -> bool:
            ended = not self._reader.is_alive()
            if any(regex.search(line) for line in list(self.lines)):
                return True
            assert not ended, f"the output ended without {pattern!r}:\n{self.text}"
            return False

        wait_until(seen, f"a line matching {pattern!r}", timeout=timeout, describe=self._killed)

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        """Wait for the end of the output and the exit code."""
        wait_until(
            lambda: not self._reader.is_alive(),
            "the end of the output",
            timeout=timeout,
            describe=self._killed,
        )
        return self.proc.wait(timeout=10), self.text


def test_a_worker_killed_mid_run_restarts_and_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path):
    code, out = finish(torchrun(tmp_path / "ref", "--steps", "20"))
    assert code == 0, out
    code, out = finish(
        torchrun(tmp_path / "crash", "--steps", "20", "--crash-at-step", "12", max_restarts=1)
    )
    assert code == 0, out
    assert "attempt 1: world 2, starting at step" in out  # torchrun restarted the group
    resumed_at = int(re.search(r"attempt 1: world 2, starting at step (\d+)", out).group(1))
    assert 5 <= resumed_at <= 13
    ref, crash = Checkpointer(tmp_path / "ref"), Checkpointer(tmp_path / "crash")
    for rank in (0, 1):
        assert_same(ref.load(19, rank=rank), crash.load(19, rank=rank), f"rank {rank}")


def test_sigterm_to_torchrun_makes_every_worker_checkpoint_the_same_step_and_exit(tmp_path):
    proc = torchrun(
        tmp_path / "run", "--steps", "100000", "--step-seconds", "0.02", "--every", "1000"
    )
    output = Output(proc)
    output.until(r"rank 1 step (1[5-9]|[2-9]\d|\d{3,}) ")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, out = output.finish(timeout=60)
    elapsed = time.monotonic() - sent
    stops = re.findall(r"preempted: checkpointed step (\d+) .* exiting with (\d+)", out)
    assert len(stops) == 2 and stops[0] == stops[1], out  # both ranks, one step
    assert stops[0][1] == "143", out  # 128 + SIGTERM
    latest = Checkpointer(tmp_path / "run").latest()
    assert latest.step == int(stops[0][0]) and latest.world_size == 2
    assert elapsed < 20, f"workers took {elapsed:.1f}s to exit (torchrun kills at 30s)"
    # torchrun turns its own SIGTERM into a SignalException, stops the workers and dies of it
    # with exit code 1; it reports no per-worker exit codes on that path.
    assert code == 1 and "SignalException: Process" in out and "got signal: 15" in out, out


def test_a_notice_seen_by_one_rank_only_stops_both_at_the_same_step(tmp_path):
    code, out = finish(
        torchrun(
            tmp_path / "run",
            "--steps",
            "1000",
            "--every",
            "1000",
            "--sigterm-rank-at-step",
            "1",
            "7",
        )
    )
    stops = [int(s) for s in re.findall(r"preempted: checkpointed step (\d+)", out)]
    assert stops == [7, 7], out  # rank 0 never got a signal, yet stopped at rank 1's step
    assert code != 0 and "exitcode  : 143" in out  # the workers left with 128 + SIGTERM
    latest = Checkpointer(tmp_path / "run").latest()
    assert latest.step == 7 and latest.world_size == 2


def replay_on_one_rank(start: dict[str, Any], steps: int) -> dict[str, Any]:
    """The example's loop in plain PyTorch on one process, from a loaded state: the reference a
    resumed one-rank run must match bit for bit (DDP on one rank leaves the gradients as they are).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS=1 in the workers
    try:
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )
        model.load_state_dict(start["model"])
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        opt.load_state_dict(start["optim"])
        x = torch.randn(640, 16, generator=torch.Generator().manual_seed(99))
        data = TensorDataset(x, x.sum(1, keepdim=True).sin())
        sampler = ResumableSampler(data, seed=3, num_replicas=1, rank=0)
        sampler.load_state_dict(start["data"])
        loader = DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator())
        batches = sampler.batches(loader)
        torch.set_rng_state(start["_preemptible"]["rng"]["torch"])
        for _ in range(steps):
            xb, yb = next(batches)
            noise = torch.randn(()) * 1e-4
            loss = torch.nn.functional.mse_loss(model(xb), yb) + noise
            opt.zero_grad()
            loss.backward()
            opt.step()
        rng = torch.get_rng_state()
    finally:
        torch.set_num_threads(threads)
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "data": sampler.state_dict(),
        "rng": rng,
    }


def test_a_two_rank_checkpoint_resumes_on_one_rank_and_on_two(tmp_path):
    root, ref = tmp_path / "run", tmp_path / "ref"
    code, out = finish(torchrun(root, "--steps", "12"))
    assert code == 0, out
    code, out = finish(torchrun(ref, "--steps", "20"))  # the same run, never stopped
    assert code == 0, out
    saved = Checkpointer(root).load(11, rank=0)
    assert saved["data"]["consumed"] == 12 * 8 * 2  # 12 steps, batch 8, 2 ranks
    for nproc in (1, 2):
        copy = tmp_path / f"resume-{nproc}"
        subprocess.run(["cp", "-r", str(root), str(copy)], check=True)
        code, out = finish(torchrun(copy, "--steps", "20", nproc=nproc))
        assert code == 0, out
        assert f"world {nproc}, starting at step 12" in out
        final = Checkpointer(copy).load(19, rank=0)
        # The data position continues globally: the new ranks take the samples not yet seen.
        assert final["data"]["consumed"] == 12 * 8 * 2 + 8 * 8 * nproc
        assert final["data"]["epoch"] == saved["data"]["epoch"]
        if nproc == 2:
            for rank in (0, 1):
                expected = Checkpointer(ref).load(19, rank=rank)
                assert_same(expected, Checkpointer(copy).load(19, rank=rank), f"rank {rank}")
        else:
            expected = replay_on_one_rank(saved, steps=8)
            got = {**final, "rng": final["_preemptible"]["rng"]["torch"]}
            assert_same(expected, {k: got[k] for k in expected}, "one rank")


def test_a_finished_run_started_again_exits_0_and_a_rank_without_valid_checkpoints_stops_all(
    tmp_path,
):
    root = tmp_path / "run"
    code, out = finish(torchrun(root, "--steps", "6", "--every", "2"))
    assert code == 0, out
    code, out = finish(torchrun(root, "--steps", "6", "--every", "2"))
    assert code == 0, out
    assert out.count("already complete at step 5") == 1, out  # said once, by rank 0
    assert "step 0 " not in out and "done" not in out, out

    # A real bit flip in rank 1's shard of every checkpoint: rank 1 finds none valid while
    # rank 0 restores step 5. Both stop (rank 0 cannot start over from a loaded state), at once.
    committed = [i.step for i in Checkpointer(root).list()]
    assert committed == [1, 3, 5]  # keep=3: all there is
    for step in committed:
        (data,) = (root / f"step-{step:012d}").glob("rank00001-data-*.bin")
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        data.write_bytes(bytes(raw))
    code, out = finish(torchrun(root, "--steps", "8", "--every", "2"), timeout=120)
    assert code != 0, out
    assert "NoValidCheckpointError" in out and "fails verification (steps 5, 3, 1)" in out, out
    assert "another rank found no valid checkpoint" in out and "restored step 5" in out, out
    assert " step 6 " not in out, out  # nothing trained
