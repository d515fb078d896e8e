"""The extras: `preemptible/_extras.py` agrees with pyproject.toml, a missing one is named with
its `pip install` line, and the CLI loads none of them to start.

The commands run in a subprocess whose extras are hidden (their modules set to None in
`sys.modules`, which makes an import fail as if they were not installed); the real base install
is `tests/integration/test_install.py`.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from preemptible import BackendNotInstalledError, PreemptibleError
from preemptible._extras import EXTRAS, extra_for_url, require

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What the CLI may not import to start: the extras' packages (but pydantic, which typer needs
# anyway) and torch.
NOT_AT_START = sorted(
    {module for modules in EXTRAS.values() for module in modules} - {"pydantic"} | {"torch"}
)
HIDE = ("fastapi", "uvicorn", "platformdirs", "matplotlib", "s3fs", "kubernetes", "yaml")


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def run_hidden(*args: str, hide: tuple[str, ...] = HIDE) -> subprocess.CompletedProcess[str]:
    """`preemptible ARGS` with the modules `hide` made unimportable."""
    code = (
        "import sys\n"
        f"for name in {hide!r}: sys.modules[name] = None\n"
        "from preemptible.cli import main\n"
        "main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "300", "HOME": "/tmp"},
    )


def test_the_table_of_extras_is_the_one_of_pyproject():
    declared = PYPROJECT["optional-dependencies"]
    extras = {name: reqs for name, reqs in declared.items() if name not in ("all", "dev")}
    assert set(extras) == set(EXTRAS)
    for name, requirements in extras.items():
        assert {_name(r) for r in requirements} == set(EXTRAS[name].values()), name
    [everything] = [Requirement(r) for r in declared["all"] if _name(r) == "preemptible"]
    assert everything.extras == set(EXTRAS)
    [tested] = [Requirement(r) for r in declared["dev"] if _name(r) == "preemptible"]
    assert tested.extras == set(EXTRAS) - {"nvml"}  # nvml: see pyproject.toml


def test_each_module_of_the_table_comes_from_the_distribution_it_names():
    installed = importlib.metadata.packages_distributions()
    for extra, modules in EXTRAS.items():
        for module, dist in modules.items():
            if module in installed:  # an extra not installed here is not checked
                assert dist in {_name(d) for d in installed[module]}, (extra, module)


def test_no_extra_is_a_dependency_of_the_base_install():
    base = {_name(r) for r in PYPROJECT["dependencies"]}
    for extra, modules in EXTRAS.items():
        assert not base & set(modules.values()), extra


def test_a_missing_extra_is_named_with_its_pip_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(BackendNotInstalledError) as caught:
        require("queue", "preemptible queue serve")
    assert str(caught.value) == (
        "preemptible queue serve needs the queue extra (uvicorn not installed): "
        "pip install 'preemptible[queue]'"
    )
    assert caught.value.extra == "queue"
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, PreemptibleError)
    require("sim", "the simulator's charts")  # installed here: nothing raised


@pytest.mark.parametrize(
    ("url", "extra"),
    [
        ("s3://bucket/run", "s3"),
        ("S3A://bucket/run", "s3"),
        ("simplecache::s3://bucket/run", "s3"),
        ("gs://bucket/run", None),
        ("memory://run", None),
        ("/data/run", None),
    ],
)
def test_the_extra_of_a_url_is_the_one_of_its_scheme(url, extra):
    assert extra_for_url(url) == extra


def test_an_s3_root_without_s3fs_names_the_s3_extra():
    # In a process of its own: fsspec keeps a filesystem class once it has imported it.
    code = (
        "import sys\n"
        "sys.modules['s3fs'] = None\n"
        "from preemptible import BackendNotInstalledError, Checkpointer\n"
        "try:\n"
        "    Checkpointer('s3://bucket/run')\n"
        "except BackendNotInstalledError as e:\n"
        "    print(e.extra, e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("s3 no filesystem installed for 's3://bucket/run' (")
    assert done.stdout.rstrip().endswith("): pip install 'preemptible[s3]'")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("queue", "serve", "--config", "examples/queue.toml"),
            "preemptible queue serve needs the queue extra (fastapi, uvicorn, platformdirs not "
            "installed): pip install 'preemptible[queue]'",
        ),
        (
            ("queue", "doctor"),
            "preemptible queue doctor needs the queue extra (fastapi, uvicorn, platformdirs not "
            "installed): pip install 'preemptible[queue]'",
        ),
        (
            ("queue", "export", "--to", "kueue", "examples/queue.toml"),
            "preemptible queue export --to kueue needs the k8s extra (pyyaml not installed): "
            "pip install 'preemptible[k8s]'",
        ),
        (
            ("sim", "--trace", "tests/unit/sim/data/small_trace.csv", "--config",
             "tests/unit/sim/data/small_queue.toml", "--html", "/tmp/never.html"),
            "preemptible sim --html needs the sim extra (matplotlib not installed): "
            "pip install 'preemptible[sim]'",
        ),
    ],
    ids=["queue-serve", "queue-doctor", "export-kueue", "sim-html"],
)  # fmt: skip
def test_a_command_whose_extra_is_missing_says_which_and_exits_2(args, line):
    done = run_hidden(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"error: {line}"]
    assert done.stdout == ""


def test_the_commands_of_the_base_install_work_without_the_extras(tmp_path):
    assert run_hidden("--help").returncode == 0
    assert run_hidden("ckpt", "list", str(tmp_path)).returncode == 0
    slurm = run_hidden("queue", "export", "--to", "slurm", "examples/queue.toml")
    assert slurm.returncode == 0 and "PartitionName=" in slurm.stdout, slurm.stderr
    sim = run_hidden(
        "sim", "--trace", "tests/unit/sim/data/small_trace.csv", "--config",
        "tests/unit/sim/data/small_queue.toml", "--policy", "fifo", "--quiet",
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr


def test_starting_the_cli_imports_no_extra_and_no_torch():
    code = f"import sys, preemptible.cli\nprint(sorted(set({NOT_AT_START!r}) & set(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
