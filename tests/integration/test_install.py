"""`pip install preemptible` as a training image gets it: the wheel, with the base dependencies
only, in a fresh virtual environment.

The wheel is built from a copy of the sources (so nothing is written into the work tree) with
`pip wheel --no-build-isolation`, and installed with pip's own resolver from the indexes pip is
configured with. Torch alone is not installed again, which would take a minute and a GB: as a
training image's system torch would be, it comes from outside the environment, a folder of
links to this environment's torch and the packages only torch needs, on `PYTHONPATH`. pip counts
what is on the path as installed, so it installs every other base dependency itself, from the
wheel's own metadata: what a user gets, less torch. Without `PYTHONPATH` the environment has no
torch at all, which is how the sidecar is started.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
EXTRA_DISTRIBUTIONS = ("fastapi", "uvicorn", "starlette", "platformdirs", "matplotlib", "s3fs",
                       "kubernetes", "pyyaml")  # fmt: skip
SIDECAR_RSS_LIMIT_MIB = 150  # 39 MiB measured (docs/evaluation/benchmarks.md)
START = re.compile(r"reporting to /metrics on http://127\.0\.0\.1:(\d+)")


@dataclass(frozen=True)
class BaseInstall:
    venv: Path
    torch_path: Path
    """The folder of links that gives the environment torch, on PYTHONPATH."""

    def run(
        self, *args: str, torch: bool = True, timeout: float = 120, cwd: Path = REPO
    ) -> subprocess.CompletedProcess[str]:
        """`args` in the environment; its `preemptible` or `python` when `args[0]` names one."""
        return subprocess.run(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            env=self.env(torch=torch),
            cwd=cwd,
            timeout=timeout,
        )

    def env(self, *, torch: bool) -> dict[str, str]:
        """This process's environment (pip's settings, OpenBLAS's) in the new venv alone."""
        ours = str(Path(sys.executable).parent)
        path = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":") if p != ours]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env |= {"PATH": ":".join([str(self.venv / "bin"), *path]), "COLUMNS": "300"}
        if torch:
            env["PYTHONPATH"] = str(self.torch_path)
        return env


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _closure(names: list[str]) -> set[str]:
    """The distributions `names` need, themselves included, as installed in this environment."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in importlib.metadata.distribution(name).requires or []:
            marker = Requirement(requirement).marker
            if marker is None or marker.evaluate({"extra": ""}):
                todo.append(_name(requirement))
    return seen


def _link_torch(into: Path, base: list[str]) -> None:
    """Links to torch and each package that only torch needs (not one of the base's own)."""
    into.mkdir()
    others = _closure([name for name in base if name != "torch"])
    for name in sorted(_closure(["torch"]) - others):
        dist = importlib.metadata.distribution(name)
        tops = {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}
        for top in tops - {"__pycache__"}:
            if not top.endswith(".pth"):  # setuptools' distutils hook: not for a folder
                (into / top).symlink_to(Path(str(dist.locate_file(top))))


def _base_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = archive.read(name).decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    return [_name(r) for r in requires if Requirement(r).marker is None]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> BaseInstall:
    root = tmp_path_factory.mktemp("install")
    # 1. The wheel, from a copy of what it is built from.
    src = root / "src"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(REPO / "preemptible", src / "preemptible",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist")]
    subprocess.run([*build, str(src)], check=True, capture_output=True, timeout=120)
    [wheel] = (root / "dist").glob("preemptible-*.whl")
    # 2. A fresh environment; torch from outside it.
    install = BaseInstall(root / "venv", root / "torch")
    subprocess.run([sys.executable, "-m", "venv", str(install.venv)], check=True, timeout=120)
    _link_torch(install.torch_path, _base_requirements(wheel))
    done = install.run("python", "-m", "pip", "install", "-q", str(wheel), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return install


def test_the_base_install_has_the_sdk_and_no_extra(base: BaseInstall) -> None:
    done = base.run("python", "-m", "pip", "list", "--format=freeze", torch=False)
    installed = {_name(line.split("==")[0]) for line in done.stdout.splitlines()}
    assert {"preemptible", "numpy", "fsspec", "crc32c", "typer", "httpx"} <= installed
    assert not installed & set(EXTRA_DISTRIBUTIONS)
    assert "torch" not in installed  # it comes from PYTHONPATH alone
    no_torch = base.run("python", "-c", "import torch", torch=False)
    assert no_torch.returncode == 1 and "No module named 'torch'" in no_torch.stderr


def test_a_training_job_saves_and_its_checkpoints_list(base: BaseInstall, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    trained = base.run("python", "examples/plain_pytorch.py", "--steps", "20", "--every", "5",
                       "--sync", "--dir", str(ckpt))  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    listed = base.run("preemptible", "ckpt", "list", "--json", str(ckpt))
    assert listed.returncode == 0, listed.stderr
    steps = [entry["step"] for entry in json.loads(listed.stdout)["checkpoints"]]
    assert steps and steps == sorted(steps) and steps[-1] == 19, steps  # saved at 4, 9, 14, 19


@pytest.mark.parametrize(
    ("args", "command", "extra"),
    [
        (("queue", "serve", "--config", "examples/queue.toml"), "queue serve", "queue"),
        (("queue", "export", "--to", "kueue", "examples/queue.toml"),
         "queue export --to kueue", "k8s"),
        (("sim", "--trace", "tests/unit/sim/data/small_trace.csv", "--config",
          "tests/unit/sim/data/small_queue.toml", "--plot", "charts"), "sim --plot", "sim"),
    ],
    ids=["queue-serve", "export-kueue", "sim-plot"],
)  # fmt: skip
def test_a_command_that_needs_an_extra_says_its_pip_install_line(
    base: BaseInstall, args: tuple[str, ...], command: str, extra: str
) -> None:
    done = base.run("preemptible", *args, torch=False)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: preemptible {command} needs the {extra} extra (")
    assert line.endswith(f" not installed): pip install 'preemptible[{extra}]'")


def test_importing_the_queue_service_names_the_queue_extra(base: BaseInstall) -> None:
    code = (
        "from preemptible import BackendNotInstalledError\n"
        "try:\n"
        "    import preemptible.queue.service.app\n"
        "except BackendNotInstalledError as e:\n"
        "    print(e.extra, e)\n"
    )
    done = base.run("python", "-c", code, torch=False)
    said = done.stdout.strip()
    assert said.startswith(
        "queue the queue manager (preemptible.queue.service) needs the queue extra (fastapi, "
    ), done.stderr
    assert said.endswith(" not installed): pip install 'preemptible[queue]'")


def test_the_sidecar_starts_without_torch_and_serves_metrics(
    base: BaseInstall, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [str(base.venv / "bin" / "preemptible"), "sidecar", "--no-annotations",
         "--metrics-port", "0", "--cost-file", str(tmp_path / "cost.json")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=base.env(torch=False),
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr or []:
            lines.append(line)

    def started() -> re.Match[str] | None:
        assert proc.poll() is None, "".join(lines)
        return next(filter(None, map(START.search, list(lines))), None)

    threading.Thread(target=read, daemon=True).start()
    try:
        port = wait_until(started, "the sidecar's start line", describe=lambda: "".join(lines))[1]
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
        rss = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{proc.pid}/status").read_text(), re.M)
        assert rss is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert int(rss[1]) / 1024 < SIDECAR_RSS_LIMIT_MIB, f"{rss[1]} kB"
