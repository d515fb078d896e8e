"""`preemptible sim --html` in a real browser: Debian's Chromium, headless, through Playwright.

The real CLI writes the report of every policy on the small test trace; the browser opens it
from disk (`file://`) with every request that is not `file:` or `data:` aborted, and finds no
console error, no such request attempted, every chart decoded and the comparison table shown.
A page that does ask for something elsewhere shows that the block sees it.

A screenshot of the top of the report is taken on every run; `PREEMPTIBLE_UPDATE_SCREENSHOTS=1
pytest tests/unit/sim/test_html_report_browser.py` copies it to docs/img/sim-report.png.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from preemptible.sim.plots import COMPARISON_CHARTS, RUN_CHARTS
from tests.browser import keep_screenshot, launched

from .test_cli import run_cli

playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
expect = playwright_api.expect

ROOT = Path(__file__).resolve().parents[3]
POLICIES = 5
LOCAL = ("file:", "data:")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched() as b:
        yield b


class OfflinePage:
    """A tab that may read files and data URIs only: any other request is aborted and kept
    in `blocked`; console errors and uncaught exceptions are kept in `errors`."""

    def __init__(self, browser: Any, width: int = 1400, height: int = 1050):
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.blocked: list[str] = []
        self.requested: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("request", lambda r: self.requested.append(r.url))
        self.page.route("**/*", self._only_local)

    def _only_local(self, route: Any) -> None:
        if route.request.url.startswith(LOCAL):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def open(self, path: Path) -> None:
        self.page.goto(path.as_uri(), wait_until="load")

    def close(self) -> None:
        self.context.close()


def test_the_report_opens_from_disk_with_nothing_fetched(
    browser: Any, tmp_path: Path, small_trace: Path, small_config: Path
) -> None:
    html = tmp_path / "report.html"
    # Paths relative to the repository, as the screenshot in the docs shows them.
    trace, config = (str(p.relative_to(ROOT)) for p in (small_trace, small_config))
    args = ["--trace", trace, "--config", config, "--policy", "all"]
    proc = run_cli(*args, "--html", str(html), "--quiet", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr

    tab = OfflinePage(browser)
    tab.open(html)
    expect(tab.page.locator("#comparison table.comparison")).to_be_visible()
    expect(tab.page.locator("#comparison table.comparison tbody tr")).to_have_count(POLICIES)
    images = tab.page.eval_on_selector_all(
        "img", "all => all.map(i => ({alt: i.alt, done: i.complete, width: i.naturalWidth}))"
    )
    assert len(images) == len(COMPARISON_CHARTS) + len(RUN_CHARTS) * POLICIES
    assert [i["alt"] for i in images if not (i["done"] and i["width"] > 0)] == []
    shot = tmp_path / "sim-report.png"
    tab.page.screenshot(path=str(shot))  # the top of the report: header, notes, the table
    keep_screenshot(shot)
    tab.close()
    assert tab.errors == []
    assert tab.blocked == []
    assert [url for url in tab.requested if not url.startswith(LOCAL)] == []


def test_a_request_elsewhere_is_blocked_and_seen(browser: Any, tmp_path: Path) -> None:
    """The check above can fail: a page that asks for a style sheet and an image elsewhere."""
    page = tmp_path / "leaky.html"
    page.write_text(
        '<!doctype html><link rel="stylesheet" href="https://cdn.invalid/a.css">'
        '<img src="http://127.0.0.1:9/chart.png" alt="chart">'
    )
    tab = OfflinePage(browser)
    tab.open(page)
    tab.close()
    assert sorted(tab.blocked) == ["http://127.0.0.1:9/chart.png", "https://cdn.invalid/a.css"]
