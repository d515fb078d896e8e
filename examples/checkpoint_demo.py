"""A tour of the checkpoint store in under a minute: crash, corruption, recovery.

1. A training process saves every 5 steps and is SIGKILLed in the middle of a save.
2. The torn save is invisible: `latest()` is the last committed step and it verifies.
3. A bit flips in the newest checkpoint; `verify()` names the file, `restore()` falls back.

    python examples/checkpoint_demo.py [--dir runs/demo]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import time
import warnings
from pathlib import Path

import torch
from rich.console import Console

from preemptible import Checkpointer

console = Console()


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_forever(root: str, saved_marker: str) -> None:
    """The child: trains, saves every 5 steps, and never stops on its own."""
    model, opt = make_model()
    ckpt = Checkpointer(root, keep=3)
    step = 0
    while True:
        x = torch.randn(64, 256)
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (64,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0:
            ckpt.save(step, {"model": model, "optim": opt, "meta": {"loss": loss.item()}})
            Path(saved_marker).write_text(str(step))
        step += 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", default="runs/demo", help="checkpoint root (wiped first)")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    marker = root.parent / f".{root.name}-saved"
    marker.unlink(missing_ok=True)

    console.rule("1. train, then SIGKILL in the middle of a save")
    child = multiprocessing.get_context("spawn").Process(
        target=train_forever, args=(str(root), str(marker))
    )
    child.start()
    while not marker.exists() or int(marker.read_text()) < 30:
        time.sleep(0.05)
    ckpt = Checkpointer(root, keep=3)
    # Wait until a save is in flight (its temporary directory exists), then kill.
    while not any(p.name.startswith(".tmp-") for p in root.iterdir()):
        time.sleep(0.001)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    torn = [p.name for p in root.iterdir() if p.name.startswith(".tmp-")]
    console.print(f"killed pid {child.pid} with SIGKILL; left behind: {torn}")

    console.rule("2. the torn save is invisible; the last committed one is intact")
    latest = ckpt.latest()
    assert latest is not None
    console.print(f"committed steps: {[i.step for i in ckpt.list()]}, latest = {latest.step}")
    report = ckpt.verify()
    console.print(f"verify step {report.step}: {'ok' if report.ok else report.problems}")

    console.rule("3. a bit flips on disk; verify names the file, restore falls back")
    victim = next((root / f"step-{latest.step:012d}").glob("data-*.bin"))
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    victim.write_bytes(bytes(raw))
    console.print(f"verify step {latest.step}: {ckpt.verify(latest.step).problems}")
    model, opt = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = ckpt.restore({"model": model, "optim": opt, "meta": {}})
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}")
    console.print(
        f"restored step {restored} into a fresh model; training can resume at {restored + 1}"
    )
    console.print(f"cost of that restore: {ckpt.cost.restore.last:.3f} s")
    console.rule("see the same from the command line")
    console.print(f"  preemptible ckpt list {root} --all\n  preemptible ckpt verify {root}")
    marker.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
