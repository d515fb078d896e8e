"""`preemptible queue ...` against a live server over the fake manager.

Most tests run the typer app in-process (`CliRunner`); those that follow output or check the
installed command run `python -m preemptible queue ...` as a subprocess.
"""

from __future__ import annotations

import json
import os
import queue as queue_module
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from typer.testing import CliRunner, Result

from preemptible.cli.queue import app
from preemptible.errors import ConfigError, JobStateError
from preemptible.queue.service import containment
from preemptible.queue.service.app import create_app
from preemptible.queue.service.auth import resolve_tokens
from preemptible.queue.service.containment import Mechanism
from preemptible.queue.service.views import CostView, JobView, SubmitRequest

from .fake_manager import (
    ADMIN_TOKEN,
    ENVIRON,
    TEAM_A_TOKEN,
    TEAM_B_TOKEN,
    FakeQueueManager,
    live_server,
    make_config,
)

TOKENS = resolve_tokens(make_config(), ENVIRON)
ServerCalls = list[tuple[Path, Path, str, int, bool]]


class RunCli(Protocol):
    def __call__(
        self, *args: str, token: str | None = TEAM_A_TOKEN, server: str | None = None
    ) -> Result: ...


@pytest.fixture(scope="module")
def fake() -> FakeQueueManager:
    return FakeQueueManager(make_config())


@pytest.fixture(scope="module")
def url(fake: FakeQueueManager) -> Iterator[str]:
    with live_server(create_app(fake, tokens=TOKENS)) as base:
        yield base


@pytest.fixture
def cli(url: str) -> RunCli:
    """Run `preemptible queue ARGS` in-process, as team-a unless `token` says otherwise."""
    runner = CliRunner()

    def run(*args: str, token: str | None = TEAM_A_TOKEN, server: str | None = None) -> Result:
        env = {"PREEMPTIBLE_QUEUE_URL": server or url, "PREEMPTIBLE_TOKEN": token or ""}
        return runner.invoke(app, list(args), env=env)

    return run


def started(fake: FakeQueueManager, queue: str = "team-a", **kwargs: Any) -> JobView:
    job = fake.submit(SubmitRequest(queue=queue, command=["python", "train.py"], **kwargs))
    return fake.start(job.id)


def one_error_line(result: Result) -> str:
    lines: list[str] = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- submit --------------------------------------------------------------------------------------


def test_submit_sends_every_option_and_the_command_after_the_dashes(
    cli: RunCli, fake: FakeQueueManager, tmp_path: Path
) -> None:
    first = fake.submit(SubmitRequest(queue="team-a", command=["x"])).id
    result = cli(
        "submit", "--queue", "team-a", "--gpus", "2", "--tier", "high", "--cpus", "8",
        "--memory-gb", "64", "--estimate", "2h", "--name", "exp1", "--env", "A=1",
        "--env", "B=x=y", "--cwd", str(tmp_path), "--no-gang", "--max-restarts", "1",
        "--hang-after", "5m", "--after", first, "--after", f"{first}:started",
        "--", "python", "train.py", "--lr", "3e-4",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    req = fake.submissions[-1]
    assert req.command == ["python", "train.py", "--lr", "3e-4"]
    assert (req.queue, req.gpus, req.tier, req.cpus, req.memory_gb) == ("team-a", 2, "high", 8, 64)
    assert req.estimate_s == 7200 and req.name == "exp1" and req.gang is False
    assert req.env == {"A": "1", "B": "x=y"} and req.cwd == str(tmp_path)
    assert req.max_restarts == 1 and req.hang_after_s == 300
    assert req.after == [first, f"{first}:started"]
    job_id = fake.list_jobs()[-1].id
    assert result.stdout.strip() == f"submitted job {job_id} to team-a (pending)"


def test_submit_takes_the_command_without_dashes_and_defaults_the_cwd(
    cli: RunCli, fake: FakeQueueManager
) -> None:
    result = cli("submit", "--queue", "team-a", "python", "x.py", "--lr", "3")
    assert result.exit_code == 0, result.output
    req = fake.submissions[-1]
    assert req.command == ["python", "x.py", "--lr", "3"] and req.cwd == os.getcwd()
    assert req.gpus == 0 and req.tier == "normal" and req.estimate_s is None and req.gang is None


def test_submit_json_prints_the_job(cli: RunCli) -> None:
    result = cli("submit", "--queue", "team-a", "--json", "--", "true")
    assert json.loads(result.stdout)["queue"] == "team-a"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--env", "NOVALUE"], "--env expects KEY=VALUE"),
        (["--estimate", "soon"], "--estimate"),
        (["--hang-after", "later"], "--hang-after"),
        (["--tier", "urgent"], "tier"),
        (["--gpus", "99"], "99 GPUs"),
    ],
    ids=["env", "estimate", "hang-after", "tier", "too-many-gpus"],
)
def test_a_bad_submission_is_one_error_line_and_exit_2(
    cli: RunCli, args: list[str], words: str
) -> None:
    result = cli("submit", "--queue", "team-a", *args, "--", "true")
    assert result.exit_code == 2
    assert words in one_error_line(result)


