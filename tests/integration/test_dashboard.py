"""The dashboard in a real browser: Debian's Chromium driven by Playwright, headless.

A real `preemptible queue serve` on four virtual GPUs runs real jobs. Signed in as the admin,
the page shows a submitted job appear, and a low-tier borrower go from running to preempting
to pending and back to running when a high-tier job of the lending queue arrives (a real
SIGTERM, which the job answers by "saving" for two seconds); the job's page shows the grace
it negotiated and the time it took. A wrong token is refused on the page and by the API; a
queue token sees its own jobs and the other queues as counts only, checked over HTTP and on the
page. With its API requests refused, the page says it is reconnecting, and it is live again by
itself once they pass. The pages log no console error but the browser's own for a refused
request.

Screenshots of each page are taken on every run; `PREEMPTIBLE_UPDATE_SCREENSHOTS=1 pytest
tests/integration/test_dashboard.py` copies them to docs/img/dashboard-*.png.
"""

from __future__ import annotations

import re
import socket
import sys
import time
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import httpx
import pytest

from preemptible.queue.service import dashboard, kpis
from preemptible.queue.service.history import SignalHistory
from preemptible.queue.service.store import Store
from preemptible.queue.service.views import CostView, EventView, JobState, JobView, QueueView
from tests.browser import keep_screenshot, launched
from tests.polling import wait_until

from .queue_server import Server, ready, submit, wait_event, wait_for

playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
expect = playwright_api.expect

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "preemptible" / "queue" / "service" / "static"

CONFIG = """
[cluster]
gpus = 4

[preemption]
grace_safety = 1.5
grace_margin = "1s"
grace_min = "1s"
grace_max = "10s"
min_runtime = "0s"
min_runtime_multiple = 1
cooldown = "0s"

[service]
admin_token = "env:D_ADMIN"

[[queues]]
name = "research"
nominal = { gpus = 2 }
token = "env:D_RESEARCH"

[[queues]]
name = "interns"
nominal = { gpus = 1 }
borrowing_limit = { gpus = 2 }
token = "env:D_INTERNS"

[[queues]]
name = "ops"
nominal = { gpus = 1 }
borrowing_limit = { gpus = 0 }
token = "env:D_OPS"
"""
TOKENS = {
    "D_ADMIN": "admin-secret",
    "D_RESEARCH": "research-secret",
    "D_INTERNS": "intern-secret",
    "D_OPS": "ops-secret",
}
# Reports a save of 2 s (grace: 1.5 * 2 + 1 = 4 s); told to go, "saves" for 2 s and exits.
SAVER = """
import os, signal, sys, time, httpx
def stop(*_):
    time.sleep(2)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
url, job = os.environ["PREEMPTIBLE_QUEUE_URL"], os.environ["PREEMPTIBLE_JOB_ID"]
auth = {"Authorization": "Bearer " + os.environ["PREEMPTIBLE_TOKEN"]}
httpx.post(f"{url}/v1/jobs/{job}/cost", json={"save_seconds_p95": 2.0}, headers=auth)
print("ready", flush=True)
time.sleep(600)
"""
NEGOTIATED_GRACE = "4 s"
STATE_TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("dashboard"), CONFIG, TOKENS)
    s.start()
    try:
        yield s
    finally:
        cancel_all(s)
        s.stop()


def cancel_all(server: Server) -> None:
    """Cancels every job still waiting or running, and waits until none holds a GPU."""
    with server.client("admin-secret") as admin:
        for job in admin.get("/v1/jobs").json():
            if job["state"] in ("pending", "running", "preempting"):
                admin.delete(f"/v1/jobs/{job['id']}")
        wait_until(
            lambda: not admin.get("/v1/dashboard").json()["jobs"],
            "the cancelled jobs to end",
            timeout=30,
            every=0.1,
            describe=lambda: admin.get("/v1/dashboard").json()["jobs"],
        )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched() as b:
        yield b


