"""Jobs that negotiate, end to end: a real server, real training jobs under `@preemptible`.

Two teams share four virtual GPUs; "interns" may borrow "research"'s two. The jobs are
`scripts/queue_train.py`: they report their measured cost, watch for the manager's notice, save
at the next step boundary, ack, exit, and resume exactly. Every promise of the conversation is
checked against what the processes really did (the steps each attempt ran, the final weights).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.polling import wait_until

from .queue_server import Server, events, ready, submit, wait_event, wait_for

SCRIPT = Path(__file__).parent / "scripts" / "queue_train.py"
TOKENS = {"T_ADMIN": "admin-secret", "T_RESEARCH": "research-secret", "T_INTERNS": "intern-secret"}


def config(grace_min: str = "10s", grace_margin: str = "1s") -> str:
    return f"""
[cluster]
gpus = 4

[preemption]
grace_safety = 1.5
grace_margin = "{grace_margin}"
grace_min = "{grace_min}"
grace_max = "20s"
min_runtime = "0s"
min_runtime_multiple = 2
cooldown = "0s"

[service]
admin_token = "env:T_ADMIN"

[[queues]]
name = "research"
nominal = {{ gpus = 2 }}
token = "env:T_RESEARCH"

[[queues]]
name = "interns"
nominal = {{ gpus = 2 }}
borrowing_limit = {{ gpus = 2 }}
token = "env:T_INTERNS"
"""


@pytest.fixture
def serve(tmp_path):
    servers: list[Server] = []

    def start(text: str) -> Server:
        server = Server(tmp_path, text, TOKENS)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        with server.client("admin-secret") as admin:
            for job in admin.get("/v1/jobs").json():
                if job["state"] in ("pending", "running", "preempting"):
                    admin.delete(f"/v1/jobs/{job['id']}")
        server.stop()


def train_command(ckpt: Path, out: Path, *options: str) -> list[str]:
    return [sys.executable, str(SCRIPT), str(ckpt), str(out), *options]


def reference(tmp_path: Path, *options: str) -> dict[str, torch.Tensor]:
    """The same training, uninterrupted and without a manager."""
    out = tmp_path / "reference.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREEMPTIBLE_")}
    subprocess.run(train_command(tmp_path / "ref-ckpt", out, *options), env=env, check=True)
    return dict(torch.load(out, weights_only=True))


def steps_by_attempt(out: Path) -> dict[str, list[int]]:
    runs: dict[str, list[int]] = {}
    for line in Path(f"{out}.steps").read_text().split("\n"):
        if line:
            attempt, step = line.split()
            runs.setdefault(attempt, []).append(int(step))
    return runs


def test_a_borrower_is_told_saves_acks_hands_on_and_resumes_bitwise(serve, tmp_path):
    options = ("--total", "40", "--step-s", "0.05", "--every", "10")
    expected = reference(tmp_path, *options)
    server = serve(config())
    out = tmp_path / "borrower.pt"
    with server.client("intern-secret") as interns, server.client("research-secret") as research:
        cmd = train_command(tmp_path / "ckpt", out, *options)
        low = submit(interns, "interns", cmd, gpus=4, tier="low", cwd=str(tmp_path))
        negotiated = wait_event(interns, low["id"], "negotiated")  # after its first save
        high = submit(research, "research", ["sleep", "1"], gpus=2, tier="high")
        done = wait_for(interns, low["id"], {"completed", "failed"}, timeout=90)
        preemptor = research.get(f"/v1/jobs/{high['id']}").json()
        story = interns.get(f"/v1/jobs/{low['id']}/why").json()["history"][::-1]
        stats = interns.get("/v1/stats").json()

    assert done["state"] == "completed" and done["attempts"] == 2
    notice = next(e for e in story if e["kind"] == "notice")
    ack = next(e for e in story if e["kind"] == "checkpointed")
    requeued = next(e for e in story if e["kind"] == "requeued")
    grace = notice["data"]["grace_s"]
    assert grace == negotiated["data"]["grace_s"] == 10.0  # the negotiated grace, sent
    assert high["id"] in notice["reason"]  # told for whom
    assert ack["reason"] == "saved after the notice: exiting"
    assert requeued["data"]["acked"] and not requeued["data"]["killed"]
    handed_on = preemptor["started_at"] - notice["at"]
    assert handed_on < grace / 2, f"the preemptor started {handed_on:.2f} s after the notice"
    kinds = [e["kind"] for e in story]
    for kind in ("submitted", "admitted", "negotiated", "notice", "checkpointed", "requeued"):
        assert kind in kinds, kinds
    assert kinds[-1] == "completed" and kinds.count("admitted") == 2

    runs = steps_by_attempt(out)
    first, second = runs["1"], runs["2"]
    assert second[0] == first[-1] + 1 == ack["data"]["step"] + 1  # resumed from the saved step
    assert first + second == list(range(40))  # nothing redone, nothing skipped
    final = torch.load(out, weights_only=True)
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected)  # bitwise

    lost = stats["queues"]["interns"]["lost_gpu_s"]
    redone_steps = len(first) + len(second) - 40
    assert redone_steps == 0
    # What it lost is the step in flight and the save, from the notice to the ack's checkpoint;
    # its exit after the ack (the interpreter's teardown) wastes no work.
    assert 0 < lost <= 4 * 1.0 and lost == pytest.approx(requeued["data"]["lost_gpu_s"], abs=1e-3)


# Claims 0.5 s per save, then ignores SIGTERM: it is killed at the deadline.
STUBBORN = """
import os, signal, time, httpx
signal.signal(signal.SIGTERM, signal.SIG_IGN)
url, job = os.environ["PREEMPTIBLE_QUEUE_URL"], os.environ["PREEMPTIBLE_JOB_ID"]
auth = {"Authorization": "Bearer " + os.environ["PREEMPTIBLE_TOKEN"]}
httpx.post(f"{url}/v1/jobs/{job}/cost", json={"save_seconds_p95": 0.5}, headers=auth)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_job_that_ignores_its_notice_is_killed_and_its_next_grace_is_what_it_took(
    serve, tmp_path
):
    server = serve(config(grace_min="2s"))
    with server.client("admin-secret") as admin:
        stubborn = submit(admin, "interns", [sys.executable, "-c", STUBBORN], gpus=4, tier="low")
        ready(admin, stubborn["id"])
        wait_event(admin, stubborn["id"], "negotiated")
        claimed_grace = admin.get(f"/v1/jobs/{stubborn['id']}").json()["grace_s"]
        submit(admin, "research", ["sleep", "60"], gpus=2, tier="high")
        requeued = wait_event(admin, stubborn["id"], "requeued", timeout=60)
        after = admin.get(f"/v1/jobs/{stubborn['id']}").json()

    assert claimed_grace == 2.0  # clamp(1.5 * 0.5 + 1, 2, 20)
    assert requeued["data"]["killed"] and not requeued["data"]["acked"]
    took = requeued["data"]["took_s"]
    assert claimed_grace <= took < claimed_grace + 2.0  # killed at the deadline
    assert after["state"] == "pending"
    assert after["cost"]["observed_exit_seconds"] == pytest.approx(took, abs=0.001)
    assert after["grace_s"] == pytest.approx(1.5 * took + 1.0, abs=0.01)  # what it took, now


