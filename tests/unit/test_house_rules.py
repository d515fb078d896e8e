"""The rules of the house (docs/maintainers/design.md), read from the imports of every module.

A rule broken on purpose in a copy of the package must be caught: the last test shows the check
can fail.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import preemptible

ROOT = Path(__file__).resolve().parents[2]
# Where adapters and examples may import from: the public face, and the CLI the demo prints with.
PUBLIC = ("preemptible", "preemptible.errors", "preemptible.lightning", "preemptible.accelerate",
          "preemptible.transformers", "preemptible.distributed", "preemptible.cli")  # fmt: skip
RULES = (  # (files under, imports that start with any of these are forbidden)
    ("preemptible/queue", ("preemptible.runtime", "preemptible.checkpoint", "torch",
                           "preemptible.distributed", "preemptible.lightning",
                           "preemptible.accelerate", "preemptible.transformers")),
    ("preemptible/checkpoint", ("preemptible.runtime", "preemptible.lightning",
                                "preemptible.accelerate", "preemptible.transformers")),
    ("preemptible/queue/service", ("preemptible.sim",)),
    # The SDK never imports the queue service; the core imports only itself and the errors.
    ("preemptible/runtime", ("preemptible.queue.service",)),
    ("preemptible/checkpoint", ("preemptible.queue", "preemptible.sim")),
    ("preemptible/queue/core", ("preemptible.queue.service", "preemptible.queue.scheduler_loop",
                                "preemptible.queue.export", "preemptible.sim", "preemptible.cli")),
    # The core is pure: no clock, no randomness, no files, sockets, databases, threads or processes.
    ("preemptible/queue/core", ("time", "datetime", "random", "os", "io", "shutil", "tempfile",
                                "socket", "http", "urllib", "sqlite3", "threading", "asyncio",
                                "subprocess", "multiprocessing", "concurrent", "signal")),
)  # fmt: skip
ADAPTERS = ("preemptible/lightning.py", "preemptible/accelerate.py", "preemptible/transformers.py",
            "examples")  # fmt: skip


def imports(path: Path, root: Path) -> list[tuple[str, str]]:
    """(module, name) for every import in a file; name is "" for `import module`."""
    found: list[tuple[str, str]] = []
    package = ".".join(path.relative_to(root).parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found += [(module, alias.name) for alias in node.names]
    return found


def broken_rules(root: Path) -> list[str]:
    """Every import in `root` that breaks a rule, as "file: module.name (the rule)"."""
    broken = []
    for under, forbidden in RULES:
        for path in sorted((root / under).rglob("*.py")):
            for module, name in imports(path, root):
                full = f"{module}.{name}" if name else module
                if any(full == f or full.startswith(f + ".") for f in forbidden):
                    broken.append(f"{path.relative_to(root)}: {full} (not from {under})")
    for place in ADAPTERS:
        paths = [root / place] if place.endswith(".py") else sorted((root / place).rglob("*.py"))
        for path in paths:
            for module, name in imports(path, root):
                if not (module == "preemptible" or module.startswith("preemptible.")):
                    continue
                public = module in PUBLIC or module.startswith("preemptible.cli.")
                private = any(part.startswith("_") for part in f"{module}.{name}".split("."))
                unexported = module == "preemptible" and name not in preemptible.__all__
                if not public or private or unexported:
                    what = f"{module}.{name}" if name else module
                    broken.append(f"{path.relative_to(root)}: {what} (not a public name)")
    return broken


def import_circles(root: Path) -> list[list[str]]:
    """Groups of the package's modules that import one another, even inside a function."""
    paths = {}
    for path in (root / "preemptible").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {
        name: {f"{m}.{n}" if f"{m}.{n}" in paths else m for m, n in imports(path, root)}
        & paths.keys() - {name}
        for name, path in paths.items()
    }
    reach = {name: set(targets) for name, targets in graph.items()}
    changed = True
    while changed:  # transitive closure; the package is a hundred modules
        changed = False
        for seen in reach.values():
            more = set().union(*(reach[t] for t in seen)) - seen
            if more:
                seen |= more
                changed = True
    circles = {frozenset(n for n in reach[name] if name in reach[n]) for name in reach}
    return sorted(sorted(c) for c in circles if c)


