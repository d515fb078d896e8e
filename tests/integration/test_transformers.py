"""The Hugging Face Trainer made preemptible: real runs of the page's example, real SIGTERMs.

`examples/transformers_train.py` (a GPT-2 built from a config, dropout, shuffled batches) is the
script of docs/ways-in/transformers.md, checked equal to the page's block, and the one these
tests run: with one process and under torchrun with two (gloo), stopped by SIGTERM mid-epoch,
resumed by the same command, and compared bit for bit (weights, optimizer, scheduler, each
rank's RNG states) with a run that never stopped, read from the final checkpoint of each run.
The in-process tests cover the other notices, what a run refuses, and a finished run started
again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from preemptible import AlreadyComplete, Checkpointer, ConfigError
from tests.doc_blocks import block
from tests.helpers import assert_same
from tests.integration.test_torchrun import Output, finish, torchrun_command
from tests.polling import wait_until

transformers = pytest.importorskip("transformers")

from preemptible.transformers import TrainerPreemptionCallback  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "transformers_train.py"
PAGE = "docs/ways-in/transformers.md"
STEPS_PER_EPOCH = 12  # 96 samples, batch 8, one process; 6 with two
STOP_LINE = (
    r"preempted: checkpointed step (\d+) \S+ s after the notice \(SIGTERM\) in (\S+); "
    r"exiting with 143"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PREEMPTIBLE_"))}
    return {**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def _example(root: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(EXAMPLE), "--dir", str(root), *args]
    return subprocess.Popen(
        command,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _committed(root: Path, step: int) -> bool:
    return (root / "preemptible" / f"step-{step:012d}" / "manifest.json").is_file()


def _final(root: Path, rank: int = 0) -> dict[str, Any]:
    """What the final checkpoint holds of one rank: its RNG states, and on rank 0 the state the
    ranks share, but the trainer state (its log history holds timings and windowed losses)."""
    store = Checkpointer(root / "preemptible")
    latest = store.latest()
    assert latest is not None
    loaded = store.load(latest.step, rank=rank)
    trainer = loaded["trainer"]
    shared = trainer.get("shared", {})
    state = json.loads(shared.pop("trainer_state")) if shared else None
    if state is not None:
        assert state["global_step"] == latest.step
    return {"step": latest.step, "rng": trainer["rng"], "shared": shared, "ours": loaded}


def _assert_bitwise(uninterrupted: Path, resumed: Path, ranks: int = 1) -> None:
    for rank in range(ranks):
        a, b = _final(uninterrupted, rank), _final(resumed, rank)
        assert a["step"] == b["step"]
        assert_same(a["shared"], b["shared"], f"rank {rank}: shared")  # weights, optimizer...
        assert_same(a["rng"], b["rng"], f"rank {rank}: RNG states")
        assert_same(a["ours"]["_preemptible"], b["ours"]["_preemptible"], f"rank {rank}")


def test_the_page_shows_the_example_that_these_tests_run():
    assert block(PAGE, "transformers-train") == EXAMPLE.read_text()


def test_one_process_sigterm_mid_epoch_saves_exits_143_and_resumes_bitwise(tmp_path):
    cost_file = tmp_path / "cost.json"
    reference = Output(_example(tmp_path / "ref"))  # beside the other: two cores
    first = _example(
        tmp_path / "run", "--step-seconds", "0.2", PREEMPTIBLE_COST_FILE=str(cost_file)
    )
    output = Output(first)
    wait_until(lambda: _committed(tmp_path / "run", 5), "the save of step 5", timeout=120)
    first.send_signal(signal.SIGTERM)
    code, out = output.finish(timeout=60)
    assert code == 143, out
    stop = re.search(STOP_LINE, out)
    assert stop is not None, out
    stopped = int(stop.group(1))
    assert stopped > 5 and stopped % STEPS_PER_EPOCH != 0, out  # mid-epoch, after step 5
    assert stop.group(2) == str(tmp_path / "run" / "preemptible")
    step_url = tmp_path / "run" / "preemptible" / f"step-{stopped:012d}"
    cost = json.loads(cost_file.read_text())
    assert cost["last_checkpoint_step"] == stopped and cost["bytes"] > 0, cost
    assert cost["save_seconds_p95"] > 0 and cost["samples"] >= 2, cost

    resumed = _example(tmp_path / "run", PREEMPTIBLE_COST_FILE=str(cost_file))
    code, out = finish(resumed, timeout=120)
    assert code == 0, out
    assert f"preemptible: resuming from {step_url} at step {stopped}\n" in out, out
    assert "done: 36 steps" in out
    assert json.loads(cost_file.read_text())["restore_seconds"] > 0
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["preemptible"]  # folder removed
    code, out = reference.finish(timeout=120)
    assert code == 0, out
    _assert_bitwise(tmp_path / "ref", tmp_path / "run")


def _torchrun(root: Path, *args: str) -> subprocess.Popen[str]:
    env = _env()
    command = torchrun_command(str(EXAMPLE), "--dir", str(root), "--save-steps", "4", *args)
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def test_two_processes_stop_at_one_step_and_a_corrupted_newest_checkpoint_falls_back(tmp_path):
    reference = Output(_torchrun(tmp_path / "ref"))  # beside the other: it mostly sleeps
    first = _torchrun(tmp_path / "run", "--step-seconds", "0.3")
    output = Output(first)
    wait_until(lambda: _committed(tmp_path / "run", 4), "the save of step 4", timeout=120)
    first.send_signal(signal.SIGTERM)  # torchrun passes it on to both workers
    code, out = output.finish(timeout=60)
    stops = [int(step) for step, _ in re.findall(STOP_LINE, out)]
    assert len(stops) == 2 and stops[0] == stops[1], out  # both ranks, one step
    stopped = stops[0]
    store = Checkpointer(tmp_path / "run" / "preemptible")
    latest = store.latest()
    assert latest is not None and latest.step == stopped and latest.world_size == 2
    before = max(i.step for i in store.list() if i.step < stopped)
    assert before % (STEPS_PER_EPOCH // 2) != 0  # the resume below is mid-epoch

    # Flip bytes of rank 0's data file of the newest checkpoint, on disk.
    (data,) = (tmp_path / "run" / "preemptible" / f"step-{stopped:012d}").glob("rank00000-data-*")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))

    code, out = reference.finish(timeout=180)
    assert code == 0, out
    code, out = finish(_torchrun(tmp_path / "run"), timeout=180)
    assert code == 0, out
    assert f"skipping checkpoint step {stopped}: " in out and "checksum mismatch" in out, out
    assert out.count("preemptible: resuming from ") == 1, out  # rank 0 says it
    assert f"-{before:012d} at step {before}\n" in out, out
    _assert_bitwise(tmp_path / "ref", tmp_path / "run", ranks=2)

    # Resuming two processes' checkpoint with one is refused.
    trainer = _tiny_trainer(tmp_path / "one")
    callback = TrainerPreemptionCallback(trainer, tmp_path / "run" / "preemptible")
    with pytest.raises(ConfigError, match="saved by 2 processes, this run has 1"):
        callback.resume_path()


# --- in process ---------------------------------------------------------------------------------


class _Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.tokens = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def _tiny_trainer(output_dir: Path, **options: Any) -> Any:
    config = transformers.GPT2Config(
        vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    settings = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 4,
        "max_steps": 3,
        "save_steps": 2,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        **options,
    }
    args = transformers.TrainingArguments(**settings)
    model = transformers.GPT2LMHeadModel(config)
    return transformers.Trainer(model=model, args=args, train_dataset=_Tokens())


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"enable_jit_checkpoint": True}, "Set enable_jit_checkpoint=False"),
        (
            {"save_strategy": "best", "metric_for_best_model": "loss", "eval_strategy": "no"},
            "save_strategy='best'",
        ),
        ({"save_total_limit": 0}, "save_total_limit must be a positive integer"),
        ({"auto_find_batch_size": True}, "set per_device_train_batch_size yourself"),
    ],
    ids=["jit-checkpoint", "save-best", "save-total-limit", "auto-find-batch-size"],
)
def test_settings_the_callback_replaces_are_refused_saying_what_to_change(tmp_path, options, error):
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(ConfigError, match=error):
            TrainerPreemptionCallback(_tiny_trainer(tmp_path, **options))
    finally:
        signal.signal(signal.SIGTERM, before)  # the JIT checkpoint's, set by the Trainer


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"takes the transformers\.Trainer"):
        TrainerPreemptionCallback(object())
    trainer = _tiny_trainer(tmp_path)
    with pytest.raises(ConfigError, match="'fail' or 'start_over'"):
        TrainerPreemptionCallback(trainer, on_no_valid_checkpoint="retry")
    TrainerPreemptionCallback(trainer)
    with pytest.raises(ConfigError, match="has a TrainerPreemptionCallback already"):
        TrainerPreemptionCallback(trainer)


class _NoticeAt(transformers.TrainerCallback):
    """A notice at the end of one step: a real signal to this process, or a request as the queue
    manager's notice watcher makes."""

    def __init__(self, step: int, notice: Any) -> None:
        self.step, self.notice = step, notice

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            self.notice()


