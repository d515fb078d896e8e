"""What `pip install preemptible` costs a training image: the installed size of the base install
against `[all]`, the time `import preemptible` takes, and the sidecar's start time and memory.

    python benchmarks/install_size.py --repeat 7
    python benchmarks/install_size.py --pyproject OLD/pyproject.toml   # another dependency list

Sizes are summed from the RECORD of each installed distribution in the dependency closure of
the base requirements (then of each extra) of pyproject.toml, as installed in this environment:
what pip would install in a fresh one, at the versions installed here, without building two
environments. A distribution missing here is named, and counted as zero. Times are medians of
fresh processes; the sidecar's start is from its launch to its start line, when /metrics
answers, and its memory the resident set (VmRSS) then.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.k8s_api, the local Kubernetes API server
START = re.compile(r"/metrics on http://127\.0\.0\.1:(\d+)")  # the sidecar's start line
MIB = 2**20


def name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def requirements(project: dict[str, Any], extra: str | None) -> list[Requirement]:
    """The requirements of the base install, or of one extra, self-references expanded."""
    listed = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    found = []
    for text in listed:
        req = Requirement(text)
        if name(text) == "preemptible":
            found += [r for each in sorted(req.extras) for r in requirements(project, each)]
        else:
            found.append(req)
    return found


def closure(reqs: list[Requirement], missing: set[str]) -> set[str]:
    """The distributions `reqs` install, their own requirements followed, as installed here."""
    seen: set[str] = set()
    todo = [(name(str(r)), set(r.extras)) for r in reqs]
    while todo:
        dist_name, extras = todo.pop()
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            missing.add(dist_name)
            continue
        if dist_name in seen and not extras:
            continue
        seen.add(dist_name)
        for text in dist.requires or []:
            req = Requirement(text)
            wanted = req.marker is None or any(
                req.marker.evaluate({"extra": e}) for e in (extras or {""})
            )
            if wanted:
                todo.append((name(text), set(req.extras)))
    return seen


def installed_bytes(dists: set[str]) -> int:
    files: set[Path] = set()
    for dist_name in dists:
        dist = importlib.metadata.distribution(dist_name)
        files |= {Path(str(dist.locate_file(f))) for f in dist.files or []}
    return sum(f.stat().st_size for f in files if f.is_file())


def sizes(pyproject: Path) -> list[tuple[str, int, int, list[str]]]:
    """(what, bytes, distributions, missing) for the base, the base without torch, each extra
    added to the base, and `[all]`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = [e for e in project["optional-dependencies"] if e not in ("all", "dev")]
    rows = []
    base_missing: set[str] = set()
    base = closure(requirements(project, None), base_missing)
    torch_only = closure([Requirement("torch")], set()) - closure(
        [r for r in requirements(project, None) if name(str(r)) != "torch"], set()
    )
    rows.append(("base", installed_bytes(base), len(base), sorted(base_missing)))
    no_torch = base - torch_only
    rows.append(("base without torch", installed_bytes(no_torch), len(no_torch), []))
    for extra in [*extras, "all"] if "all" in project["optional-dependencies"] else extras:
        missing: set[str] = set()
        dists = base | closure(requirements(project, extra), missing)
        rows.append((f"[{extra}]", installed_bytes(dists), len(dists), sorted(missing)))
    return rows


def import_seconds(statement: str, repeat: int) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    # Run outside the repository: `python -c` puts its working directory first on the path.
    times = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, cwd=tempfile.gettempdir()).stdout)
        for _ in range(repeat)
    ]  # fmt: skip
    return statistics.median(times)


def sidecar_start(repeat: int, with_k8s: bool) -> tuple[float, float]:
    """(seconds from launch to the start line, VmRSS in MiB then), medians. With `with_k8s`
    it patches pod annotations too, on the local Kubernetes API server of the tests
    (`tests/k8s_api.py`): the kubernetes client is loaded."""
    starts, rss = [], []
    cli = Path(sys.executable).with_name("preemptible")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        env = dict(os.environ)
        flags = ["--no-annotations"]
        if with_k8s:
            from tests.k8s_api import fake_cluster

            cluster = stack.enter_context(fake_cluster(Path(tmp) / "k8s"))
            env |= {**cluster.env, "POD_NAME": "trainer-0",
                    "PREEMPTIBLE_SERVICE_ACCOUNT_DIR": str(cluster.service_account_dir)}  # fmt: skip
            flags = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [str(cli), "sidecar", *flags, "--metrics-port", "0",
                 "--cost-file", f"{tmp}/cost.json"],
                stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
            )  # fmt: skip
            assert proc.stderr is not None
            for line in proc.stderr:
                if START.search(line):
                    starts.append(time.perf_counter() - t0)
                    break
            status = Path(f"/proc/{proc.pid}/status").read_text()
            found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
            assert found is not None, "the sidecar did not start"
            rss.append(int(found[1]) / 1024)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    return statistics.median(starts), statistics.median(rss)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7, help="fresh processes per time")
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml",
                        help="the dependency lists to size")  # fmt: skip
    args = parser.parse_args()

    print("| install | installed size | distributions | not installed here |")
    print("|---|---:|---:|---|")
    for what, nbytes, count, missing in sizes(args.pyproject):
        print(f"| `{what}` | {nbytes / MIB:,.0f} MiB | {count} | {', '.join(missing) or '-'} |")
    print()
    print(f"| start-up ({sys.executable}, median of {args.repeat}) | value |")
    print("|---|---:|")
    for statement in (
        "import preemptible",
        "import preemptible.cli",
        "from preemptible import Checkpointer",
    ):
        print(f"| `{statement}` | {import_seconds(statement, args.repeat) * 1000:.0f} ms |")
    if not shutil.which("preemptible", path=str(Path(sys.executable).parent)):
        return
    for with_k8s in (False, True):
        if with_k8s and importlib.util.find_spec("kubernetes") is None:
            continue
        how = "pod annotations and /metrics" if with_k8s else "`--no-annotations`"
        start_s, rss_mib = sidecar_start(args.repeat, with_k8s)
        print(f"| `preemptible sidecar`, {how}: launch to /metrics | {start_s * 1000:.0f} ms |")
        print(f"| `preemptible sidecar`, {how}: resident memory (VmRSS) | {rss_mib:.0f} MiB |")


if __name__ == "__main__":
    main()
