"""Context and @preemptible in-process: notices are requested programmatically (real signals are
in tests/integration), exits are SystemExit, and every checkpoint is real, on a temp dir."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from preemptible import AlreadyComplete, Checkpointer, Context, preemptible
from preemptible.errors import ConfigError, NoValidCheckpointError, PreemptibleWarning


def make_train(root, seen: list[int], **options):
    @preemptible(root, **{"every_steps": 100, **options})
    def train(ctx: Context, total: int = 8, stop_at: int | None = None) -> list[float]:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        ctx.register(model=model)
        for step in ctx.steps(total):
            seen.append(step)
            with torch.no_grad():
                model.weight.add_(torch.randn(1, 3))  # draws from the RNG that is checkpointed
            if step == stop_at:
                ctx.guard.request("test")
        return model.weight.flatten().tolist()

    return train


def test_the_decorated_function_returns_its_result_after_a_final_save(tmp_path):
    seen: list[int] = []
    result = make_train(tmp_path, seen, async_save=False)(total=10)
    assert seen == list(range(10)) and len(result) == 3
    assert [i.step for i in Checkpointer(tmp_path).list()] == [9]


@pytest.mark.parametrize("async_save", [True, False])
def test_a_notice_saves_the_step_exits_143_and_the_rerun_continues_exactly(tmp_path, async_save):
    reference = make_train(tmp_path / "ref", [])()
    seen: list[int] = []
    train = make_train(tmp_path / "run", seen, async_save=async_save)
    with pytest.raises(SystemExit) as exit_:
        train(stop_at=3)
    assert exit_.value.code == 143 and seen == [0, 1, 2, 3]
    assert Checkpointer(tmp_path / "run").latest().step == 3
    seen.clear()
    assert train() == reference  # bit-exact: same floats
    assert seen == [4, 5, 6, 7]


def test_the_exit_code_can_be_configured(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        make_train(tmp_path, [], exit_code=3)(stop_at=0)
    assert exit_.value.code == 3


def test_every_steps_saves_after_each_nth_completed_step(tmp_path):
    seen: list[int] = []

    @preemptible(tmp_path, every_steps=3, keep=None)
    def train(ctx: Context) -> None:
        ctx.register(x={"v": torch.zeros(1)})
        for step in ctx.steps(7):
            seen.append(step)

    train()
    assert [i.step for i in Checkpointer(tmp_path).list()] == [2, 5, 6]


def test_save_now_saves_at_the_end_of_the_current_step(tmp_path):
    @preemptible(tmp_path, keep=None, async_save=False)
    def train(ctx: Context) -> None:
        ctx.register(x={"v": torch.zeros(1)})
        for step in ctx.steps(5):
            if step == 1:
                ctx.save_now()

    train()
    assert [i.step for i in Checkpointer(tmp_path).list()] == [1, 4]


def test_the_cost_file_is_written_after_saves(tmp_path, monkeypatch):
    cost_file = tmp_path / "cost" / "cost.json"
    monkeypatch.setenv("PREEMPTIBLE_COST_FILE", str(cost_file))
    make_train(tmp_path / "ckpt", [], async_save=False)(total=3)
    data = json.loads(cost_file.read_text())
    for field in (
        "save_seconds_p95",
        "stall_seconds_p95",
        "restore_seconds",
        "bytes",
        "last_checkpoint_step",
        "last_checkpoint_time",
        "samples",
        "updated_at",
    ):
        assert field in data
    assert data["last_checkpoint_step"] == 2 and data["samples"] == 1 and data["bytes"] > 0


def test_register_rejects_the_reserved_key_and_late_registration(tmp_path):
    ctx = Context(tmp_path)
    with pytest.raises(ConfigError, match="reserved"):
        ctx.register(_preemptible={})
    ctx.register(x={"v": torch.zeros(1)})
    steps = ctx.steps(2)
    next(steps)
    with pytest.raises(ConfigError, match="before steps"):
        ctx.register(y={})
    steps.close()
    ctx.close()


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"interval": "hourly"}, "interval"),
        ({"every_steps": 0}, "every_steps"),
        ({"every_seconds": -1}, "every_seconds"),
        ({"interval": "auto", "every_seconds": 5}, "auto"),
        ({"on_no_valid_checkpoint": "restart"}, "on_no_valid_checkpoint"),
    ],
)
def test_bad_options_are_refused_with_a_message(tmp_path, options, needle):
    with pytest.raises(ConfigError, match=needle):
        Context(tmp_path, **options)


def test_a_failed_background_save_does_not_cost_the_notice_checkpoint(caplog):
    from tests import faulty_fs

    ckpt = Checkpointer(f"faulty://runtime-{id(caplog)}", async_mode="copy")
    faulty_fs.PLAN.written, faulty_fs.PLAN.fail_after_bytes = 0, 10
    try:

        @preemptible(None, checkpointer=ckpt, every_steps=2)
        def train(ctx: Context) -> None:
            ctx.register(x={"v": torch.zeros(4)})
            for step in ctx.steps(10):
                if step == 2:
                    ctx.checkpointer.wait = _after_fixing_storage(ctx.checkpointer.wait)
                    ctx.guard.request("test")

        with pytest.raises(SystemExit) as exit_:
            train()
    finally:
        faulty_fs.PLAN.fail_after_bytes = None
    assert exit_.value.code == 143
    assert ckpt.latest().step == 2  # step 1's background save failed; step 2 was still saved
    assert "saving step 2 synchronously" in caplog.text  # the Context saw the failure


def _after_fixing_storage(wait):
    def fixed():
        from tests import faulty_fs

        try:
            return wait()
        finally:
            faulty_fs.PLAN.fail_after_bytes = None  # the disk is back for the final save

    return fixed


def test_a_grace_shorter_than_the_measured_save_is_warned_about(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PREEMPTIBLE_GRACE_SECONDS", "0.000001")  # shorter than any real save
    seen: list[int] = []
    with caplog.at_level(logging.WARNING, logger="preemptible"):
        make_train(tmp_path, seen, every_steps=1, async_save=False)(total=3)
    warnings = [r.message for r in caplog.records if "The grace period" in r.message]
    assert len(warnings) == 1  # once per problem, not once per save
    assert "1e-06 s (from PREEMPTIBLE_GRACE_SECONDS)" in warnings[0]
    assert "(p95 of 1 saves)" in warnings[0] and "Set PREEMPTIBLE_GRACE_SECONDS=1 " in warnings[0]


def test_a_restart_checks_the_grace_against_the_save_of_the_checkpoint_it_resumed(
    tmp_path, monkeypatch, caplog
):
    make_train(tmp_path, [], async_save=False)(total=2)  # leaves step 1
    monkeypatch.setenv("PREEMPTIBLE_GRACE_SECONDS", "0.000001")
    with caplog.at_level(logging.WARNING, logger="preemptible"), pytest.raises(SystemExit):
        make_train(tmp_path, [], async_save=False)(total=4, stop_at=2)
    first = next(r for r in caplog.records if "The grace period" in r.message)
    assert "the save of step 1, in an earlier run" in first.message


def test_a_negotiated_grace_that_is_too_short_points_at_the_queue_config(tmp_path):
    from preemptible.runtime.deadline import GraceCheck
    from preemptible.runtime.queue_link import Terms

    ctx = Context(tmp_path, every_steps=1)
    ctx._queue_terms(Terms(grace_s=60.0, min_runtime_s=600.0, interval_hint_s=None))
    warning = GraceCheck()(ctx.guard.grace, 50.0, measured="p95 of 9 saves")
    assert warning is not None and "(from queue manager)" in warning
    assert 'grace_max = "75s" or more' in warning


def test_a_loop_steps_does_not_run_drives_context_with_start_step_done_and_save(tmp_path):
    model = torch.nn.Linear(2, 1)
    ctx = Context(tmp_path, every_steps=2, async_save=False)
    ctx.register(model=model)
    assert ctx.start() is None  # a first run
    ctx.step_done(0)
    ctx.step_done(1)  # every_steps=2: saves step 1
    ctx.save(2)
    assert [i.step for i in Checkpointer(tmp_path).list()] == [1, 2]
    assert set(ctx.state()) == {"model", "_preemptible"}
    ctx.guard.request("test")
    with pytest.raises(SystemExit) as exit_:
        ctx.step_done(3)
    assert exit_.value.code == 143 and Checkpointer(tmp_path).latest().step == 3
    ctx.close()

    again = Context(tmp_path, every_steps=2)
    again.register(model=torch.nn.Linear(2, 1))
    assert again.start() == 3
    with pytest.raises(ConfigError, match="once"):
        again.start()
    again.close()


def test_agree_leaves_the_stop_to_the_caller_which_stop_then_saves_and_exits(tmp_path):
    # For a framework whose save point comes later in its step than the step's end.
    ctx = Context(tmp_path, every_steps=2, async_save=False)
    ctx.register(model=torch.nn.Linear(2, 1))
    ctx.start()
    assert ctx.agree(0) is False
    assert ctx.agree(1) is False  # every_steps=2: saves step 1, as step_done does
    assert [i.step for i in Checkpointer(tmp_path).list()] == [1]
    with pytest.raises(ConfigError, match="follows an agree"):
        ctx.stop(2)  # no notice agreed on
    ctx.guard.request("test")
    assert ctx.agree(2) is True and ctx.should_stop
    assert Checkpointer(tmp_path).latest().step == 1  # nothing saved yet: the caller's turn
    with pytest.raises(SystemExit) as exit_:
        ctx.stop(2)
    assert exit_.value.code == 143 and Checkpointer(tmp_path).latest().step == 2
    ctx.close()


# --- resuming: nothing lost, nothing run twice, nothing misleading ---------------------------


def _flip_a_byte(root: Path, step: int) -> None:
    """A real bit flip in the middle of the first data file of checkpoint ``step``."""
    data = sorted((root / f"step-{step:012d}").glob("data-*.bin"))[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    data.write_bytes(bytes(raw))


def test_a_finished_run_started_again_says_so_and_exits_0_without_running_its_loop(
    tmp_path, caplog
):
    finished = make_train(tmp_path, [], async_save=False)(total=5)
    seen: list[int] = []
    with caplog.at_level(logging.INFO, logger="preemptible"), pytest.raises(SystemExit) as exit_:
        make_train(tmp_path, seen, async_save=False)(total=5)
    assert isinstance(exit_.value, AlreadyComplete) and exit_.value.code == 0
    assert exit_.value.step == 4 and seen == []  # no step ran, the code after the loop neither
    [done] = [r for r in caplog.records if "already complete" in r.message]
    assert done.levelno == logging.WARNING
    assert done.message.startswith("already complete at step 4: the checkpoint at ")
    assert "step-000000000004" in done.message and "steps 0 to 4" in done.message
    assert [i.step for i in Checkpointer(tmp_path).list()] == [4]  # nothing saved again
    seen.clear()
    assert make_train(tmp_path, seen, async_save=False)(total=7) != finished  # more steps: runs
    assert seen == [5, 6]


def test_every_resume_logs_the_step_and_the_checkpoint_it_resumed_from_once(tmp_path, caplog):
    with pytest.raises(SystemExit):
        make_train(tmp_path, [], async_save=False)(stop_at=2)
    with caplog.at_level(logging.INFO, logger="preemptible"):
        make_train(tmp_path, [], async_save=False)()
    resumed = [r for r in caplog.records if r.message.startswith("resumed from")]
    assert len(resumed) == 1 and resumed[0].levelno == logging.INFO
    assert resumed[0].name == "preemptible"
    where = Checkpointer(tmp_path).storage.describe("step-000000000002")
    assert resumed[0].message.startswith(f"resumed from step 2 at {where} in ")


def test_only_rank_0_logs_the_resume(tmp_path, caplog, monkeypatch):
    with pytest.raises(SystemExit):
        make_train(tmp_path, [], async_save=False)(stop_at=2)
    monkeypatch.setenv("RANK", "1")  # what torchrun sets; no process group: nothing to agree
    with caplog.at_level(logging.INFO, logger="preemptible"):
        make_train(tmp_path, [], async_save=False)()
    assert not [r for r in caplog.records if r.message.startswith("resumed from")]


def test_a_corrupt_newest_checkpoint_is_skipped_then_replaced_by_the_save_of_its_step(tmp_path):
    reference = make_train(tmp_path / "ref", [], async_save=False)()
    root = tmp_path / "run"
    with pytest.raises(SystemExit):
        make_train(root, [], every_steps=1, keep=None, async_save=False)(stop_at=4)
    _flip_a_byte(root, 4)  # steps 0 to 4 are committed; 4 is corrupt
    seen: list[int] = []
    with pytest.warns(PreemptibleWarning) as caught:
        result = make_train(root, seen, every_steps=1, keep=None, async_save=False)()
    messages = [str(w.message) for w in caught]
    assert any("skipping checkpoint step 4" in m for m in messages)
    assert any("step 4 at " in m and "is corrupt" in m and "trash" in m for m in messages)
    assert seen == [4, 5, 6, 7] and result == reference  # from step 3's, exactly
    ckpt = Checkpointer(root)
    assert ckpt.verify(4).ok and [i.step for i in ckpt.list()] == list(range(8))


def test_when_no_checkpoint_is_valid_the_run_stops_and_names_them(tmp_path):
    make_train(tmp_path, [], every_steps=2, keep=None, async_save=False)(total=4)
    for step in (1, 3):
        _flip_a_byte(tmp_path, step)
    seen: list[int] = []
    with pytest.warns(PreemptibleWarning), pytest.raises(NoValidCheckpointError) as err:
        make_train(tmp_path, seen, every_steps=2, keep=None, async_save=False)()
    assert seen == [] and err.value.steps == [3, 1]
    assert 'on_no_valid_checkpoint="start_over"' in str(err.value)
    assert [i.step for i in Checkpointer(tmp_path).list()] == [1, 3]  # nothing was changed


def test_start_over_moves_the_corrupt_checkpoints_aside_and_runs_from_step_0(tmp_path, caplog):
    reference = make_train(tmp_path / "ref", [], async_save=False)()
    root = tmp_path / "run"
    make_train(root, [], every_steps=2, keep=2, async_save=False)()  # leaves 5 and 7
    for step in (5, 7):
        _flip_a_byte(root, step)
    seen: list[int] = []
    train = make_train(
        root, seen, every_steps=2, keep=2, async_save=False, on_no_valid_checkpoint="start_over"
    )
    with caplog.at_level(logging.WARNING, logger="preemptible"), pytest.warns(PreemptibleWarning):
        result = train()
    assert seen == list(range(8)) and result == reference
    assert "starting over from step 0" in caplog.text and "steps 7, 5" in caplog.text
    ckpt = Checkpointer(root)
    assert [i.step for i in ckpt.list()] == [5, 7] and all(ckpt.verify(s).ok for s in (5, 7))
