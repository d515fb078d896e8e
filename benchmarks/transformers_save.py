"""The Trainer's own checkpoint against TrainerPreemptionCallback's, on one model, side by side.

Part 1, in one process: a GPT-2 built from a config trains one step (so the optimizer has its
state), then at that step's end, in rotating order, ``--repeat`` times each:

* hf        ``Trainer._save_checkpoint``, what ``save_steps`` and ``enable_jit_checkpoint`` run:
            a ``checkpoint-N`` folder, no fsync (the clock stops with the data in the page cache)
* hf+sync   the same, then ``os.sync()``: on disk, as a checkpoint must be when the node dies
* ours      the save TrainerPreemptionCallback makes in its place: a `Checkpointer` commit (fsync,
            checksums, atomic rename), and the cost report

then the resume, ``train(resume_from_checkpoint=...)`` up to its first step on a fresh Trainer:
ours from the store (``resume_path()``: read and verify the newest checkpoint; the Trainer's
loaders then load it in place) against the Trainer's own from its newest ``checkpoint-N``
folder. Reads hit the page cache: the files were just written. Medians are reported.

Part 2 (``--notice``), real processes: the example's Trainer with ``enable_jit_checkpoint`` and
with TrainerPreemptionCallback, SIGTERM after a few steps: seconds from the signal to the exit, the
exit code, and what is on disk.

    python benchmarks/transformers_save.py --size tiny
    python benchmarks/transformers_save.py --size 200mb --repeat 5
    python benchmarks/transformers_save.py --notice
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from preemptible import AlreadyComplete
from preemptible.transformers import TrainerPreemptionCallback

REPO = Path(__file__).resolve().parents[1]
SIZES = {  # GPT-2 shapes: the example's, and one whose weights + Adam state are about 200 MB
    "tiny": {"vocab_size": 128, "n_embd": 64, "n_layer": 2, "n_head": 4},
    "200mb": {"vocab_size": 50257, "n_embd": 256, "n_layer": 4, "n_head": 4},
}


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, vocab: int) -> None:
        self.tokens = torch.randint(0, vocab, (16, 32), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def trainer(size: str, out: Path) -> Trainer:
    shape = SIZES[size]
    config = GPT2Config(n_positions=32, bos_token_id=0, eos_token_id=0, **shape)
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=8, max_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, save_total_limit=1,
    )  # fmt: skip
    return Trainer(
        model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens(shape["vocab_size"])
    )


class Bench(TrainerCallback):
    """At the first step's end, with the optimizer's state made: time the saves."""

    def __init__(self, hf: Trainer, repeat: int) -> None:
        self.hf, self.repeat = hf, repeat
        self.times: dict[str, list[float]] = {"hf": [], "hf+sync": [], "ours": []}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        real = state.global_step
        methods = list(self.times)
        for i in range(self.repeat):
            for j in range(len(methods)):
                method = methods[(i + j) % len(methods)]
                state.global_step = 1000 + 10 * i + j  # a new folder or step each time
                started = time.perf_counter()
                if method == "ours":
                    self.hf._save_checkpoint(self.hf.model, None)  # TrainerPreemptionCallback's
                else:
                    Trainer._save_checkpoint(self.hf, self.hf.model, None)
                    if method == "hf+sync":
                        os.sync()
                self.times[method].append(time.perf_counter() - started)
        state.global_step = real


def state_bytes(t: Trainer) -> int:
    tensors = list(t.model.state_dict().values())
    for s in t.optimizer.state_dict()["state"].values():
        tensors += [v for v in s.values() if isinstance(v, torch.Tensor)]
    unique = {x.untyped_storage().data_ptr(): x for x in tensors}  # tied weights once
    return sum(x.numel() * x.element_size() for x in unique.values())


def measure(size: str, repeat: int, root: Path) -> None:
    t = trainer(size, root / "run")
    TrainerPreemptionCallback(t, root / "store")  # joins t: its saves are the store's
    bench = Bench(t, repeat)
    t.add_callback(bench)
    t.train()
    nbytes = state_bytes(t)
    med = {m: statistics.median(v) for m, v in bench.times.items()}

    # The resume, up to the first step: ours from the store (resume_path, then the Trainer's
    # loads from memory), the Trainer's from its newest checkpoint-N folder. Both checkpoints
    # are past max_steps, so train() reads everything and stops before training.
    folder = str(sorted((root / "run").glob("checkpoint-*"))[-1])
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(repeat):
        fresh = TrainerPreemptionCallback(trainer(size, root / "again"), root / "store")
        started = time.perf_counter()
        with contextlib.suppress(AlreadyComplete):
            fresh.trainer.train(resume_from_checkpoint=fresh.resume_path())
        ours.append(time.perf_counter() - started)
        plain = trainer(size, root / "again")
        started = time.perf_counter()
        plain.train(resume_from_checkpoint=folder)
        theirs.append(time.perf_counter() - started)
    print(f"{size}: weights + optimizer state {nbytes / 1e6:.1f} MB, median of {repeat}")
    print(
        f"  save   hf {med['hf']:.3f} s   hf+sync {med['hf+sync']:.3f} s   ours {med['ours']:.3f} s"
        f"   ours/hf+sync {med['ours'] / med['hf+sync']:.2f}   ours/hf {med['ours'] / med['hf']:.2f}"
    )
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    print(
        f"  resume (train() to its first step) ours {ours_s:.3f} s   hf {theirs_s:.3f} s"
        f"   ours/hf {ours_s / theirs_s:.2f}"
    )


NOTICE_SCRIPT = """
import sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
sys.path.insert(0, {examples!r})
from transformers_train import RandomTokens, SlowDown
mode, out = sys.argv[1], sys.argv[2]
config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                    bos_token_id=0, eos_token_id=0)
args = TrainingArguments(output_dir=out, num_train_epochs=3, per_device_train_batch_size=8,
                         save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                         enable_jit_checkpoint=mode == "jit")
trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=RandomTokens(96, 32, 128))
trainer.add_callback(SlowDown(0.2))
class Started(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        print("step", state.global_step, flush=True)
trainer.add_callback(Started())
resume = None
if mode == "ours":
    from preemptible.transformers import TrainerPreemptionCallback
    resume = TrainerPreemptionCallback(trainer).resume_path()
trainer.train(resume_from_checkpoint=resume)
print("train() returned: the script goes on", flush=True)
"""


def notice(root: Path) -> None:
    script = root / "notice.py"
    script.write_text(textwrap.dedent(NOTICE_SCRIPT.format(examples=str(REPO / "examples"))))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for mode in ("jit", "ours"):
        out = root / mode
        proc = subprocess.Popen(
            [sys.executable, str(script), mode, str(out)], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 3"):
                break
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
        took = time.monotonic() - sent
        lines += rest.splitlines(keepends=True)
        steps = [ln.split()[1] for ln in lines if ln.startswith("step ")]
        went_on = any(ln.startswith("train() returned") for ln in lines)
        saved = sorted(p.relative_to(out).as_posix() for p in out.glob("*")) if out.exists() else []
        print(
            f"{mode}: exit {proc.returncode} {took:.2f} s after SIGTERM (sent after step 3, last "
            f"step {steps[-1]}); code after train() ran: {went_on}; on disk: {saved}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--notice", action="store_true", help="part 2 instead of part 1")
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    options = parser.parse_args()
    root = Path(options.dir or tempfile.mkdtemp(prefix="transformers-save-"))
    try:
        if options.notice:
            notice(root)
        else:
            measure(options.size, options.repeat, root)
    finally:
        if options.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