def names_defined_twice(root: Path) -> dict[str, list[str]]:
    """Classes and type aliases (a capitalised name bound at module level) that two modules
    of the package define: a newcomer must never have to ask which `Notice` is meant."""
    where: dict[str, list[str]] = {}
    for path in sorted((root / "preemptible").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                name = node.name
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if len(targets) != 1 or not isinstance(targets[0], ast.Name):
                    continue
                name = targets[0].id
                if not name[:1].isupper() or name.isupper():
                    continue  # a constant, not a type
            else:
                continue
            where.setdefault(name, []).append(str(path.relative_to(root)))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def env_names_spelled_out(root: Path) -> list[str]:
    """`PREEMPTIBLE_*` variable names written as a string outside `_env_names.py`, where the
    manager and the SDK both take them from."""
    found = []
    for path in sorted((root / "preemptible").rglob("*.py")):
        if path.name == "_env_names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(r"PREEMPTIBLE_[A-Z0-9_]+", value):
                found.append(f"{path.relative_to(root)}: {value}")
    return found


# What prints by itself, bypassing `preemptible/cli/_common.py` (which escapes every control
# character of what it prints): print, click's echo, a rich console or table of rich's own,
# the standard streams written to.
TERMINAL_WRITES = ("print", "typer.echo", "typer.secho", "click.echo", "click.secho",
                   "rich.print", "sys.stdout.write", "sys.stderr.write", "sys.stdout.buffer.write",
                   "sys.stderr.buffer.write", "os.write")  # fmt: skip


def terminal_writes(root: Path) -> list[str]:
    """Calls in `preemptible/cli/` that write to the terminal without `_common.py`, as
    "file:line: call"."""
    found = []
    for path in sorted((root / "preemptible/cli").rglob("*.py")):
        if path.name == "_common.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            call = ast.unparse(node.func)
            if call in TERMINAL_WRITES or call.rsplit(".", 1)[-1] in ("Console", "Table"):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {call}")
    return found


def test_every_rule_of_the_house_holds():
    assert broken_rules(ROOT) == []


def test_no_two_modules_import_each_other():
    assert import_circles(ROOT) == []


def test_one_class_per_name():
    assert names_defined_twice(ROOT) == {}


def test_every_environment_variable_is_named_in_one_place():
    assert env_names_spelled_out(ROOT) == []


def test_the_cli_writes_to_the_terminal_only_through_its_escaping_helpers():
    assert terminal_writes(ROOT) == []


def test_each_rule_broken_on_purpose_is_caught(tmp_path):
    for place in ("preemptible", "examples"):
        shutil.copytree(
            ROOT / place, tmp_path / place, ignore=shutil.ignore_patterns("__pycache__")
        )
    breaks = {
        "preemptible/queue/core/model.py": "import torch\n",
        "preemptible/queue/core/cycle.py": "from time import monotonic\n",
        "preemptible/queue/core/quota.py": "from preemptible.queue.service import store\n",
        "preemptible/runtime/sidecar.py": "from preemptible.queue.service import api\n",
        "preemptible/queue/service/views.py": "from ...sim import engine\n",
        "preemptible/checkpoint/records.py": "from preemptible.runtime import context\n",
        "preemptible/accelerate.py": "from preemptible.checkpoint.stats import CostTracker\n",
        "examples/plain_pytorch.py": "from preemptible import _lazy\n",
    }
    for file, line in breaks.items():
        path = tmp_path / file
        path.write_text(path.read_text() + line)
    found = broken_rules(tmp_path)
    assert sorted(entry.split(":")[0] for entry in found) == sorted(breaks)
    edge = tmp_path / "preemptible/queue/service/http_edge.py"
    edge.write_text(edge.read_text() + "from preemptible.queue.service import api\n")
    circle = ["preemptible.queue.service.api", "preemptible.queue.service.http_edge"]
    assert circle in import_circles(tmp_path)
    api = tmp_path / "preemptible/queue/service/api.py"
    api.write_text(api.read_text() + 'Tier = Literal["critical", "high", "normal", "low"]\n')
    queue_link = tmp_path / "preemptible/runtime/queue_link.py"
    queue_link.write_text(queue_link.read_text() + 'OLD_URL_ENV = "PREEMPTIBLE_URL"\n')
    assert env_names_spelled_out(tmp_path) == ["preemptible/runtime/queue_link.py: PREEMPTIBLE_URL"]
    assert names_defined_twice(tmp_path) == {
        "Tier": ["preemptible/queue/core/model.py", "preemptible/queue/service/api.py"]
    }
    writes = {
        "preemptible/cli/queue.py": "typer.echo(job['name'])\n",
        "preemptible/cli/ckpt.py": "rich.table.Table(title=root)\n",
        "preemptible/cli/sim.py": "sys.stdout.write(note)\n",
    }
    for file, line in writes.items():
        path = tmp_path / file
        path.write_text(path.read_text() + line)
    found = {e.split(":")[0]: e.rsplit(": ", 1)[1] for e in terminal_writes(tmp_path)}
    assert found == {
        "preemptible/cli/ckpt.py": "rich.table.Table",
        "preemptible/cli/queue.py": "typer.echo",
        "preemptible/cli/sim.py": "sys.stdout.write",
    }