def test_a_job_killed_mid_save_restarts_from_its_last_committed_checkpoint(serve, tmp_path):
    options = ("--total", "30", "--step-s", "0.02", "--every", "5")
    expected = reference(tmp_path, *options)
    server = serve(config())
    out, marker = tmp_path / "crashed.pt", tmp_path / "slow-save"
    slow = ("--save-s", "0,0,30", "--slow-marker", str(marker))  # the third save hangs
    with server.client("admin-secret") as admin:
        cmd = train_command(tmp_path / "ckpt", out, *options, *slow)
        # max_restarts=0: this test resubmits by hand (test_queue_restarts restarts by itself)
        crashed = submit(admin, "research", cmd, gpus=1, cwd=str(tmp_path), max_restarts=0)
        wait_until(
            marker.exists,
            "the slow save to start",
            timeout=60,
            describe=lambda: admin.get(f"/v1/jobs/{crashed['id']}/logs").json()["text"],
        )
        time.sleep(0.2)  # well inside the save
        os.kill(
            int(marker.read_text()), signal.SIGKILL
        )  # a real crash, in the middle of the save of step 14
        failed = wait_for(admin, crashed["id"], {"failed", "completed"})
        again = submit(admin, "research", train_command(tmp_path / "ckpt", out, *options))
        done = wait_for(admin, again["id"], {"completed", "failed"}, timeout=60)

    assert failed["state"] == "failed" and failed["attempts"] == 1
    assert done["state"] == "completed"
    steps = [int(line.split()[1]) for line in Path(f"{out}.steps").read_text().splitlines()]
    assert steps[:15] == list(range(15)) and steps[15:] == list(range(10, 30))  # from step 9's
    final = torch.load(out, weights_only=True)
    assert all(torch.equal(final[k], expected[k]) for k in expected)


def test_grace_and_minimum_runtime_follow_the_measured_saves(serve, tmp_path):
    server = serve(config(grace_min="2s"))
    fast, slow = "0.02", "3"
    schedules = {  # (saves, their durations): p95 is over the last 100 saves, nearest rank
        "slow-then-fast": (40, [slow, fast]),  # falls once 20 fast saves outweigh the slow one
        "fast-then-slow": (15, [fast] * 10 + [slow, fast]),  # one slow save in 15 lifts it
    }
    ids = {}
    with server.client("admin-secret") as admin:
        for name, (total, schedule) in schedules.items():
            out = tmp_path / f"{name}.pt"
            cmd = train_command(tmp_path / name, out, "--total", str(total), "--step-s", "0.05")
            cmd += ["--every", "1", "--save-s", ",".join(schedule), "--linger-s", "3"]
            ids[name] = submit(admin, "research", cmd, gpus=1, cwd=str(tmp_path))["id"]
        for job_id in ids.values():
            assert wait_for(admin, job_id, {"completed", "failed"}, 90)["state"] == "completed"
        terms = {
            name: [
                (e["data"]["grace_s"], e["data"]["min_runtime_s"])
                for e in events(admin, job_id)
                if e["kind"] == "negotiated"
            ]
            for name, job_id in ids.items()
        }

    for name, seen in terms.items():
        assert all(2.0 <= g <= 20.0 for g, _ in seen), (name, seen)  # within the bounds
    (g_slow, m_slow), (g_fast, m_fast) = terms["slow-then-fast"][0], terms["slow-then-fast"][-1]
    assert g_slow == pytest.approx(1.5 * 3 + 1, abs=0.75) and m_slow >= 6.0
    assert g_fast == 2.0 and m_fast < 1.0
    (g_first, m_first), (g_last, m_last) = terms["fast-then-slow"][0], terms["fast-then-slow"][-1]
    assert g_first == 2.0 and m_first < 1.0
    assert g_last == pytest.approx(1.5 * 3 + 1, abs=0.75) and m_last >= 6.0