class Page:
    """A fresh tab that records what the console says."""

    def __init__(self, browser: Any, server: Server):
        self.context = browser.new_context(viewport={"width": 1600, "height": 900})
        self.page = self.context.new_page()
        self.url = server.url
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def sign_in(self, token: str) -> None:
        self.page.goto(f"{self.url}/")
        self.page.fill("#token", token)
        self.page.click("#sign-in-form button[type=submit]")
        # The page keeps the token only once the server has accepted it: wait for its answer,
        # so that a navigation right after this cannot outrun it and land signed out.
        self.page.wait_for_function(
            "() => document.getElementById('sign-in').hidden"
            " || !document.getElementById('sign-in-error').hidden"
        )

    def state_of(self, job_id: str) -> Any:
        return self.page.locator(f'#jobs tr[data-job="{job_id}"] .badge')

    def screenshot(self, name: str, tmp: Path) -> None:
        path = tmp / f"dashboard-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        keep_screenshot(path)

    def close(self) -> None:
        self.context.close()


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_borrower_is_seen_running_preempting_pending_and_back_with_its_grace(
    server: Server, browser: Any, tmp_path: Path
) -> None:
    tab = Page(browser, server)
    page = tab.page
    started = time.monotonic()
    tab.sign_in("admin-secret")
    expect(page.locator("#overview")).to_be_visible(timeout=10_000)
    signed_in_s = time.monotonic() - started
    expect(page.locator("#viewer")).to_have_text("admin")
    expect(page.locator("#cluster .gpu")).to_have_count(4)

    with server.client("admin-secret") as admin:
        submit(admin, "ops", ["sleep", "600"], gpus=1, name="nightly-eval")
        submitted = time.monotonic()
        borrower = submit(
            admin, "interns", python(SAVER), gpus=3, tier="low", name="finetune", cwd=str(tmp_path)
        )
        expect(page.locator(f'#jobs tr[data-job="{borrower["id"]}"]')).to_be_visible(timeout=10_000)
        appeared_s = time.monotonic() - submitted
        waiting = submit(admin, "ops", ["sleep", "600"], gpus=2, name="big-eval")
        ready(admin, borrower["id"])
        wait_event(admin, borrower["id"], "negotiated")
        expect(tab.state_of(borrower["id"])).to_have_text("running", timeout=STATE_TIMEOUT_MS)
        expect(tab.state_of(waiting["id"])).to_have_text("pending", timeout=STATE_TIMEOUT_MS)
        expect(page.locator('#cluster .gpu[data-queue="interns"]')).to_have_count(3)

        high = submit(admin, "research", ["sleep", "6"], gpus=2, tier="high", name="train-7b")
        expect(tab.state_of(borrower["id"])).to_have_text("preempting", timeout=STATE_TIMEOUT_MS)
        seen_at = time.time()
        assert page.locator('#cluster .gpu.preempting[data-queue="interns"]').count() >= 1
        expect(tab.state_of(borrower["id"])).to_have_text("pending", timeout=STATE_TIMEOUT_MS)
        expect(page.locator('#cluster .gpu[data-queue="research"]')).to_have_count(
            2, timeout=STATE_TIMEOUT_MS
        )
        tab.screenshot("overview", tmp_path)
        expect(tab.state_of(borrower["id"])).to_have_text("running", timeout=30_000)
        assert wait_for(admin, high["id"], {"completed"})["state"] == "completed"
        back = admin.get(f"/v1/jobs/{borrower['id']}").json()
        events = admin.get("/v1/events", params={"job_id": borrower["id"]}).json()
        notice_shown_s = seen_at - next(e["at"] for e in events if e["kind"] == "notice")
    assert back["attempts"] == 2

    page.click(f'#jobs tr[data-job="{borrower["id"]}"] a')
    expect(page.locator("#job")).to_be_visible()
    notice = page.locator("#job-notices tbody tr").first
    expect(notice.locator(".grace")).to_have_text(NEGOTIATED_GRACE, timeout=10_000)
    took = float(notice.locator(".took").inner_text().removesuffix(" s"))
    assert 1.5 <= took < 4.0, took  # its 2 s save, inside the 4 s grace
    expect(notice).to_contain_text(high["id"])  # told for whom
    expect(page.locator("#job-attempts")).to_have_text("2")
    expect(page.locator("#job-timeline")).to_contain_text("requeued")
    expect(page.locator("#job-log")).to_contain_text("ready")
    tab.screenshot("job", tmp_path)
    print(
        f"\nsigned in and drawn in {signed_in_s:.2f} s; a new job shown {appeared_s:.2f} s "
        f"after its 201; a notice shown {notice_shown_s:.2f} s after it was sent"
    )
    assert tab.errors == []
    tab.close()
    cancel_all(server)


