"""The top-level API: `__all__`, the lazy `_EXPORTS` and the TYPE_CHECKING imports agree."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys

import preemptible
import preemptible.errors


def _type_checking_imports() -> dict[str, str]:
    """Name -> module of every import under `if TYPE_CHECKING:` in preemptible/__init__.py."""
    tree = ast.parse(inspect.getsource(preemptible))
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1, "expected one `if TYPE_CHECKING:` block"
    names: dict[str, str] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom) and node.module, ast.dump(node)
        for alias in node.names:
            assert alias.asname is None, f"{alias.name} is imported under another name"
            names[alias.name] = node.module
    return names


def test_all_exports_and_type_checking_imports_name_the_same_things():
    exports = preemptible._EXPORTS
    assert _type_checking_imports() == exports
    assert sorted(preemptible.__all__) == sorted([*exports, "__version__"])
    assert len(set(preemptible.__all__)) == len(preemptible.__all__)


def test_every_exported_name_resolves_to_the_object_of_its_module():
    for name, module in preemptible._EXPORTS.items():
        assert getattr(preemptible, name) is getattr(importlib.import_module(module), name), name
    assert isinstance(preemptible.__version__, str)


def test_every_error_of_the_tree_is_exported_and_derives_from_the_root():
    missing = set(preemptible.errors.__all__) - set(preemptible.__all__)
    assert not missing, f"errors not exported from preemptible: {sorted(missing)}"
    for name in preemptible.errors.__all__:
        error = getattr(preemptible, name)
        assert issubclass(error, preemptible.PreemptibleError | preemptible.PreemptibleWarning)


def test_importing_the_errors_from_the_top_level_does_not_import_torch():
    code = (
        "import sys\n"
        "from preemptible import PreemptibleError, ConfigError, BackgroundSaveError\n"
        "assert issubclass(BackgroundSaveError, PreemptibleError)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