def test_submitting_to_another_teams_queue_is_refused(cli: RunCli) -> None:
    result = cli("submit", "--queue", "team-a", "--", "true", token=TEAM_B_TOKEN)
    assert result.exit_code == 2
    assert "may submit only to its own queue" in one_error_line(result)


def test_without_a_token_the_error_says_where_to_put_one(cli: RunCli) -> None:
    result = cli("status", token=None)
    assert result.exit_code == 2 and "PREEMPTIBLE_TOKEN" in one_error_line(result)


def test_a_bad_token_is_exit_2(cli: RunCli) -> None:
    result = cli("status", token="nope-not-a-token")
    assert result.exit_code == 2 and "not valid" in one_error_line(result)


def test_an_unreachable_server_is_exit_1_naming_the_url(cli: RunCli) -> None:
    with_socket_closed = "http://127.0.0.1:9"  # discard port: nothing listens
    result = cli("status", server=with_socket_closed)
    assert result.exit_code == 1
    assert "http://127.0.0.1:9" in one_error_line(result)


def test_a_url_without_a_scheme_is_a_usage_error(cli: RunCli) -> None:
    result = cli("status", server="localhost:8470")
    assert result.exit_code == 2 and "http://" in one_error_line(result)


def test_a_server_error_is_exit_1(cli: RunCli, fake: FakeQueueManager) -> None:
    fake.fail_with = RuntimeError("store gone")
    try:
        result = cli("stats")
    finally:
        fake.fail_with = None
    assert result.exit_code == 1 and "internal error" in one_error_line(result)


# --- status, why, cancel -----------------------------------------------------------------------


def test_status_shows_waiting_and_running_jobs_like_squeue(
    cli: RunCli, fake: FakeQueueManager
) -> None:
    running = started(fake, gpus=1, name="exp-running")
    pending = fake.submit(SubmitRequest(queue="team-a", command=["x"], name="exp-pending"))
    done = started(fake, name="exp-done")
    fake.finish(done.id)
    result = cli("status")
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0].split()
    assert header == ["ID", "NAME", "QUEUE", "TIER", "STATE", "GPUS", "WAITED", "REASON"]
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert rows[running.id][1:6] == ["exp-running", "team-a", "normal", "running", "1"]
    assert rows[pending.id][4] == "pending"
    assert done.id not in rows
    assert done.id in cli("status", "--all").stdout
    assert done.id in cli("status", "--state", "completed").stdout


def test_status_of_a_queue_token_shows_only_its_queue(cli: RunCli, fake: FakeQueueManager) -> None:
    theirs = started(fake, "team-b")
    assert theirs.id not in cli("status", "--all").stdout
    assert theirs.id in cli("status", "--all", token=ADMIN_TOKEN).stdout
    result = cli("status", "--queue", "team-b")
    assert result.exit_code == 2 and "own queue" in one_error_line(result)


def test_status_json_is_the_servers_list(cli: RunCli, fake: FakeQueueManager) -> None:
    job = started(fake)
    listed = json.loads(cli("status", "--json").stdout)
    assert job.id in {j["id"] for j in listed}


def test_why_prints_the_reason_and_history(cli: RunCli, fake: FakeQueueManager) -> None:
    job = started(fake)
    result = cli("why", job.id)
    assert result.exit_code == 0
    first, *history = result.stdout.splitlines()
    assert first == f"{job.id}: running: admitted within nominal quota"
    assert "admitted" in history[0] and "submitted" in history[1]
    assert json.loads(cli("why", job.id, "--json").stdout)["id"] == job.id


