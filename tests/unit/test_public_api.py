"""The top-level API: `__all__`, the lazy `_EXPORTS` and the TYPE_CHECKING imports agree."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys

import pytest

import preemptible
import preemptible.checkpoint
import preemptible.errors

LAZY = [preemptible, preemptible.checkpoint]  # the packages that resolve names on first use


def _type_checking_imports(package: object) -> dict[str, str]:
    """Name -> module of every import under `if TYPE_CHECKING:` in the package's __init__."""
    tree = ast.parse(inspect.getsource(package))
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


@pytest.mark.parametrize("package", LAZY, ids=lambda p: p.__name__)
def test_all_exports_and_type_checking_imports_name_the_same_things(package):
    exports = package._EXPORTS
    assert _type_checking_imports(package) == exports
    eager = ["__version__"] if package is preemptible else []
    assert sorted(package.__all__) == sorted([*exports, *eager])
    assert len(set(package.__all__)) == len(package.__all__)


@pytest.mark.parametrize("package", LAZY, ids=lambda p: p.__name__)
def test_every_exported_name_resolves_to_the_object_of_its_module(package):
    for name, module in package._EXPORTS.items():
        assert getattr(package, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        package.nothing  # noqa: B018


def test_the_version_is_a_string():
    assert isinstance(preemptible.__version__, str)


def test_every_error_of_the_tree_is_exported_and_derives_from_the_root():
    missing = set(preemptible.errors.__all__) - set(preemptible.__all__)
    assert not missing, f"errors not exported from preemptible: {sorted(missing)}"
    for name in preemptible.errors.__all__:
        error = getattr(preemptible, name)
        assert issubclass(error, preemptible.PreemptibleError | preemptible.PreemptibleWarning)


@pytest.mark.parametrize(
    "module",
    [
        "preemptible.runtime.sidecar",
        "preemptible.runtime.reporters",
        "preemptible.runtime.queue_link",
        "preemptible.sim",
    ],
)
def test_the_parts_that_never_touch_a_tensor_do_not_import_torch(module):
    # The sidecar runs beside every trainer: importing torch cost it 2.4 s and its memory.
    code = f"import sys, {module}\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_the_errors_from_the_top_level_does_not_import_torch():
    code = (
        "import sys\n"
        "from preemptible import PreemptibleError, ConfigError, BackgroundSaveError\n"
        "assert issubclass(BackgroundSaveError, PreemptibleError)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
