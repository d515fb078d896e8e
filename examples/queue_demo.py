"""The queue manager in a minute: a borrower reclaimed by a shrink, grown back, bit-exact.

1. A queue manager starts on a SQLite store in a temporary directory, with
   examples/queue_demo.toml: teams A and B, two of four virtual GPUs each.
2. Team B's fine-tune (low tier, elastic: 4 GPUs, at least 2) trains under `@preemptible`
   (examples/queue_demo_job.py) on all four, two of them borrowed from idle team A,
   checkpointing every 10 steps.
3. Team A's pre-training job (high tier, 2 GPUs) arrives: the manager reclaims the two GPUs it
   lent. Shrinking B's job to 2 loses less than evicting it (the reason gives both costs), so
   B's job gets a resize notice and SIGTERM, saves at its next step boundary and restarts at
   once on its own two GPUs, from the step it saved; A's job starts on the two freed, long
   before B's grace would have run out.
4. A's job ends; B's grows back to 4 GPUs, because the remaining run pays for the restart. It
   ends with the same parameters, bit for bit, as an uninterrupted run of the same script.
5. The four signals per queue, and where to read the events.

Promises checked (exit status 1 if one is broken): the preemptor started before the borrower's
grace ran out; the borrower was shrunk, not evicted, and grew back; each of its attempts resumed
from the step it saved; its final parameters equal the uninterrupted run's; every job completed;
nothing is left running. Every process the demo started is stopped at the end, on Ctrl-C too,
and the temporary directory removed.

    python examples/queue_demo.py [--hold]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
from rich.console import Console
from rich.markup import escape

from preemptible import Checkpointer
from preemptible.cli.queue import signals_table

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "queue_demo.toml"
JOB_SCRIPT = HERE / "queue_demo_job.py"
TOKEN_VARIABLES = {
    "admin": "DEMO_ADMIN_TOKEN",
    "team-a": "DEMO_TEAM_A_TOKEN",
    "team-b": "DEMO_TEAM_B_TOKEN",
}
STEP_SECONDS = 0.2
"""Each training step sleeps this long, standing in for GPU time (it changes no number)."""
BORROWER_STEPS = 120
PREEMPTOR_STEPS = 40
RECLAIM_AT_STEP = 39
"""Team A's job arrives once B's job has committed a checkpoint of this step."""
ACTIVE_STATES = ("pending", "running", "preempting")
TEAM_STYLE = {"team-a": "cyan", "team-b": "magenta"}
console = Console(highlight=False, soft_wrap=True)  # long reasons wrap in the terminal


class PromiseBroken(Exception):
    """A promise of the demo does not hold: the demo stops and exits 1."""

    def __init__(self, promise: str, detail: str):
        super().__init__(f"{promise}: {detail}")
        self.promise = promise
        self.detail = detail


class Interrupted(Exception):
    """SIGTERM or SIGHUP: cleaned up like Ctrl-C."""


@dataclass(frozen=True, slots=True)
class Promise:
    name: str
    kept: bool
    detail: str


@dataclass(slots=True)
class DemoJob:
    """One job the demo submitted, and what the timeline has seen of it."""

    id: str
    label: str
    team: str
    checkpoint_dir: Path
    attempts: int = 0
    state: str = "pending"
    terms_shown: tuple[float, float] | None = None
    log_offsets: dict[int, int] = field(default_factory=dict)
    """attempt -> where its log is read next."""
    log_partial: dict[int, str] = field(default_factory=dict)
    """attempt -> the start of a line not finished yet."""
    log_lines: dict[int, list[str]] = field(default_factory=dict)


@dataclass(slots=True)
class Notice:
    at: float
    grace_s: float


# --- the server -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`preemptible queue serve` on a state directory under the demo's temporary directory.

    It runs in a session of its own, so that Ctrl-C reaches the demo alone, which then stops
    the jobs through the API before it stops the server.
    """

    def __init__(self, tmp: Path, tokens: dict[str, str]):
        self.tmp = tmp
        self.state_dir = tmp / "state"
        self.log_path = tmp / "server.log"
        self.tokens = tokens
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> None:
        for _ in range(3):  # another program may take the free port before the server does
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREEMPTIBLE_")}
            env.update({TOKEN_VARIABLES[who]: token for who, token in self.tokens.items()})
            env["PYTHONUNBUFFERED"] = "1"  # jobs inherit it: their lines reach the log at once
            command = [sys.executable, "-m", "preemptible", "queue", "serve"]
            command += ["--config", str(CONFIG), "--state", str(self.state_dir)]
            command += ["--port", str(port)]
            if os.geteuid() == 0:  # the demo's jobs are its own: no team shares this machine
                command.append("--allow-jobs-as-root")
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._wait_healthy():
                return
            if "is in use" not in self.log_path.read_text():
                break
        raise PromiseBroken("the queue manager starts", self.log_tail())

    def _wait_healthy(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        return False

    def client(self, who: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


# --- the timeline ---------------------------------------------------------------------------------


def seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 100 else f"{value:.0f} s"


class Timeline:
    """Follows the events (`GET /v1/events?since=N`), the jobs and their logs, and prints them."""

    def __init__(self, server: Server, t0: float):
        self.server = server
        self.admin = server.client("admin")
        self.t0 = t0
        self.since = 0
        self.jobs: dict[str, DemoJob] = {}
        self.notices: dict[str, Notice] = {}
        self.on_event: list[Callable[[dict[str, Any]], None]] = []

    def say(self, who: str, text: str, *, style: str = "", at: float | None = None) -> None:
        elapsed = (time.time() if at is None else at) - self.t0
        job = self.jobs.get(who)
        name = f"{who} {job.label}" if job else who
        color = TEAM_STYLE.get(job.team, "") if job else "bold"
        console.print(
            f"[dim]{elapsed:5.1f} s[/]  [{color or 'default'}]{escape(f'{name:<12}')}[/] "
            f"[{style or 'default'}]{escape(text)}[/]"  # reasons and job output are not markup
        )

    def track(self, job: DemoJob) -> None:
        self.jobs[job.id] = job

    def pump(self) -> None:
        """One look at the events, the jobs and their logs; prints what is new."""
        found = self.admin.get("/v1/events", params={"since": self.since}).raise_for_status()
        for event in found.json():
            self.since = max(self.since, event["id"])
            self._print_event(event)
            for hook in self.on_event:
                hook(event)
        for view in self.admin.get("/v1/jobs").raise_for_status().json():
            job = self.jobs.get(view["id"])
            if job is not None:
                self._job_changed(job, view)
        for job in self.jobs.values():
            for attempt in range(1, job.attempts + 1):
                self._follow_log(job, attempt)

    def wait(self, promise: str, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Pump until `ready()`; past `timeout_s` the promise is broken."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.pump()
            if ready():
                return
            if time.monotonic() > deadline:
                raise PromiseBroken(promise, f"{what} did not happen within {timeout_s:.0f} s")
            time.sleep(0.2)

    def _job_changed(self, job: DemoJob, view: dict[str, Any]) -> None:
        job.attempts, job.state = view["attempts"], view["state"]
        if job.terms_shown is None and view["cost"].get("save_seconds_p95") is not None:
            # A manager that logs no "negotiated" event: the job's view has the same terms.
            job.terms_shown = (view["grace_s"], view["min_runtime_s"])
            line = terms_line(view["cost"], view["grace_s"], view["min_runtime_s"])
            self.say(job.id, line, style="yellow")

    def _follow_log(self, job: DemoJob, attempt: int) -> None:
        chunk = self.admin.get(
            f"/v1/jobs/{job.id}/logs",
            params={"attempt": attempt, "offset": job.log_offsets.get(attempt, 0)},
        )
        if chunk.status_code == 404:  # the attempt has not started yet
            return
        data = chunk.raise_for_status().json()
        job.log_offsets[attempt] = data["next_offset"]
        *lines, job.log_partial[attempt] = (job.log_partial.get(attempt, "") + data["text"]).split(
            "\n"
        )
        job.log_lines.setdefault(attempt, []).extend(lines)
        for line in lines:
            if line.strip():
                self.say(job.id, f"│ {line}", style="dim")

    def log_of(self, job: DemoJob, attempt: int) -> str:
        """The complete lines of one attempt's output seen so far."""
        return "\n".join(job.log_lines.get(attempt, []))

    def _print_event(self, event: dict[str, Any]) -> None:
        job_id, kind, data = event["job_id"], event["kind"], event["data"] or {}
        if kind == "notice":
            self.notices[job_id] = Notice(at=event["at"], grace_s=float(data["grace_s"]))
        job = self.jobs.get(job_id)
        if kind == "negotiated" and job is not None:
            terms = (float(data["grace_s"]), float(data["min_runtime_s"]))
            if job.terms_shown is not None:
                moved = max(abs(a - b) for a, b in zip(terms, job.terms_shown, strict=True))
                if moved < 1.0:
                    return  # its save p95 moved a little: not worth a line
            job.terms_shown = terms
            if data.get("observed_exit_s") is not None:
                took = float(data["observed_exit_s"])
                line = f"terms revised: it took {seconds(took)} to exit when told; "
                line += f"grace {seconds(terms[0])}, min runtime {seconds(terms[1])}"
            else:
                cost = self.admin.get(f"/v1/jobs/{job_id}").raise_for_status().json()["cost"]
                line = terms_line(cost, *terms)
            self.say(job_id, line, style="yellow", at=event["at"])
            return
        text, style = describe(event)
        self.say(job_id or "manager", text, style=style, at=event["at"])


def terms_line(cost: dict[str, Any], grace_s: float, min_runtime_s: float) -> str:
    """A cost report and the terms the manager answered with."""
    names = {"save_seconds_p95": "save p95", "restore_seconds": "restore"}
    measured = [f"{name} {cost[key]:.2f} s" for key, name in names.items() if key in cost]
    return (
        f"reported its cost ({', '.join(measured)}); negotiated: grace "
        f"{seconds(grace_s)}, min runtime {seconds(min_runtime_s)}"
    )


def describe(event: dict[str, Any]) -> tuple[str, str]:
    """One event as words, and the style to print them in."""
    kind, reason, data = event["kind"], event["reason"], event["data"] or {}
    if kind == "submitted":
        return f"submitted to {event['queue']} ({data.get('gpus', '?')} GPUs)", ""
    if kind == "admitted":
        gpus = ",".join(str(g) for g in data.get("gpus", []))
        return f"admitted on GPUs {gpus}: {reason.removeprefix('admitted: ')}", "green"
    if kind == "negotiated":
        save = data.get("save_s")
        return (
            f"negotiated: grace {seconds(float(data['grace_s']))}, min runtime "
            f"{seconds(float(data['min_runtime_s']))}"
            + (f" (save {float(save):.2f} s)" if save is not None else ""),
            "yellow",
        )
    if kind == "notice":
        grace = seconds(float(data["grace_s"]))
        if data.get("resize"):
            why = reason.partition(": ")[2]
            return (
                f"resize notice ({data['from']} -> {data['to']} GPUs) and SIGTERM, grace "
                f"{grace}: {why}",
                "bold yellow",
            )
        why = reason.removeprefix("preempted: ")
        return f"notice and SIGTERM, grace {grace}: {why}", "bold red"
    if kind == "checkpointed":
        step = data.get("step")
        if reason.startswith("saved after the notice"):
            return f"says it has saved step {step} and is exiting (ack)", "bold yellow"
        return f"checkpoint of step {step} committed", "dim"
    if kind == "requeued":
        return (
            f"exited {seconds(float(data.get('took_s', 0)))} after its notice "
            f"({float(data.get('lost_gpu_s', 0)):.1f} GPU-s lost"
            + (", killed at the deadline" if data.get("killed") else "")
            + "); back in the queue",
            "red",
        )
    if kind == "resized":
        return (
            f"exited {seconds(float(data.get('took_s', 0)))} after its notice "
            f"({float(data.get('lost_gpu_s', 0)):.1f} GPU-s lost); restarted at once on GPUs "
            f"{','.join(str(g) for g in data.get('gpus', []))}",
            "yellow",
        )
    if kind == "completed":
        return f"completed ({reason})", "bold green"
    return f"{kind}: {reason}", ""


# --- the scenario ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Scenario:
    """What the scenario observed, for the promises."""

    borrower: DemoJob
    preemptor: DemoJob
    saved_steps: list[int | None] = field(default_factory=list)
    """The newest committed checkpoint on disk each time the borrower's attempt had ended."""
    resizes: list[tuple[int, int]] = field(default_factory=list)
    """The borrower's resizes: (GPUs before, GPUs after)."""
    evicted: bool = False
    acked_steps: list[int | None] = field(default_factory=list)
    """The steps the borrower said it had saved after its notices (SDKs that say so)."""
    handed_on: bool = False
    reclaim_notice: Notice | None = None
    """The borrower's notice that handed its borrowed GPUs on."""


def job_command(checkpoint_dir: Path, steps: int, step_seconds: float, gpus: str) -> list[str]:
    """The job's command line; `gpus` is "{gpus}" under the manager: each attempt's size."""
    return [
        sys.executable,
        str(JOB_SCRIPT),
        "--dir",
        str(checkpoint_dir),
        "--steps",
        str(steps),
        "--step-seconds",
        str(step_seconds),
        "--gpus",
        gpus,
    ]


def submit(server: Server, tmp: Path, *, team: str, label: str, steps: int, **fields) -> DemoJob:
    checkpoint_dir = tmp / f"{label}-checkpoints"
    body = {
        "queue": team,
        "name": label,
        "command": job_command(checkpoint_dir, steps, STEP_SECONDS, "{gpus}"),
        "cwd": str(tmp),
        **fields,
    }
    with server.client(team) as client:  # each team submits with its own token
        answer = client.post("/v1/jobs", json=body)
    if answer.status_code != 201:
        raise PromiseBroken("every job completed", f"submitting {label} failed: {answer.text}")
    return DemoJob(id=answer.json()["id"], label=label, team=team, checkpoint_dir=checkpoint_dir)


def latest_step(root: Path) -> int | None:
    if not root.exists():
        return None
    info = Checkpointer(root).latest()
    return None if info is None else info.step


def play(server: Server, timeline: Timeline, tmp: Path) -> Scenario:
    """Phases 2 to 4: the borrower, the reclaim by a shrink, the hand-on, the grow."""
    # 2. Team B's elastic fine-tune borrows team A's idle GPUs.
    borrower = submit(
        server,
        tmp,
        team="team-b",
        label="finetune",
        steps=BORROWER_STEPS,
        gpus=4,
        min_gpus=2,
        tier="low",
    )
    timeline.track(borrower)
    timeline.wait(
        "every job completed",
        lambda: (latest_step(borrower.checkpoint_dir) or -1) >= RECLAIM_AT_STEP,
        60,
        f"{borrower.id} committing a checkpoint of step {RECLAIM_AT_STEP}",
    )
    # 3. Team A's job arrives: the manager reclaims the two GPUs it lent, by a shrink.
    preemptor = submit(
        server, tmp, team="team-a", label="pretrain", steps=PREEMPTOR_STEPS, gpus=2, tier="high"
    )
    timeline.track(preemptor)
    seen = Scenario(borrower=borrower, preemptor=preemptor)
    timeline.on_event.append(lambda event: on_event(timeline, seen, event))
    timeline.wait(
        "the preemptor started before the borrower's grace ran out",
        lambda: preemptor.attempts >= 1 and seen.handed_on,
        60,
        f"{preemptor.id} starting after {borrower.id}'s notice",
    )
    # 4. A's job ends: B's grows back to four GPUs, resuming from its checkpoint each time.
    timeline.wait(
        "every job completed",
        lambda: borrower.state == "completed" and preemptor.state == "completed",
        90,
        "both jobs completing",
    )
    timeline.pump()  # the last lines of the logs
    return seen


def on_event(timeline: Timeline, seen: Scenario, event: dict[str, Any]) -> None:
    """Lines the events imply: the checkpoint on disk, the hand-on of the GPUs."""
    borrower, preemptor = seen.borrower, seen.preemptor
    acked = event["reason"].startswith("saved after the notice")
    if event["kind"] == "checkpointed" and event["job_id"] == borrower.id and acked:
        seen.acked_steps.append(event["data"].get("step"))
    if event["kind"] in ("requeued", "resized") and event["job_id"] == borrower.id:
        seen.evicted = seen.evicted or event["kind"] == "requeued"
        if event["kind"] == "resized":
            seen.resizes.append((event["data"]["from"], event["data"]["to"]))
        saved = latest_step(borrower.checkpoint_dir)
        seen.saved_steps.append(saved)
        report = Checkpointer(borrower.checkpoint_dir).verify(saved)
        timeline.say(
            borrower.id,
            f"its newest committed checkpoint on disk: step {saved} "
            f"({'verified' if report.ok else report.problems})",
            style="yellow",
            at=event["at"],
        )
    notice = timeline.notices.get(borrower.id)
    if event["kind"] == "admitted" and event["job_id"] == preemptor.id and notice is not None:
        seen.handed_on = True
        seen.reclaim_notice = notice
        after = event["at"] - notice.at
        left = notice.at + notice.grace_s - event["at"]
        timeline.say(
            "manager",
            f"GPUs handed on: {preemptor.id} started {seconds(after)} after "
            f"{borrower.id}'s notice, {seconds(left)} before its grace would have run out",
            style="bold green",
            at=event["at"],
        )


# --- the promises ---------------------------------------------------------------------------------


def check_hand_on(timeline: Timeline, seen: Scenario) -> Promise:
    name = "the preemptor started before the borrower's grace ran out"
    notice = seen.reclaim_notice
    view = timeline.admin.get(f"/v1/jobs/{seen.preemptor.id}").raise_for_status().json()
    if notice is None or view["started_at"] is None:
        return Promise(name, False, "no notice or no start was recorded")
    ends = notice.at + notice.grace_s
    margin = ends - view["started_at"]
    detail = f"started {seconds(view['started_at'] - notice.at)} after the notice, grace "
    detail += f"{seconds(notice.grace_s)}"
    return Promise(name, margin > 0, detail)


def check_elastic(seen: Scenario) -> Promise:
    name = "the borrower was shrunk, not evicted, and grew back"
    sizes = " then ".join(f"{a} -> {b} GPUs" for a, b in seen.resizes) or "no resize"
    ok = not seen.evicted and seen.resizes == [(4, 2), (2, 4)]
    return Promise(name, ok, sizes + (", and it was evicted" if seen.evicted else ""))


RESUMED = re.compile(
    r"attempt (\d+): starting at step (\d+) on (\d+) GPUs \(resumed from step (\d+)\)"
)


def check_resume(timeline: Timeline, seen: Scenario) -> Promise:
    name = "each attempt of the borrower resumed from the step it saved"
    job = seen.borrower
    if job.attempts < 2 or len(seen.saved_steps) != job.attempts - 1:
        return Promise(name, False, f"saved steps {seen.saved_steps}, attempts {job.attempts}")
    resumed_from = []
    for attempt, saved in enumerate(seen.saved_steps, start=2):
        found = RESUMED.search(timeline.log_of(job, attempt))
        if found is None or saved is None:
            return Promise(name, False, f"attempt {attempt} did not resume (saved step {saved})")
        start, resumed = int(found.group(2)), int(found.group(4))
        if not 0 < resumed == saved or start != resumed + 1:
            return Promise(name, False, f"attempt {attempt} resumed from {resumed}, saved {saved}")
        resumed_from.append(f"attempt {attempt} from step {resumed} on {found.group(3)} GPUs")
    detail = ", ".join(resumed_from)
    acked = [step for step in seen.acked_steps if step is not None]
    if acked:
        detail += f" (its acks said steps {', '.join(map(str, acked))})"
        if acked != seen.saved_steps:
            return Promise(name, False, detail)
    return Promise(name, True, detail)


def tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for key in sorted(tree, key=str):
            yield from tensors(tree[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, list | tuple):
        for i, item in enumerate(tree):
            yield from tensors(item, f"{prefix}[{i}]")


def check_bitwise(seen: Scenario, reference_dir: Path) -> Promise:
    """The final checkpoints of both runs, read with the SDK (verified, no pickle), compared."""
    name = "the final parameters equal the uninterrupted run's, bit for bit"
    finals = []
    for root in (seen.borrower.checkpoint_dir, reference_dir):
        step = latest_step(root)
        if step != BORROWER_STEPS - 1:
            return Promise(name, False, f"{root.name} ends at step {step}")
        data = Checkpointer(root).load(step)
        finals.append(dict(tensors({"model": data["model"], "optim": data["optim"]})))
    ours, theirs = finals
    if ours.keys() != theirs.keys():
        return Promise(name, False, f"different tensors: {sorted(ours.keys() ^ theirs.keys())}")
    differ = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    params = sum(t.numel() for k, t in ours.items() if k.startswith("model."))
    if differ:
        return Promise(name, False, f"{len(differ)} of {len(ours)} tensors differ: {differ[:3]}")
    return Promise(
        name, True, f"{len(ours)} tensors equal ({params:,} parameters and Adam's state)"
    )


def check_completed(timeline: Timeline, reference: subprocess.Popen[bytes]) -> Promise:
    name = "every job completed"
    views = timeline.admin.get("/v1/jobs").raise_for_status().json()
    states = {v["id"]: v["state"] for v in views}
    ok = all(s == "completed" for s in states.values()) and reference.returncode == 0
    words = ", ".join(f"{k} {s}" for k, s in states.items())
    return Promise(name, ok, f"{words}; reference run exited {reference.returncode}")


# --- the signals ----------------------------------------------------------------------------------


def print_signals(timeline: Timeline) -> None:
    stats = timeline.admin.get("/v1/stats").raise_for_status().json()
    console.print("the four signals per queue (GET /v1/stats)")
    console.print(signals_table(stats))
    console.print(
        "the signals: 1 queue wait, 2 utilisation and goodput (without the work lost), "
        "3 preemptions and the GPU-seconds each lost (resizes apart), 4 the longest wait of the "
        f"least-served queue: {seconds(stats['max_wait_least_served_s'])} "
        f"(over {seconds(stats['window_s'])})"
    )


# --- clean-up -------------------------------------------------------------------------------------


def our_processes(tmp: Path) -> list[int]:
    """Processes whose command line names the demo's temporary directory: the server, the
    runners and jobs it started, the reference run. Nobody else's command line holds it."""
    mark = f"{tmp}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def stop_jobs(server: Server, timeout_s: float = 20) -> None:
    """Cancel every job still active (notice, SIGTERM: they save and exit), and wait."""
    if not server.running:
        return
    with server.client("admin") as admin, contextlib.suppress(httpx.HTTPError):
        active = [j for j in admin.get("/v1/jobs").json() if j["state"] in ACTIVE_STATES]
        for job in active:
            admin.delete(f"/v1/jobs/{job['id']}")
        if active:
            console.print(f"cancelling {', '.join(j['id'] for j in active)}...")
        deadline = time.monotonic() + timeout_s
        while active and time.monotonic() < deadline:
            time.sleep(0.2)
            views = admin.get("/v1/jobs").json()
            active = [j for j in views if j["state"] in ACTIVE_STATES]


def clean_up(server: Server, tmp: Path) -> list[int]:
    """Stop everything the demo started; returns the processes that had to be killed.

    Jobs first, through the API (what is left is killed below), then the server, then any
    process that still names the temporary directory, with its process group.
    """
    stop_jobs(server)
    server.stop()
    leftovers = our_processes(tmp)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)  # jobs lead groups of their own
    deadline = time.monotonic() + 10
    while our_processes(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    shutil.rmtree(tmp, ignore_errors=True)
    return leftovers


def on_terminate(signum: int, _frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


def during_clean_up(_signum: int, _frame: object) -> None:
    console.print("[yellow]cleaning up, one moment[/]")


# --- main -----------------------------------------------------------------------------------------


def run(server: Server, tmp: Path, *, hold: bool) -> list[Promise]:
    t0 = time.time()
    # 1. The reference: the same job, uninterrupted, without a manager and without pacing;
    #    then the manager.
    reference_dir = tmp / "reference-checkpoints"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREEMPTIBLE_")}
    with open(tmp / "reference.log", "wb") as log:
        reference = subprocess.Popen(
            job_command(reference_dir, BORROWER_STEPS, 0.0, "4"),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    timeline: Timeline | None = None
    try:
        server.start()
        timeline = Timeline(server, t0)
        timeline.say(
            "manager",
            f"up at {server.url}: SQLite in {server.state_dir}, 4 virtual GPUs, "
            "team-a and team-b with 2 each",
            style="bold",
        )
        seen = play(server, timeline, tmp)
        # 5. The promises, the signals, the events.
        try:
            reference.wait(60)
        except subprocess.TimeoutExpired:
            raise PromiseBroken("every job completed", "the reference run took over 60 s") from None
        bitwise = check_bitwise(seen, reference_dir)
        promises = [
            check_hand_on(timeline, seen),
            check_elastic(seen),
            check_resume(timeline, seen),
            bitwise,
            check_completed(timeline, reference),
        ]
        timeline.say("demo", f"bitwise check: {bitwise.detail}", style="bold")
        console.print()
        print_signals(timeline)
        token = server.tokens["admin"] if hold else "<admin token>"
        cli = Path(sys.executable).with_name("preemptible")
        cli_name = os.path.relpath(cli) if cli.exists() else "preemptible"
        console.print(
            f"\nthe events: {server.url}/v1/events (admin token), or\n"
            f"  PREEMPTIBLE_TOKEN={token} {cli_name} queue events --url {server.url}"
        )
        if hold:
            console.print("[bold]the server stays up until Ctrl-C[/]")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1)
        else:
            console.print("[dim](the server stops with the demo; --hold keeps it up)[/]")
        return promises
    finally:
        if timeline is not None:
            timeline.admin.close()
        if reference.poll() is None:
            reference.kill()
            reference.wait()


def report(promises: list[Promise]) -> int:
    console.print()
    for p in promises:
        mark = "[green]kept  [/]" if p.kept else "[bold red]BROKEN[/]"
        console.print(f"{mark} {p.name}: {escape(p.detail)}")
    broken = [p for p in promises if not p.kept]
    if broken:
        console.print(f"[bold red]promise failed: {broken[0].name}[/] ({escape(broken[0].detail)})")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--hold", action="store_true", help="keep the server up at the end, until Ctrl-C"
    )
    args = parser.parse_args()
    started = time.monotonic()
    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGHUP, on_terminate)
    tokens = {who: secrets.token_hex(16) for who in TOKEN_VARIABLES}
    tmp = Path(tempfile.mkdtemp(prefix="preemptible-queue-demo-"))
    server = Server(tmp, tokens)
    promises: list[Promise] = []
    interrupted = False
    try:
        console.rule("the queue manager demo: a borrower shrunk to reclaim, grown back")
        promises = run(server, tmp, hold=args.hold)
    except PromiseBroken as broken:
        promises.append(Promise(broken.promise, False, broken.detail))
        if server.log_tail(1):
            console.print(f"[dim]the server's last lines:\n{escape(server.log_tail())}[/]")
    except (KeyboardInterrupt, Interrupted):
        console.print("\n[yellow]interrupted: stopping every process the demo started[/]")
        interrupted = True
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, during_clean_up)
        leftovers = clean_up(server, tmp)
    if interrupted:
        return 130
    killed = f"{len(leftovers)} processes had to be killed" if leftovers else "all exited"
    promises.append(Promise("nothing is left running", not leftovers, killed))
    code = report(promises)
    console.print(f"[dim]{time.monotonic() - started:.0f} s in all[/]")
    return code


if __name__ == "__main__":
    sys.exit(main())