def test_why_shows_a_claim_counted_as_less(cli: RunCli, fake: FakeQueueManager) -> None:
    job = started(fake)
    fake.report_cost(job.id, CostView(save_seconds_p95=20.0, restore_seconds=604800.0))
    first, clamp, *history = cli("why", job.id).stdout.splitlines()
    assert first.startswith(f"{job.id}: running: ")
    assert clamp == "  claimed restore 604800 s, counted as 1800 s (max_claimed_restore)"
    assert [line.split()[2] for line in history] == ["negotiated", "admitted", "submitted"]
    answer = json.loads(cli("why", job.id, "--json").stdout)
    assert answer["clamped"] == [clamp.strip()]


def test_cancel_then_cancel_again(cli: RunCli, fake: FakeQueueManager) -> None:
    job = started(fake)
    result = cli("cancel", job.id)
    assert result.exit_code == 0 and result.stdout.startswith(f"{job.id}: cancelled")
    again = cli("cancel", job.id)
    assert again.exit_code == 2 and "already" in one_error_line(again)


def test_cancel_many_by_id_or_by_queue_state_and_name(cli: RunCli, fake: FakeQueueManager) -> None:
    sweep = [
        fake.submit(SubmitRequest(queue="team-a", command=["x"], name=f"sweep-{i}")).id
        for i in range(3)
    ]
    other = fake.submit(SubmitRequest(queue="team-a", command=["x"], name="pretrain")).id
    theirs = fake.submit(SubmitRequest(queue="team-b", command=["x"], name="sweep-b")).id
    result = cli("cancel", "--queue", "team-a", "--name", "sweep-*")
    assert result.exit_code == 0, result.output
    assert sorted(line.split(":")[0] for line in result.stdout.splitlines()) == sorted(sweep)
    assert {fake.get_job(j).state.value for j in sweep} == {"cancelled"}
    assert fake.get_job(other).state.value == "pending"
    assert fake.get_job(theirs).state.value == "pending", "another queue's: not selected"
    # by id: each is done, a refusal is said on its own line and makes the exit 2
    both = cli("cancel", other, sweep[0])
    assert both.exit_code == 2 and both.stdout.startswith(f"{other}: cancelled")
    assert both.stderr.strip() == f"error: {sweep[0]}: job {sweep[0]} has already cancelled"
    assert cli("cancel", "--name", "nothing-*", "--queue", "team-a").stdout.strip() == (
        "no job matches"
    )
    for bad in (["cancel"], ["cancel", other, "--queue", "team-a"]):
        assert cli(*bad).exit_code == 2


def test_hold_and_release_pending_jobs(cli: RunCli, fake: FakeQueueManager) -> None:
    jobs = [
        fake.submit(SubmitRequest(queue="team-a", command=["x"], name=f"h{i}")).id for i in (1, 2)
    ]
    held = cli("hold", *jobs)
    assert held.exit_code == 0 and all("held" in line for line in held.stdout.splitlines())
    assert all(fake.get_job(j).held for j in jobs)
    released = cli("release", "--queue", "team-a", "--name", "h*")
    assert released.exit_code == 0, released.output
    assert not any(fake.get_job(j).held for j in jobs)
    running = started(fake)
    refused = cli("hold", running.id)
    assert refused.exit_code == 2 and "only a pending job" in one_error_line(refused)
    submitted = cli("submit", "--queue", "team-a", "--hold", "--", "true")
    assert submitted.exit_code == 0 and fake.submissions[-1].hold is True


def test_an_unknown_job_is_exit_2(cli: RunCli) -> None:
    for command in ("why", "cancel", "logs"):
        result = cli(command, "no-such-job")
        assert result.exit_code == 2 and "no-such-job" in one_error_line(result)


# --- events, stats, logs -----------------------------------------------------------------------


def test_events_print_one_line_each(cli: RunCli, fake: FakeQueueManager) -> None:
    job = started(fake)
    result = cli("events", "--job", job.id)
    lines = result.stdout.splitlines()
    assert [line.split()[3] for line in lines] == ["submitted", "admitted"]
    assert all(job.id in line and "team-a" in line for line in lines)
    after = int(lines[0].split()[0])
    assert len(cli("events", "--job", job.id, "--since", str(after)).stdout.splitlines()) == 1
    assert [e["kind"] for e in json.loads(cli("events", "--job", job.id, "--json").stdout)] == [
        "submitted",
        "admitted",
    ]


