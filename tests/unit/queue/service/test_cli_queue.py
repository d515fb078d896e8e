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
from preemptible.errors import ConfigError
from preemptible.queue.service.app import create_app
from preemptible.queue.service.auth import resolve_tokens
from preemptible.queue.service.views import JobView, SubmitRequest

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
ServerCalls = list[tuple[Path, Path, str, int]]


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
    result = cli(
        "submit", "--queue", "team-a", "--gpus", "2", "--tier", "high", "--cpus", "8",
        "--memory-gb", "64", "--estimate", "2h", "--name", "exp1", "--env", "A=1",
        "--env", "B=x=y", "--cwd", str(tmp_path), "--no-gang",
        "--", "python", "train.py", "--lr", "3e-4",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    req = fake.submissions[-1]
    assert req.command == ["python", "train.py", "--lr", "3e-4"]
    assert (req.queue, req.gpus, req.tier, req.cpus, req.memory_gb) == ("team-a", 2, "high", 8, 64)
    assert req.estimate_s == 7200 and req.name == "exp1" and req.gang is False
    assert req.env == {"A": "1", "B": "x=y"} and req.cwd == str(tmp_path)
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
        (["--tier", "urgent"], "tier"),
        (["--gpus", "99"], "99 GPUs"),
    ],
    ids=["env", "estimate", "tier", "too-many-gpus"],
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


def test_cancel_then_cancel_again(cli: RunCli, fake: FakeQueueManager) -> None:
    job = started(fake)
    result = cli("cancel", job.id)
    assert result.exit_code == 0 and result.stdout.startswith(f"{job.id}: cancelled")
    again = cli("cancel", job.id)
    assert again.exit_code == 2 and "already" in one_error_line(again)


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

    def run_server(config_path: Path, state_dir: Path, host: str, port: int) -> None:
        calls.append((config_path, state_dir, host, port))
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
    assert fake_server == [(config, tmp_path / "st", "127.0.0.1", 9100)]


def test_serve_defaults_the_state_to_the_users_data_folder(
    fake_server: ServerCalls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = tmp_path / "queue.toml"
    config.write_text("")
    assert CliRunner().invoke(app, ["serve", "--config", str(config)]).exit_code == 0
    (_, state_dir, host, port) = fake_server[0]
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
    for command in ("serve", "submit", "status", "why", "cancel", "events", "stats", "logs"):
        assert command in out
