import json
import subprocess
import sys

import pytest

from .test_simulator import SCHEMA_KEYS


def run_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "preemptible", "sim", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


def test_sim_writes_the_json_contract_and_a_table(tmp_path, small_trace, small_config):
    out = tmp_path / "m.json"
    proc = run_cli(
        "--trace",
        str(small_trace),
        "--config",
        str(small_config),
        "--policy",
        "all",
        "--json",
        str(out),
        "--plot",
        str(tmp_path / "plots"),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert set(report["policies"]) == {"fifo", "priority", "kueue", "slurm", "preemptible"}
    for metrics in report["policies"].values():
        overall = metrics["overall"]
        assert SCHEMA_KEYS | {"max_wait_least_served_s", "sim_seconds"} <= overall.keys()
        assert 0.0 <= overall["utilization"] <= 1.0 and 0.0 <= overall["goodput"] <= 1.0
        assert set(metrics["queues"]) == {"team-a", "team-b", "team-c"}
    assert "preemptible" in proc.stdout and "goodput" in proc.stdout
    assert len(list((tmp_path / "plots").glob("*.png"))) == 15
    # ours preempts on this trace: its loss by rule, as the JSON has it, gets a row of its own
    ours = report["policies"]["preemptible"]["overall"]
    assert ours["preemptions"] > 0
    title = "lost GPU-h by the rule that sent the notice"
    row = next(line for line in proc.stdout.split(title)[1].splitlines() if "preemptible" in line)
    for kind, lost_s in ours["lost_gpu_s_by_kind"].items():
        assert f"{lost_s / 3600:,.1f} ({ours['preemptions_by_kind'][kind]:,})" in row, kind
    # the report opens with the summary: ours against the best other policy on each signal
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"{small_trace}: ") and "summary: preemptible" in lines[1]
    summary = proc.stdout.split("every signal, per policy")[0]
    p95 = next(line for line in summary.splitlines() if "p95 wait (" in line)
    unit = p95.split("p95 wait (")[1].split(")")[0]
    per = {"h": 3600, "min": 60, "s": 1}[unit]
    others = {n: m["overall"]["p95_wait_s"] for n, m in report["policies"].items()}
    best = min((n for n in others if n != "preemptible"), key=lambda n: others[n])
    cells = [c.strip() for c in p95.split("│") if c.strip()]
    assert cells[1:] == [
        f"{ours['p95_wait_s'] / per:.1f}",
        f"{others[best] / per:.1f}",
        best,
    ], p95
    # one unit per column, stated once in its heading: no "108.8m" beside "4.7h"
    table = proc.stdout.split("every signal, per policy")[1].split("p95 wait (max wait)")[0]
    assert "mean JCT (" in table and not any(
        cell.strip().endswith(("m", "h"))
        for line in table.splitlines()
        for cell in line.split("│")
        if cell.strip()[:1].isdigit()
    ), table


def test_single_policy(tmp_path, small_trace, small_config):
    out = tmp_path / "m.json"
    proc = run_cli(
        "--trace",
        str(small_trace),
        "--config",
        str(small_config),
        "--policy",
        "fifo",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(out.read_text())["policies"]) == ["fifo"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "{bad}", "--config", "{cfg}"], "missing column 'tier'"),
        (["--trace", "{trace}", "--config", "{cfg}", "--policy", "lottery"], "unknown policy"),
        (["--trace", "{trace}", "--config", "{badcfg}"], "unknown key 'agin'"),
        (["--trace", "{tmp}/nope.csv", "--config", "{cfg}"], "nope.csv"),
        (["--config", "{cfg}"], "give --trace"),
    ],
    ids=["missing-column", "unknown-policy", "bad-config", "missing-file", "no-trace"],
)
def test_bad_input_prints_one_line_and_exits_2(tmp_path, small_trace, small_config, args, message):
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_s,duration_s,gpus,queue\n1,0,10,1,team-a\n")
    badcfg = tmp_path / "bad.toml"
    badcfg.write_text("[cluster]\ngpus = 8\n[policy]\nagin = '1h'\n")
    subst = {
        "bad": bad,
        "cfg": small_config,
        "trace": small_trace,
        "badcfg": badcfg,
        "tmp": tmp_path,
    }
    proc = run_cli(*(a.format(**subst) for a in args))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr


def test_import_and_synth_subcommands(tmp_path):
    trace, cfg = tmp_path / "s.csv", tmp_path / "s.toml"
    proc = run_cli("synth", str(trace), "--jobs", "40", "--gpus", "16", "--config-out", str(cfg))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(
        "import", str(trace), str(tmp_path / "c.csv"), "--config-out", str(tmp_path / "c.toml")
    )
    assert proc.returncode == 0, proc.stderr
    assert "[canonical]" in proc.stdout and "40 jobs" in proc.stdout
    proc = run_cli(
        "--trace", str(tmp_path / "c.csv"), "--config", str(cfg), "--policy", "preemptible"
    )
    assert proc.returncode == 0, proc.stderr


def test_sim_notes_jobs_larger_than_their_queue_nominal_quota(tmp_path, small_trace, small_config):
    # team-a submits 8-GPU jobs; with a nominal quota of 4 they can only ever borrow.
    cfg = tmp_path / "q.toml"
    cfg.write_text(small_config.read_text().replace("gpus = 9", "gpus = 4"))
    out = tmp_path / "m.json"
    args = ["--trace", str(small_trace), "--config", str(cfg), "--policy", "fifo"]
    proc = run_cli(*args, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (note,) = proc.stderr.strip().splitlines()
    assert note.startswith("note: team-a has 17 jobs of up to 8 GPUs, above its nominal quota of 4")
    (found,) = json.loads(out.read_text())["quota_shortfalls"]
    assert (found["queue"], found["jobs"], found["largest_gpus"]) == ("team-a", 17, 8)
    proc = run_cli("--trace", str(small_trace), "--config", str(small_config), "--policy", "fifo")
    assert proc.returncode == 0 and "note:" not in proc.stderr


@pytest.mark.parametrize(
    ("config", "trace", "expected"),
    [
        (
            "[cluster]\ngpus = 16\n\n[[queues]]\nname = 'team-a'\nweight = 0\n",
            None,
            "{cfg}:6: queues[0].weight: must be greater than 0, got 0",
        ),
        (
            "[cluster]\ngpus = 16\n[policy\n",
            None,
            "{cfg}:3: the configuration is not valid TOML: Expected ']' at the end of a table "
            "declaration (column 8)",
        ),
        (
            None,
            "job_id,submit_s,duration_s,gpus,queue,tier\n1,0,10,1,team-a,normal\n2,0,x,1,team-a,low\n",
            "{trace}:3: column 'duration_s': 'x' is not a number",
        ),
    ],
    ids=["config-value", "config-syntax", "trace-value"],
)
def test_bad_files_print_one_line_naming_file_and_line(
    tmp_path, small_trace, small_config, config, trace, expected
):
    cfg, csv = small_config, small_trace
    if config is not None:
        cfg = tmp_path / "bad.toml"
        cfg.write_text(config)
    if trace is not None:
        csv = tmp_path / "bad.csv"
        csv.write_text(trace)
    proc = run_cli("--trace", str(csv), "--config", str(cfg), "--policy", "fifo")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: " + expected.format(cfg=cfg, trace=csv)]


# A queue and a trace file whose names clear the screen, retitle the window, start an 8-bit
# CSI, and ask rich for a link and an emoji: the reader's terminal obeys none.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b6n[link=https:e.x]x:warning:"  # no "/": a file name
SHOWN = r"\x1b[2J\x1b]0;pwned\x07\x9b6n[link=https:e.x]x:warning:"
TOML_NAME = HOSTILE.encode("unicode_escape").decode().replace("\\x", "\\u00")


def test_names_from_the_trace_and_config_reach_the_terminal_escaped(tmp_path):
    cfg = tmp_path / "q.toml"
    cfg.write_text(
        f'[cluster]\ngpus = 8\n[[queues]]\nname = "{TOML_NAME}"\nnominal = {{ gpus = 4 }}\n'
    )
    trace = tmp_path / f"trace{HOSTILE}.csv"
    trace.write_text(
        "job_id,submit_s,duration_s,gpus,queue,tier\n"
        f"1,0,100,8,{HOSTILE},normal\n2,10,100,1,{HOSTILE},normal\n"
    )
    proc = run_cli("--trace", str(trace), "--config", str(cfg), "--policy", "fifo")
    assert proc.returncode == 0, proc.stderr
    seen = proc.stdout + proc.stderr
    assert not any(c in seen for c in ("\x1b", "\x07", "\x9b")), seen
    assert SHOWN in proc.stdout  # the queue's row
    assert proc.stderr.startswith(f"note: {SHOWN} has 1 job of up to 8 GPUs")
    proc = run_cli("import", str(trace), str(tmp_path / "c.csv"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{tmp_path}/trace{SHOWN}.csv [canonical] -> ")