@pytest.mark.parametrize("kind", ["SIGUSR1", "queue manager"])
def test_a_notice_saves_the_step_in_progress_and_exits_with_its_code(tmp_path, caplog, kind):
    trainer = _tiny_trainer(tmp_path, max_steps=6, save_steps=100)
    preemption = TrainerPreemptionCallback(trainer)

    def notice() -> None:
        if kind == "SIGUSR1":
            os.kill(os.getpid(), signal.SIGUSR1)
        else:
            assert preemption.context is not None
            preemption.context.guard.request("queue manager: reclaimed")

    trainer.add_callback(_NoticeAt(2, notice))  # after the callback: seen at step 3's end
    caplog.set_level("INFO", logger="preemptible")
    with pytest.raises(SystemExit) as done:
        trainer.train(resume_from_checkpoint=preemption.resume_path())
    assert done.value.code == (138 if kind == "SIGUSR1" else 143)
    assert [i.step for i in Checkpointer(tmp_path / "preemptible").list()] == [3]
    assert "checkpointed step 3 " in caplog.text and f"({kind}" in caplog.text
    assert preemption.context is None  # closed: the signal handlers are gone


def test_checkpoints_without_resume_path_are_refused_and_a_finished_run_exits_0(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.chdir(tmp_path)
    out = Path("out")  # relative, as a script's output_dir often is
    handlers = signal.getsignal(signal.SIGTERM)
    trainer = _tiny_trainer(out)
    TrainerPreemptionCallback(trainer)
    trainer.train()
    steps = [i.step for i in Checkpointer(out / "preemptible").list()]
    assert steps == [2, 3]  # save_steps, then the last step: our store, no checkpoint-N
    assert sorted(p.name for p in out.iterdir()) == ["preemptible"]

    again = _tiny_trainer(out)
    TrainerPreemptionCallback(again)
    with pytest.raises(ConfigError, match="was not given resume_from_checkpoint"):
        again.train()

    again = _tiny_trainer(out)
    callback = TrainerPreemptionCallback(again)
    caplog.set_level("INFO", logger="preemptible")
    with pytest.raises(AlreadyComplete) as done:
        again.train(resume_from_checkpoint=callback.resume_path())
    assert done.value.code == 0
    assert "already complete at step 3" in caplog.text
    assert sorted(p.name for p in out.iterdir()) == ["preemptible"]  # folder removed
    assert signal.getsignal(signal.SIGTERM) is handlers  # ours are gone
