"""`preemptible sim --html`: the real CLI writes one self-contained page whose numbers are the
`--json` output's, with every chart embedded and every input string escaped."""

import base64
import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest

from preemptible.sim.html_report import QUEUE_COLUMNS
from preemptible.sim.kpis import COMPARISON_COLUMNS, format_metric
from preemptible.sim.plots import COMPARISON_CHARTS, RUN_CHARTS

from .test_cli import run_cli

POLICIES = ["fifo", "priority", "kueue", "slurm", "preemptible"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class Cell:
    text: str = ""
    classes: tuple[str, ...] = ()
    value: str | None = None


@dataclass
class Table:
    classes: tuple[str, ...]
    section: str | None
    rows: list[list[Cell]] = field(default_factory=list)

    def body(self) -> dict[str, list[Cell]]:
        """Rows after the header, by their first cell (the policy or queue name)."""
        return {row[0].text: row[1:] for row in self.rows[1:]}


class Page(HTMLParser):
    """The parts of the report the tests look at: tables, images, every attribute value."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tables: list[Table] = []
        self.images: list[dict[str, str]] = []
        self.attributes: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()
        self.text: list[str] = []
        self._section: str | None = None
        self._cell: Cell | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        self.attributes += [(tag, k, v) for k, v in attrs.items()]
        classes = tuple(attrs.get("class", "").split())
        if tag == "section":
            self._section = attrs.get("id")
        elif tag == "table":
            self.tables.append(Table(classes, self._section))
        elif tag == "tr":
            self.tables[-1].rows.append([])
        elif tag in ("td", "th"):
            self._cell = Cell(classes=classes, value=attrs.get("data-value"))
            self.tables[-1].rows[-1].append(self._cell)
        elif tag == "img":
            self.images.append(attrs)

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.text += data

    def table(self, kind: str, section: str) -> Table:
        (found,) = [t for t in self.tables if kind in t.classes and t.section == section]
        return found


@pytest.fixture(scope="module")
def all_policies(tmp_path_factory, small_trace, small_config):
    """One real run of every policy, with --json and --html (in a folder yet to be made)."""
    out = tmp_path_factory.mktemp("html")
    html = out / "reports" / "report.html"
    args = ["--trace", str(small_trace), "--config", str(small_config), "--policy", "all"]
    proc = run_cli(*args, "--json", str(out / "m.json"), "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    text = html.read_text()
    return proc, html, text, Page(text), json.loads((out / "m.json").read_text())


def test_comparison_table_has_every_policy_with_the_json_numbers(all_policies):
    *_, page, report = all_policies
    rows = page.table("comparison", "comparison").body()
    assert list(rows) == POLICIES
    for name, cells in rows.items():
        overall = report["policies"][name]["overall"]
        assert len(cells) == len(COMPARISON_COLUMNS)
        for column, cell in zip(COMPARISON_COLUMNS, cells, strict=True):
            assert float(cell.value) == overall[column.key], (name, column.key)
            assert cell.text == format_metric(overall[column.key], column.kind)


def test_best_value_of_each_column_is_marked(all_policies):
    *_, page, report = all_policies
    rows = page.table("comparison", "comparison").body()
    for i, column in enumerate(COMPARISON_COLUMNS):
        if column.key.endswith("_per_preemption"):
            continue  # policies that preempt nothing are left out of this one
        values = {n: report["policies"][n]["overall"][column.key] for n in POLICIES}
        best = (max if column.higher_is_better else min)(values, key=values.get)
        marked = {n for n, cells in rows.items() if "best" in cells[i].classes}
        assert best in marked, column.key
        shown = rows[best][i].text
        assert all(rows[n][i].text == shown for n in marked), column.key


def test_loss_per_preemption_is_not_best_for_a_policy_that_never_preempts(all_policies):
    *_, page, report = all_policies
    rows = page.table("comparison", "comparison").body()
    i = [c.key for c in COMPARISON_COLUMNS].index("lost_gpu_s_per_preemption")
    for name, cells in rows.items():
        if report["policies"][name]["overall"]["preemptions"] == 0:
            assert "best" not in cells[i].classes, name


def test_each_policy_has_a_per_queue_table_with_the_json_numbers(all_policies):
    *_, page, report = all_policies
    for name in POLICIES:
        rows = page.table("queues", f"policy-{name}").body()
        queues = report["policies"][name]["queues"]
        assert list(rows) == list(queues) == ["team-a", "team-b", "team-c"]
        for queue, cells in rows.items():
            for column, cell in zip(QUEUE_COLUMNS, cells, strict=True):
                assert float(cell.value) == queues[queue][column.key], (name, queue, column.key)


def test_every_chart_is_an_embedded_png(all_policies):
    *_, page, _ = all_policies
    assert len(page.images) == len(COMPARISON_CHARTS) + len(RUN_CHARTS) * len(POLICIES)
    for image in page.images:
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix) and image["alt"]
        assert base64.b64decode(image["src"][len(prefix) :])[:8] == PNG_MAGIC


def test_the_page_needs_nothing_outside_itself(all_policies):
    _, html, text, page, _ = all_policies
    assert not page.tags & {"script", "link", "iframe", "object", "embed"}
    for tag, name, value in page.attributes:
        if name == "src":
            assert value.startswith("data:"), (tag, value[:40])
        elif name == "href":
            assert value.startswith("#"), (tag, value)
    without_data = re.sub(r'"data:[^"]*"', '""', text)
    for needle in ("http:", "https:", "//", "url(", "@import"):
        assert needle not in without_data
    assert sorted(p.name for p in html.parent.iterdir()) == ["report.html"]  # no temp file left


def test_header_names_trace_config_options_and_version(all_policies):
    proc, html, _, page, report = all_policies
    from preemptible import __version__

    words = " ".join(page.text)
    for expected in (report["trace"], report["config"], "aware", __version__, "generated"):
        assert expected in words
    assert f"wrote {html}" in proc.stderr


@pytest.fixture
def hostile_input(tmp_path, small_trace, small_config):
    """The small trace with team-c renamed to markup, in a file whose name is markup too."""
    name = "<script>alert(1)</script>"
    trace = tmp_path / "<b>trace.csv"
    trace.write_text(small_trace.read_text().replace(",team-c,", f",{name},"))
    config = tmp_path / "q.toml"
    config.write_text(small_config.read_text().replace('"team-c"', json.dumps(name)))
    return name, trace, config


def test_queue_and_file_names_from_the_input_come_out_escaped(tmp_path, hostile_input):
    name, trace, config = hostile_input
    html = tmp_path / "r.html"
    args = ["--trace", str(trace), "--config", str(config), "--policy", "fifo"]
    proc = run_cli(*args, "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    text = html.read_text()
    assert "<script" not in text.lower() and "<b>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&lt;b&gt;trace.csv" in text
    page = Page(text)
    assert name in page.table("queues", "policy-fifo").body()
    assert len(page.images) == len(RUN_CHARTS)  # one policy: no comparison charts


@pytest.mark.parametrize(
    ("where", "message"),
    [("{tmp}", "it is a directory"), ("{tmp}/file.txt/report.html", "file.txt is not a folder")],
    ids=["a-directory", "under-a-file"],
)
def test_a_path_that_cannot_be_written_fails_before_the_simulation(
    tmp_path, small_trace, small_config, where, message
):
    (tmp_path / "file.txt").write_text("")
    html = where.format(tmp=tmp_path)
    args = ["--trace", str(small_trace), "--config", str(small_config), "--policy", "all"]
    proc = run_cli(*args, "--html", html, "--json", str(tmp_path / "m.json"))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot write the report to {html}: ") and message in line
    assert not (tmp_path / "m.json").exists()  # it stopped before simulating