def test_status_and_events_follow_the_pages_to_the_end(cli: RunCli, fake: FakeQueueManager) -> None:
    ids = [fake.submit(SubmitRequest(queue="team-b", command=["x"])).id for _ in range(1100)]
    listed = [j["id"] for j in json.loads(cli("status", "--json", token=TEAM_B_TOKEN).stdout)]
    assert len(listed) == len(set(listed)) and set(ids) <= set(listed)
    table = cli("status", token=TEAM_B_TOKEN).stdout.splitlines()
    assert {line.split()[0] for line in table[1:]} >= set(ids)
    events = fake.events(queue="team-b", limit=10**9)
    lines = cli("events", "--queue", "team-b", token=TEAM_B_TOKEN).stdout.splitlines()
    assert [int(line.split()[0]) for line in lines] == [e.id for e in events]
    as_json = json.loads(cli("events", "--queue", "team-b", "--json", token=TEAM_B_TOKEN).stdout)
    assert [e["id"] for e in as_json] == [e.id for e in events]


def test_events_say_who_asked_for_each_change(cli: RunCli) -> None:
    job_id = cli("submit", "--queue", "team-a", "--json", "--", "x").stdout
    job_id = json.loads(job_id)["id"]
    assert cli("cancel", job_id, token=ADMIN_TOKEN).exit_code == 0
    lines = cli("events", "--job", job_id).stdout.splitlines()
    assert [line.split()[3:7] for line in lines] == [
        ["submitted", job_id, "team-a", "queue:team-a"],
        ["cancelled", job_id, "team-a", "admin"],
    ]
    found = json.loads(cli("events", "--job", job_id, "--json").stdout)
    assert [e["by"] for e in found] == [
        {"kind": "queue", "name": "team-a"},
        {"kind": "admin", "name": "admin"},
    ]