def test_a_wrong_token_is_refused_on_the_page_and_by_the_api(
    server: Server, browser: Any, tmp_path: Path
) -> None:
    tab = Page(browser, server)
    tab.sign_in("not-a-token-of-this-server")
    refusal = tab.page.locator("#sign-in-error")
    expect(refusal).to_be_visible()
    expect(refusal).to_contain_text("Refused")
    expect(refusal).to_contain_text("not valid here")
    expect(tab.page.locator("#overview")).to_be_hidden()
    assert tab.page.evaluate("sessionStorage.length") == 0  # a refused token is not kept
    tab.screenshot("sign-in", tmp_path)
    # The browser reports the refused request itself, and nothing else.
    assert all("401" in e for e in tab.errors) and len(tab.errors) == 1, tab.errors
    tab.close()

    answer = httpx.get(
        f"{server.url}/v1/dashboard", headers={"Authorization": "Bearer not-a-token"}
    )
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthenticated"
    assert answer.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{server.url}/v1/dashboard").status_code == 401


def test_a_queue_token_sees_its_jobs_in_full_and_other_queues_as_counts(
    server: Server, browser: Any
) -> None:
    with server.client("ops-secret") as ops, server.client("intern-secret") as interns:
        theirs = submit(ops, "ops", ["sleep", "600"], gpus=1, name="secret-ops-job")
        mine = submit(interns, "interns", ["sleep", "600"], gpus=1, name="intern-job")
        wait_for(ops, theirs["id"], {"running"})
        wait_for(interns, mine["id"], {"running"})
        view = interns.get("/v1/dashboard").json()
        assert view["viewer"] == {"kind": "queue", "name": "interns"}
        assert {j["queue"] for j in view["jobs"]} == {"interns"}
        assert mine["id"] in {j["id"] for j in view["jobs"]}
        ops_row = next(r for r in view["queues"] if r["queue"]["name"] == "ops")
        assert ops_row["queue"]["running"] == 1  # counted
        held = {gpu["queue"]: gpu for gpu in view["gpus"] if gpu["queue"] is not None}
        assert held["ops"]["job_id"] is None and held["ops"]["job_name"] is None  # not named
        assert held["interns"]["job_id"] == mine["id"]
        assert interns.get(f"/v1/jobs/{theirs['id']}/detail").status_code == 403
        assert interns.get(f"/v1/jobs/{mine['id']}/detail").status_code == 200
        assert interns.get("/v1/signals/history").status_code == 200

    tab = Page(browser, server)
    tab.sign_in("intern-secret")
    expect(tab.page.locator("#viewer")).to_have_text("queue interns", timeout=10_000)
    expect(tab.page.locator(f'#jobs tr[data-job="{mine["id"]}"]')).to_be_visible()
    expect(tab.page.locator("#others")).to_contain_text("ops: 0 pending, 1 running")
    expect(tab.page.locator('#cluster .gpu[data-queue="ops"]')).to_contain_text("another team")
    assert "secret-ops-job" not in tab.page.content()
    assert tab.page.locator(f'#jobs tr[data-job="{theirs["id"]}"]').count() == 0
    tab.page.goto(f"{server.url}/#/jobs/{theirs['id']}")
    expect(tab.page.locator("#job-banner")).to_contain_text("cannot reach it")
    assert all("403" in e for e in tab.errors), tab.errors  # the refused request, only
    tab.close()


