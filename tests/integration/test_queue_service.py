"""`preemptible queue serve` for real: a server process, HTTP clients, jobs, SIGKILL, restart."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import httpx
import pytest

from tests.polling import wait_until

from .queue_server import CLI, Server, free_port, ready, wait_for
from .queue_server import submit as submit_command

CONFIG = """
[cluster]
gpus = 2

[preemption]
grace_min = "1s"
grace_max = "3s"
min_runtime = "0s"
cooldown = "0s"

[service]
admin_token = "env:TEST_ADMIN_TOKEN"

[[queues]]
name = "a"
nominal = { gpus = 1 }
token = "env:TEST_A_TOKEN"

[[queues]]
name = "b"
nominal = { gpus = 1 }
borrowing_limit = { gpus = 1 }
token = "env:TEST_B_TOKEN"
"""
TOKENS = {
    "TEST_ADMIN_TOKEN": "admin-secret",
    "TEST_A_TOKEN": "a-secret",
    "TEST_B_TOKEN": "b-secret",
}
# Saves on SIGTERM (a file stands for the checkpoint), then exits 143.
SAVER = (
    "import signal, sys, time, pathlib\n"
    "def stop(*a):\n"
    "    pathlib.Path('saved').write_text('x'); sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', flush=True)\n"
    "time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 60)\n"
)


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path, CONFIG, TOKENS)
    s.start()
    yield s
    s.stop()


def submit(client: httpx.Client, queue: str, code: str, *args: str, **fields) -> dict:
    return submit_command(client, queue, [sys.executable, "-c", code, *args], **fields)


def test_a_team_runs_a_job_and_another_team_cannot_touch_it(server, tmp_path):
    with server.client("a-secret") as a, server.client("b-secret") as b:
        job = submit(a, "a", "print('hello')", gpus=1)
        done = wait_for(a, job["id"], {"completed", "failed"})
        assert done["state"] == "completed" and done["exit_code"] == 0
        assert b.get(f"/v1/jobs/{job['id']}").status_code == 403
        assert b.delete(f"/v1/jobs/{job['id']}").status_code == 403
        assert b.post("/v1/jobs", json={"queue": "a", "command": ["true"]}).status_code == 403
        logs = a.get(f"/v1/jobs/{job['id']}/logs").json()
        assert logs["text"].strip() == "hello"
    assert "a-secret" not in server.log()
    decisions = [
        line for line in server.log().splitlines() if "preemptible.queue.decisions" in line
    ]
    assert any(
        f"admitted {job['id']} (a): admitted: within a's nominal quota" in line
        for line in decisions
    ), decisions
    assert any(
        f"submitted {job['id']} (a): submitted [asked by queue:a]" in line for line in decisions
    ), decisions


def test_json_logs_are_one_object_a_line_with_each_decision(tmp_path):
    server = Server(tmp_path, CONFIG, TOKENS, args=["--log-format", "json"])
    server.start()
    try:
        with server.client("a-secret") as a:
            job = submit(a, "a", "import sys; sys.exit(3)", gpus=1, max_restarts=0)
            wait_for(a, job["id"], {"failed"})
    finally:
        server.stop()
    lines = [json.loads(line) for line in server.log().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    decided = [line["decision"] for line in lines if "decision" in line]
    assert [d["kind"] for d in decided if d["job"] == job["id"]] == [
        "submitted",
        "admitted",
        "failed",
    ], decided
    failed = decided[-1]
    assert failed["reason"] == "exited with 3" and failed["data"]["exit_code"] == 3
    assert decided[0]["by"] == "queue:a" and failed["by"] is None
    assert "a-secret" not in server.log() and "admin-secret" not in server.log()


def test_a_bad_log_format_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "queue.toml").write_text(CONFIG)
    args = ["--config", str(tmp_path / "queue.toml"), "--state", str(tmp_path / "state")]
    done = subprocess.run(
        [*CLI, "queue", "serve", *args, "--log-format", "xml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--log-format must be plain or json, got 'xml'" in done.stderr


def test_a_borrower_is_preempted_for_the_lending_queue_and_comes_back(server, tmp_path):
    with server.client("a-secret") as a, server.client("b-secret") as b:
        low = submit(b, "b", SAVER, "4", gpus=2, tier="low", cwd=str(tmp_path))
        ready(b, low["id"])
        high = submit(a, "a", "print('mine')", gpus=1, tier="high")
        assert wait_for(a, high["id"], {"completed"})["state"] == "completed"
        assert (tmp_path / "saved").exists()
        back = wait_for(b, low["id"], {"completed"}, timeout=60)
        assert back["attempts"] == 2
        why = b.get(f"/v1/jobs/{low['id']}/why").json()
        kinds = [e["kind"] for e in why["history"]]
        assert "notice" in kinds and "requeued" in kinds
        stats = b.get("/v1/stats").json()
        assert stats["queues"]["b"]["preemptions"] == 1
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "preemptible_" in metrics


def test_a_killed_server_loses_no_job_and_adopts_the_running_one(server, tmp_path):
    with server.client("admin-secret") as admin:
        running = submit(admin, "a", SAVER, "10", gpus=1, cwd=str(tmp_path))
        ready(admin, running["id"])
        queued = submit(admin, "b", "print('later')", gpus=2)
    server.kill()  # SIGKILL: no shutdown at all
    server.start()
    with server.client("admin-secret") as admin:
        ids = {j["id"] for j in admin.get("/v1/jobs").json()}
        assert {running["id"], queued["id"]} <= ids
        assert wait_for(admin, running["id"], {"completed"})["attempts"] == 1  # adopted
        assert wait_for(admin, queued["id"], {"completed"})["state"] == "completed"
        kinds = [e["kind"] for e in admin.get("/v1/events").json()]
        assert "recovered" in kinds


@pytest.mark.parametrize("problem", ["port in use", "state under a file", "quotas too large"])
def test_a_server_that_cannot_start_says_why_in_one_line_and_exits_2(tmp_path, problem):
    config = tmp_path / "queue.toml"
    text = CONFIG
    if problem == "quotas too large":
        text = CONFIG.replace(
            'name = "b"\nnominal = { gpus = 1 }', 'name = "b"\nnominal = { gpus = 2 }'
        )
    config.write_text(text)
    state = tmp_path / "state"
    if problem == "state under a file":
        (tmp_path / "a-file").write_text("")
        state = tmp_path / "a-file" / "state"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1] if problem == "port in use" else free_port()
        args = ["--config", str(config), "--state", str(state), "--port", str(port)]
        done = subprocess.run(
            [*CLI, "queue", "serve", *args, "--allow-jobs-as-root"],
            env={**os.environ, **TOKENS},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    expected = {
        "port in use": f"port {port} on 127.0.0.1 is in use",
        "state under a file": "cannot create the state directory",
        "quotas too large": "nominal quotas add up to 3 GPUs but the cluster has 2",
    }[problem]
    assert expected in lines[0]
    assert not (tmp_path / "state").exists()  # nothing was created


def test_a_second_server_on_the_same_state_folder_exits_2_naming_the_first(server, tmp_path):
    args = ["--config", str(tmp_path / "queue.toml"), "--state", str(tmp_path / "state")]
    done = subprocess.run(
        [*CLI, "queue", "serve", *args, "--port", str(free_port()), "--allow-jobs-as-root"],
        env={**os.environ, **TOKENS},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"is in use by process {server.proc.pid}" in done.stderr, done.stderr
    with server.client("admin-secret") as admin:  # the first one never noticed
        assert admin.get("/v1/jobs").status_code == 200


def test_with_a_relative_state_folder_a_finished_job_is_not_run_again(tmp_path):
    # The runner writes the job's status in the state folder while it runs in the job's own
    # cwd: with a relative path the status would land elsewhere, and a job that ends while the
    # server is down would be taken for lost and run again.
    (tmp_path / "queue.toml").write_text(CONFIG)
    work = tmp_path / "elsewhere"
    work.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--config", "queue.toml", "--state", "state", "--port", str(port)]

    def serve() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [*CLI, "queue", "serve", *args, "--allow-jobs-as-root"],
            cwd=tmp_path,
            env={**os.environ, **TOKENS},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: _answers(url), "the server to answer", timeout=30)
        return proc

    admin = httpx.Client(base_url=url, headers={"Authorization": "Bearer admin-secret"})
    code = (
        "import pathlib, time\n"
        "print('ready', flush=True)\n"
        "while not pathlib.Path('go').exists(): time.sleep(0.05)\n"
        "pathlib.Path('ran').open('a').write('x')\n"
    )
    proc = serve()
    try:
        job = submit(admin, "a", code, cwd=str(work))
        ready(admin, job["id"])
        proc.kill()  # SIGKILL: the job goes on, and ends while no server watches
        proc.wait(15)
        (work / "go").touch()
        wait_until(lambda: (work / "ran").exists(), "the job to run to its end", timeout=30)
        status = tmp_path / "state" / "jobs" / job["id"] / "attempt-1.status"
        wait_until(status.exists, "its runner to record the exit where the manager looks")
        proc = serve()
        again = wait_for(admin, job["id"], {"completed", "failed", "pending", "running"})
        assert (again["state"], again["attempts"]) == ("completed", 1), again
    finally:
        admin.close()
        proc.terminate()
        proc.wait(15)
    assert (work / "ran").read_text() == "x"  # once, not twice


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