def test_stats_show_the_four_signals_per_queue(cli: RunCli) -> None:
    result = cli("stats")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["QUEUE", "JOBS", "P95"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["team-b"][2] == "2.0m" and rows["team-a"][4] == "75.0%"
    assert "(overall)" in rows
    assert lines[-1].startswith("max wait of the least-served queue: 2.0m")
    assert set(json.loads(cli("stats", "--json").stdout)["queues"]) == {"team-a", "team-b"}


def test_logs_print_the_whole_output_even_past_one_slice(
    cli: RunCli, fake: FakeQueueManager
) -> None:
    job = started(fake)
    text = "".join(f"line {i} ✓\n" for i in range(40_000))  # ~0.5 MB: several slices
    fake.write_log(job.id, text)
    result = cli("logs", job.id)
    assert result.exit_code == 0 and result.stdout == text


def test_logs_of_an_earlier_attempt(cli: RunCli, fake: FakeQueueManager) -> None:
    job = started(fake)
    fake.write_log(job.id, "first try\n")
    fake.start(job.id)  # a second attempt, after a requeue
    fake.write_log(job.id, "second try\n")
    assert cli("logs", job.id).stdout == "second try\n"
    assert cli("logs", job.id, "--attempt", "1").stdout == "first try\n"
    result = cli("logs", job.id, "--attempt", "5")
    assert result.exit_code == 2 and "attempt 5" in one_error_line(result)


# --- control characters: what a job says never drives the reader's terminal ---------------------

# Clears the screen, retitles the window, starts an 8-bit CSI, and asks rich for a link and an
# emoji; every field of the job says it.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b6n[link=https://e.x]:warning:"
SHOWN = "\\x1b[2J\\x1b]0;pwned\\x07\\x9b6n[link=https://e.x]:warning:"
CONTROLS = ("\x1b", "\x07", "\x9b")


@pytest.fixture
def hostile(fake: FakeQueueManager) -> JobView:
    """A running job whose name, command, reason, events and log all carry escapes."""
    job = fake.submit(SubmitRequest(queue="team-a", command=[HOSTILE, HOSTILE], name=HOSTILE))
    fake.start(job.id)
    fake.notify(job.id, reason=HOSTILE)
    fake.write_log(job.id, f"{HOSTILE}\n")
    return fake.get_job(job.id)


@pytest.mark.parametrize(
    "command",
    [["status"], ["status", "--all"], ["why", "{id}"], ["events", "--job", "{id}"],
     ["logs", "{id}"]],
    ids=["status", "status-all", "why", "events", "logs"],
)  # fmt: skip
def test_no_control_character_of_a_job_reaches_the_terminal(
    cli: RunCli, hostile: JobView, command: list[str]
) -> None:
    result = cli(*(part.format(id=hostile.id) for part in command))
    assert result.exit_code == 0, result.output
    for control in CONTROLS:
        assert control not in result.stdout and control not in result.stderr, command
    assert SHOWN in result.stdout  # escaped, whole: rich read no markup and no emoji in it


def test_why_shows_the_reason_escaped_on_one_line(cli: RunCli, hostile: JobView) -> None:
    first, *history = cli("why", hostile.id).stdout.splitlines()
    assert first == f"{hostile.id}: preempting: {SHOWN}"
    assert history[0].endswith(f"notice       {SHOWN}")


def test_a_servers_error_message_reaches_the_terminal_escaped(
    cli: RunCli, fake: FakeQueueManager
) -> None:
    fake.fail_with = JobStateError(HOSTILE)
    try:
        result = cli("why", "j1")
    finally:
        fake.fail_with = None
    assert result.exit_code == 2 and one_error_line(result) == f"error: {SHOWN}"


def test_json_keeps_the_servers_answer_and_escapes_it_itself(cli: RunCli, hostile: JobView) -> None:
    result = cli("status", "--json")
    assert not any(control in result.stdout for control in CONTROLS)
    assert {j["id"]: j["name"] for j in json.loads(result.stdout)}[hostile.id] == HOSTILE
    assert "\\u001b]0;pwned\\u0007" in result.stdout
    first_chunk = cli("logs", hostile.id, "--json").stdout.splitlines()[0]
    assert json.loads(first_chunk)["text"] == f"{HOSTILE}\n"


def test_logs_escape_control_characters_but_keep_lines_and_tabs_unless_raw(
    cli: RunCli, fake: FakeQueueManager
) -> None:
    job = started(fake)
    written = "epoch 1\t\x1b[32mok\x1b[0m\n 50%|#####     |\r100%|##########|\n\u202egnp.exe\n"
    fake.write_log(job.id, written)
    shown = "epoch 1\t\\x1b[32mok\\x1b[0m\n 50%|#####     |\\r100%|##########|\n\\u202egnp.exe\n"
    assert cli("logs", job.id).stdout == shown
    assert cli("logs", job.id, "--raw").stdout == written


def test_the_signals_table_shows_queue_names_escaped() -> None:
    from rich.console import Console

    from preemptible.cli.queue import signals_table

    signals = {"jobs": 1, "p95_wait_s": 1.0, "max_wait_s": 2.0, "utilization": 0.5,
               "goodput": 0.5, "preemptions": 0, "preemptions_per_hour": 0.0,
               "lost_gpu_s_per_preemption": 0.0}  # fmt: skip
    console = Console(force_terminal=True, width=200)  # a terminal, and rich's markup on
    with console.capture() as captured:
        console.print(signals_table({"queues": {HOSTILE: signals}, "overall": signals}))
    assert SHOWN in captured.get()
    assert "\x1b]" not in captured.get() and "\x9b" not in captured.get()
    assert "resized" not in captured.get()  # no elastic job was resized: no line for it


def test_the_signals_table_counts_resizes_apart_from_preemptions() -> None:
    from rich.console import Console

    from preemptible.cli.queue import signals_table

    quiet = {"jobs": 1, "p95_wait_s": 1.0, "max_wait_s": 2.0, "utilization": 0.5,
             "goodput": 0.5, "preemptions": 1, "preemptions_per_hour": 1.0,
             "lost_gpu_s_per_preemption": 3.0, "resizes": 0, "resize_lost_gpu_s": 0.0}  # fmt: skip
    elastic = {**quiet, "preemptions": 0, "resizes": 2, "resize_lost_gpu_s": 1.25}
    stats = {"queues": {"team-a": quiet, "team-b": elastic}, "overall": quiet}
    console = Console(width=80)
    with console.capture() as captured:
        console.print(signals_table(stats))
    lines = captured.get().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[-1].rstrip() == "resized, apart from preemptions: team-b 2 (1.2 GPU-s)"


# --- subprocess: the installed command, and following ------------------------------------------


def spawn(url: str, *args: str, token: str = TEAM_A_TOKEN) -> subprocess.Popen[str]:
    env = {**os.environ, "PREEMPTIBLE_QUEUE_URL": url, "PREEMPTIBLE_TOKEN": token}
    return subprocess.Popen(
        [sys.executable, "-m", "preemptible", "queue", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def lines_of(proc: subprocess.Popen[str]) -> queue_module.Queue[str]:
    """A queue that receives the process's stdout lines as they come."""
    lines: queue_module.Queue[str] = queue_module.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_the_installed_command_shows_the_status_table(url: str, fake: FakeQueueManager) -> None:
    job = started(fake, name="from-subprocess")
    proc = spawn(url, "status")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert job.id in out and "from-subprocess" in out


def test_logs_follow_prints_new_output_and_stops_when_the_job_ends(
    url: str, fake: FakeQueueManager
) -> None:
    job = started(fake)
    fake.write_log(job.id, "epoch 1\n")
    proc = spawn(url, "logs", job.id, "--follow", "--interval", "0.05s")
    lines = lines_of(proc)
    assert lines.get(timeout=30) == "epoch 1\n"
    fake.write_log(job.id, "epoch 2\n")
    assert lines.get(timeout=30) == "epoch 2\n"
    fake.write_log(job.id, "done\n")
    fake.finish(job.id)
    assert proc.wait(timeout=30) == 0
    assert lines.get(timeout=5) == "done\n"


def test_events_follow_prints_events_as_they_happen(url: str, fake: FakeQueueManager) -> None:
    job = started(fake)
    proc = spawn(url, "events", "--follow", "--job", job.id, "--interval", "0.05s")
    try:
        lines = lines_of(proc)
        assert "submitted" in lines.get(timeout=30)
        assert "admitted" in lines.get(timeout=30)
        fake.finish(job.id, exit_code=3)
        assert "failed" in lines.get(timeout=30)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- serve -------------------------------------------------------------------------------------


@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch) -> ServerCalls:
    """Stands in for `preemptible.queue.service.server`, recording run_server's arguments."""
    calls: ServerCalls = []
    module = types.ModuleType("preemptible.queue.service.server")

    def run_server(
        config_path: Path,
        state_dir: Path,
        host: str,
        port: int,
        *,
        allow_jobs_as_root: bool,
        log_format: str = "plain",
    ) -> None:
        assert log_format == "plain"
        calls.append((config_path, state_dir, host, port, allow_jobs_as_root))
        if "broken" in str(config_path):
            raise ConfigError("queues[0].nominal: expected a table")

    module.run_server = run_server  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "preemptible.queue.service.server", module)
    return calls


def test_serve_passes_its_options_to_run_server(fake_server: ServerCalls, tmp_path: Path) -> None:
    config = tmp_path / "queue.toml"
    config.write_text("")
    result = CliRunner().invoke(
        app, ["serve", "--config", str(config), "--state", str(tmp_path / "st"), "--port", "9100"]
    )
    assert result.exit_code == 0, result.output
    assert fake_server == [(config, tmp_path / "st", "127.0.0.1", 9100, False)]
    result = CliRunner().invoke(app, ["serve", "--config", str(config), "--allow-jobs-as-root"])
    assert result.exit_code == 0, result.output
    assert fake_server[1][4] is True


def test_serve_defaults_the_state_to_the_users_data_folder(
    fake_server: ServerCalls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = tmp_path / "queue.toml"
    config.write_text("")
    assert CliRunner().invoke(app, ["serve", "--config", str(config)]).exit_code == 0
    (_, state_dir, host, port, _) = fake_server[0]
    assert (host, port) == ("127.0.0.1", 8470)
    assert state_dir.name == "queue" and state_dir.parent.name == "preemptible"


def test_serve_reports_a_bad_config_in_one_line(fake_server: ServerCalls, tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text("")
    result = CliRunner().invoke(app, ["serve", "--config", str(config)])
    assert result.exit_code == 2 and "queues[0].nominal" in one_error_line(result)


def test_serve_needs_an_existing_config(fake_server: ServerCalls, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--config", str(tmp_path / "none.toml")])
    assert result.exit_code == 2 and fake_server == []


def test_help_lists_every_command() -> None:
    out = CliRunner().invoke(app, ["--help"]).stdout
    for command in (
        "serve",
        "submit",
        "status",
        "why",
        "cancel",
        "events",
        "stats",
        "logs",
        "doctor",
    ):
        assert command in out


# --- doctor: how jobs are contained on this machine (probed for real) ---------------------------


def test_doctor_says_which_mechanism_is_in_force_here_and_why() -> None:
    chosen = containment.choose()

    result = CliRunner().invoke(app, ["doctor"])

    lines = result.stdout.splitlines()
    assert lines[0] == f"in force: {chosen.why}"
    assert lines[1] == "on this machine:"
    assert [line.split(":")[0].split(" (")[0].strip() for line in lines[2:]] == [
        m.value for m in Mechanism
    ]
    assert f"  {chosen.mechanism}" in "\n".join(lines[2:])
    assert result.exit_code == (1 if chosen.mechanism is Mechanism.PROCESS_GROUP else 0)


def test_doctor_without_a_writable_cgroup_names_the_subreaper_and_each_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup2 /proc/sys cgroup2 rw,relatime 0 0\n")
    monkeypatch.setattr(containment, "MOUNTS", str(mounts))

    result = CliRunner().invoke(app, ["doctor"])
    as_json = json.loads(CliRunner().invoke(app, ["doctor", "--json"]).stdout)

    assert result.exit_code == 0
    assert result.stdout.startswith(
        "in force: no writable cgroup: child subreaper; a process that escapes by double-fork "
        "and setsid is still adopted"
    )
    assert "  cgroup v2: not available: cannot make a cgroup under /proc/sys/preemptible" in (
        result.stdout
    )
    assert "  cgroup v1 freezer: not available: no cgroup v1 hierarchy with the freezer" in (
        result.stdout
    )
    assert "  child subreaper: in force\n  process group: available\n" in result.stdout
    assert as_json["in_force"] == "child subreaper"
    assert [m["available"] for m in as_json["mechanisms"]] == [False, False, False, True, True]


def test_doctor_help_explains_each_mechanism() -> None:
    out = " ".join(
        CliRunner().invoke(app, ["doctor", "--help"], env={"COLUMNS": "200"}).stdout.split()
    )
    for words in (
        "a process that calls setsid",
        "cgroup v2, cgroup v1 freezer, cgroup v1 pids: each attempt gets a cgroup of its own",
        "child subreaper: the job's runner adopts the job's orphans",
        "process group: the last resort",
        "Exit status 0 when jobs are contained",
    ):
        assert words in out


def test_status_colours_states_on_a_terminal_unless_no_color_and_says_each_state_once(
    fake: FakeQueueManager, url: str
) -> None:
    """Colour needs a terminal: the command runs under a pseudo-terminal here."""
    import pty

    pending = fake.submit(SubmitRequest(queue="team-a", command=["x"], name="exp"))
    with fake._changed:
        fake._set(fake._get(pending.id), reason="pending: waiting for its turn")

    def shown(**env: str) -> str:
        argv = [sys.executable, "-m", "preemptible", "queue", "status", "--url", url]
        environ = {**os.environ, "PREEMPTIBLE_TOKEN": TEAM_A_TOKEN, "COLUMNS": "120", **env}
        if "NO_COLOR" not in env:
            environ.pop("NO_COLOR", None)
        out = bytearray()
        pid, fd = pty.fork()
        if pid == 0:  # pragma: no cover - the child
            os.execve(sys.executable, argv, environ)
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.waitpid(pid, 0)
        return out.decode()

    coloured = shown()
    assert "\x1b[33mpending" in coloured, coloured  # yellow
    plain = shown(NO_COLOR="1")
    assert "\x1b[33m" not in plain and "pending" in plain, "NO_COLOR: no colour (bold stays)"
    row = next(line for line in plain.splitlines() if line.startswith(pending.id))
    assert "waiting for" in row and row.count("pending") == 1, row  # not "pending: waiting"


def test_status_watch_shows_the_table_again_until_ctrl_c(url: str, fake: FakeQueueManager) -> None:
    """Piped, each frame follows the last under a dated line; a job submitted meanwhile shows
    in a later frame; Ctrl-C ends it with status 0."""
    import signal

    first = started(fake, name="watched")
    proc = spawn(url, "status", "--watch", "--interval", "0.2s")
    try:
        lines = lines_of(proc)

        def until_line(text: str) -> None:
            while text not in lines.get(timeout=30):
                pass

        until_line("--- ")
        until_line(first.id)
        later = fake.submit(SubmitRequest(queue="team-a", command=["x"], name="later"))
        until_line(later.id)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