def test_the_jobs_table_is_filtered_and_bounded_by_the_server(server: Server, browser: Any) -> None:
    with server.client("admin-secret") as admin, server.client("ops-secret") as ops:
        kept = submit(admin, "research", ["sleep", "600"], tier="high", name="kept")
        dropped = submit(admin, "research", ["sleep", "600"], tier="low", name="dropped")
        admin.delete(f"/v1/jobs/{dropped['id']}")
        wait_for(admin, dropped["id"], {"cancelled"})

        def ids(**params: Any) -> list[str]:
            return [j["id"] for j in admin.get("/v1/dashboard", params=params).json()["jobs"]]

        assert kept["id"] in ids() and dropped["id"] not in ids()
        assert ids(state="cancelled")[0] == dropped["id"]  # finished: newest first
        assert kept["id"] in ids(tier="high") and kept["id"] not in ids(tier="low")
        assert {kept["id"], dropped["id"]} <= set(ids(queue="research", state="all"))
        assert kept["id"] not in ids(queue="ops", state="all")
        bounded = admin.get("/v1/dashboard", params={"state": "all", "limit": 1}).json()
        assert len(bounded["jobs"]) == 1 and bounded["jobs_matching"] >= 2
        refused = ops.get("/v1/dashboard", params={"queue": "research"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
        assert admin.get("/v1/dashboard", params={"state": "asleep"}).status_code == 422

    tab = Page(browser, server)
    tab.sign_in("admin-secret")
    expect(tab.state_of(kept["id"])).to_have_text("running", timeout=10_000)
    tab.page.select_option("#filter-state", "cancelled")
    expect(tab.state_of(dropped["id"])).to_have_text("cancelled", timeout=10_000)
    assert tab.state_of(kept["id"]).count() == 0
    assert tab.errors == []
    tab.close()


def test_an_elastic_job_shows_its_size_now_and_its_range(server: Server, browser: Any) -> None:
    cancel_all(server)  # the jobs of the tests before hold no GPU: 4 are free
    tab = Page(browser, server)
    tab.sign_in("admin-secret")
    with server.client("admin-secret") as admin:
        holder = submit(admin, "ops", ["sleep", "600"], gpus=1, name="holder")
        wait_for(admin, holder["id"], {"running"})
        elastic = submit(admin, "research", ["sleep", "600"], gpus=4, min_gpus=2, name="elastic")
        assert len(wait_for(admin, elastic["id"], {"running"})["gpu_ids"]) == 3
    size = tab.page.locator(f'#jobs tr[data-job="{elastic["id"]}"] td').nth(5)
    expect(size).to_have_text("3 (2–4)", timeout=STATE_TIMEOUT_MS)  # 3 now, of 2 to 4
    assert tab.errors == []
    tab.close()
    cancel_all(server)


def test_a_lost_connection_shows_reconnecting_and_the_page_recovers_by_itself(
    server: Server, browser: Any
) -> None:
    with server.client("admin-secret") as admin:
        waiting = submit(admin, "research", ["sleep", "600"], tier="low", name="waiting")
    tab = Page(browser, server)
    tab.sign_in("admin-secret")
    live, notice = tab.page.locator("#live"), tab.page.locator("#banner")
    for page, url in (("#overview", "/"), ("#job", f"/#/jobs/{waiting['id']}")):
        tab.page.goto(f"{server.url}{url}")
        expect(tab.page.locator(page)).to_be_visible(timeout=10_000)
        expect(live).to_have_text("live")
        expect(notice).to_be_hidden()
        # The browser's own network layer refuses every API request from here on, as it
        # would with the server gone; the page keeps its token and polls on.
        tab.page.route("**/v1/**", lambda route: route.abort("connectionrefused"))
        expect(live).to_have_text("reconnecting", timeout=10_000)
        expect(notice).to_be_visible()
        expect(notice).to_contain_text("Cannot reach the queue manager")
        tab.page.unroute("**/v1/**")
        expect(live).to_have_text("live", timeout=10_000)
        expect(notice).to_be_hidden()
        expect(tab.page.locator(page)).to_be_visible()
    # The browser reports the refused requests itself, and nothing else.
    assert tab.errors and all("ERR_CONNECTION_REFUSED" in e for e in tab.errors), tab.errors
    tab.close()


def test_the_page_is_served_from_the_package_alone(server: Server) -> None:
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    for file in STATIC.iterdir():
        served = httpx.get(f"{server.url}/static/{file.name}")
        assert served.status_code == 200, file.name
        assert served.text == file.read_text()
        # Nothing is fetched from elsewhere: the only absolute URL is SVG's namespace.
        urls = set(re.findall(r"https?://[^\s\"'`)]+", served.text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (file.name, urls)
    assert httpx.get(f"{server.url}/static/nothing.js").status_code == 404


def test_the_pages_files_are_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["preemptible"]
    for file in STATIC.rglob("*"):
        if file.is_file():
            relative = file.relative_to(ROOT / "preemptible").as_posix()
            assert any(fnmatch(relative, p) for p in patterns), relative


def test_the_dashboard_is_not_served_on_another_address(server: Server) -> None:
    """`queue serve` binds 127.0.0.1 unless --host says otherwise: another address of this
    machine (its outward one, else another loopback one) is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            address = probe.getsockname()[0]
        except OSError:
            address = "127.0.0.2"
    if address.startswith("127.0.0.1"):
        address = "127.0.0.2"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{address}:{server.port}/", timeout=3)


# --- the answers behind the pages, without a browser ---------------------------------------------


def event(i: int, kind: str, reason: str = "", **data: Any) -> EventView:
    at = 100.0 + i
    return EventView(id=i, at=at, kind=kind, job_id="j1", queue="a", reason=reason, data=data)


EXIT = {"grace_s": 4.0, "killed": False}


def test_a_jobs_story_is_read_from_its_audit_log() -> None:
    story = [
        event(1, "submitted"),
        event(2, "admitted", gpus=[0, 1]),
        event(3, "negotiated", grace_s=4.0, min_runtime_s=2.0, save_s=2.0, observed_exit_s=None),
        event(4, "checkpointed", step=10),
        event(5, "notice", "preempted for j2", grace_s=4.0),
        event(6, "checkpointed", step=12),
        event(7, "requeued", "preempted for j2", **EXIT, took_s=2.5, lost_gpu_s=1.0, acked=True),
        event(8, "admitted", gpus=[2, 3]),
        # a restart found the second attempt gone: requeued without a notice event
        event(9, "requeued", "its process was gone", grace_s=0.0, took_s=0.0, lost_gpu_s=3.0),
        event(10, "admitted", gpus=[0, 1]),
    ]
    job = JobView(
        id="j1", name="n", queue="a", tier="low", gpus=2, cpus=0, memory_gb=0,
        state=JobState.RUNNING, reason="admitted", submitted_at=101.0, started_at=110.0,
        finished_at=None, attempts=3, exit_code=None, grace_s=4.0, min_runtime_s=2.0,
        cost=CostView(), command=["x"],
    )  # fmt: skip
    detail = dashboard.job_detail(job, story[::-1], dashboard.tail_log(None), now=120.0)
    assert [(a.number, a.outcome, a.gpu_ids) for a in detail.attempts] == [
        (1, "requeued", [0, 1]),
        (2, "requeued", [2, 3]),
        (3, "running", [0, 1]),
    ]
    first, second = detail.notices
    assert (first.grace_s, first.took_s, first.acked, first.attempt) == (4.0, 2.5, True, 1)
    assert (second.reason, second.lost_gpu_s, second.attempt) == ("its process was gone", 3.0, 2)
    assert second.acked is None  # not said
    assert detail.lost_gpu_s == 4.0
    assert [(c.step, c.after_notice) for c in detail.checkpoints] == [(10, False), (12, True)]
    assert [n.grace_s for n in detail.negotiations] == [4.0]
    assert [e.id for e in detail.timeline] == list(range(1, 11))  # oldest first


def test_lent_capacity_is_the_borrowed_part_of_idle_quotas() -> None:
    def queue(name: str, nominal: float | None, used: float) -> QueueView:
        borrowed = max(0.0, used - nominal) if nominal is not None else 0.0
        return QueueView(
            name=name, weight=1.0, nominal_gpus=nominal, borrowing_limit_gpus=None,
            used_gpus=used, borrowed_gpus=borrowed, pending=0, running=0, fair_share=0.0,
        )  # fmt: skip

    # 8 GPUs, quotas 4 + 2 + 1: one GPU no quota claims is lent first.
    queues = [queue("a", 4, 0), queue("b", 2, 1), queue("c", 1, 4)]
    assert dashboard.lent_gpus(queues, 8) == {"a": 2.0 * 4 / 5, "b": 2.0 / 5, "c": 0.0}
    assert set(dashboard.lent_gpus(queues[:2], 8).values()) == {0.0}  # nobody borrows


def test_a_log_tail_starts_at_a_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    tail = dashboard.tail_log(log, limit=100)
    assert tail.truncated and tail.text.startswith("line ") and tail.text.endswith("line 999\n")
    assert dashboard.tail_log(tmp_path / "none.log").text == ""


def test_the_signal_samples_survive_a_restart_and_are_kept_a_day(tmp_path: Path) -> None:
    now = time.time()
    stats = kpis.compute([], queues=["a"], gpus=2, now=now, window_s=86400.0)  # no jobs yet
    store = Store(tmp_path)
    history = SignalHistory(store, every_s=60.0, keep_s=3600.0)
    for minutes in (-120, -30, -1, 0):
        history._next_at = 0.0  # each call samples
        assert history.maybe_sample(now + 60 * minutes, lambda: stats)
    assert not history.maybe_sample(now + 1, lambda: stats)  # not due yet
    store.close()
    again = SignalHistory(Store(tmp_path), keep_s=3600.0)
    again.load(now)
    kept = [round((s.at - now) / 60) for s in again.since(0.0)]
    assert kept == [-30, -1, 0]  # the sample of two hours ago was dropped
    assert again.since(now - 90)[0].stats == stats
