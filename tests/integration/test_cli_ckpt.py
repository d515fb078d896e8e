"""`preemptible ckpt` as a user runs it: a real subprocess, tables, JSON and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from preemptible import Checkpointer


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "preemptible", "ckpt", *args],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def root(tmp_path):
    ckpt = Checkpointer(tmp_path / "run", keep=None)
    model = torch.nn.Linear(16, 4)
    for step in (5, 10):
        ckpt.save(step, {"model": model, "meta": {"epoch": step // 5}})
    return tmp_path / "run"


def test_list_shows_committed_steps_as_a_table_and_as_json(root):
    table = run("list", str(root))
    assert table.returncode == 0 and "step" in table.stdout and " 10 " in table.stdout
    data = json.loads(run("list", str(root), "--json").stdout)
    assert [c["step"] for c in data["checkpoints"]] == [5, 10]


def test_inspect_lists_keys_shapes_and_dtypes(root):
    data = json.loads(run("inspect", str(root), "--step", "5", "--json").stdout)
    keys = {k["key"]: k for k in data["keys"]}
    assert keys["model.weight"]["shape"] == [4, 16] and keys["model.weight"]["dtype"] == "float32"
    assert keys["model.weight"]["bytes"] == 4 * 16 * 4
    assert keys["meta.epoch"]["value"] == "1"
    assert "model.weight" in run("inspect", str(root)).stdout


def test_verify_exits_1_and_names_the_damaged_file(root):
    assert run("verify", str(root)).returncode == 0
    data_file = next((root / "step-000000000010").glob("data-*.bin"))
    raw = bytearray(data_file.read_bytes())
    raw[-1] ^= 0xFF
    data_file.write_bytes(bytes(raw))
    result = run("verify", str(root), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    bad = [c for c in report["checkpoints"] if not c["ok"]]
    assert [c["step"] for c in bad] == [10] and data_file.name in bad[0]["problems"][0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("verify", "{root}", "--step", "3"), "no checkpoint for step 3"),
        (("inspect", "{root}", "--step", "3"), "no committed checkpoint for step 3"),
        (("list", "{root}", "-o", "novalue"), "KEY=VALUE"),
        (("list", "nosuchproto://x"), "nosuchproto"),
    ],
)
def test_bad_input_gets_a_one_line_error_and_exit_2(root, args, needle):
    result = run(*(a.format(root=root) for a in args))
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr


# A root, a key, a value and a stray entry whose names clear the screen, retitle the window,
# start an 8-bit CSI, and ask rich for a link and an emoji: the reader's terminal obeys none.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x9b6n[link=https:e.x]x:warning:"  # no "/": a file name
SHOWN = r"\x1b[2J\x1b]0;pwned\x07\x9b6n[link=https:e.x]x:warning:"


@pytest.fixture
def hostile_root(tmp_path):
    root = tmp_path / f"run{HOSTILE}"
    Checkpointer(root, keep=None).save(5, {"model": torch.nn.Linear(2, 2), "meta": {HOSTILE: 1}})
    (root / f".tmp-{HOSTILE}").mkdir()  # as an interrupted save leaves one
    return root


def no_control_character_in(result):
    seen = result.stdout + result.stderr
    assert not any(c in seen for c in ("\x1b", "\x07", "\x9b")), seen
    return True


def test_names_under_a_root_reach_the_terminal_escaped(hostile_root):
    listed = run("list", str(hostile_root), "--all")
    assert listed.returncode == 0 and no_control_character_in(listed)
    assert f".tmp-{SHOWN}" in listed.stdout  # the stray entry, in the table of ignored ones
    inspected = run("inspect", str(hostile_root))
    assert inspected.returncode == 0 and no_control_character_in(inspected)
    assert f"meta.{SHOWN}" in inspected.stdout
    missing = run("inspect", str(hostile_root), "--step", "3")
    assert missing.returncode == 2 and no_control_character_in(missing)
    (line,) = missing.stderr.splitlines()
    assert line.startswith("error: no committed checkpoint for step 3") and SHOWN in line


def test_verify_shows_the_problems_of_a_damaged_checkpoint_escaped(hostile_root):
    data_file = next((hostile_root / "step-000000000005").glob("data-*.bin"))
    data_file.write_bytes(data_file.read_bytes()[:-1])
    result = run("verify", str(hostile_root))
    assert result.returncode == 1 and no_control_character_in(result)
    assert data_file.name in result.stdout and "damaged checkpoint" in result.stdout


def test_json_stays_json_with_the_names_as_they_are(hostile_root):
    listed = json.loads(run("list", str(hostile_root), "--all", "--json").stdout)
    assert listed["root"] == str(hostile_root)
    assert [i["name"] for i in listed["ignored"]] == [f".tmp-{HOSTILE}"]
    inspected = json.loads(run("inspect", str(hostile_root), "--json").stdout)
    assert f"meta.{HOSTILE}" in {k["key"] for k in inspected["keys"]}
