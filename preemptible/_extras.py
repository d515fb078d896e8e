"""The package's extras, and the one error a feature gives when its extra is missing.

`pip install preemptible` installs what a training job needs; the queue server, the
simulator's charts, S3 and the Kubernetes client are extras, so that a training image does not
carry a web server and a plotting library. A feature that needs one calls `require` before it
imports the extra's packages: the user then reads the `pip install` line to run, rather than a
`ModuleNotFoundError` from deep inside. Asking `importlib.util.find_spec` looks for the modules
without importing them, so the check costs nothing when they are there.

The alternative, importing each package and catching `ImportError` where it is used, words the
same error in every place that imports one; `tests/unit/test_extras.py` checks this table
against `pyproject.toml`.
"""

from __future__ import annotations

import importlib.util
import re

from preemptible.errors import BackendNotInstalledError

EXTRAS: dict[str, dict[str, str]] = {
    "queue": {"fastapi": "fastapi", "uvicorn": "uvicorn", "pydantic": "pydantic",
              "platformdirs": "platformdirs"},
    "sim": {"matplotlib": "matplotlib"},
    "s3": {"s3fs": "s3fs"},
    "k8s": {"kubernetes": "kubernetes", "yaml": "pyyaml"},
    "nvml": {"pynvml": "nvidia-ml-py"},
    "lightning": {"lightning": "lightning"},
    "accelerate": {"accelerate": "accelerate"},
    "transformers": {"transformers": "transformers"},
    "oracle": {"ortools": "ortools"},
}  # fmt: skip
"""Each extra's packages: the module imported, and the distribution pip installs it from."""

_SCHEMES = {"s3": "s3", "s3a": "s3"}
"""URL schemes whose fsspec backend an extra installs."""


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The distributions of `extra` (of its `modules` alone, if given) whose module cannot be
    found, in the table's order."""
    wanted = EXTRAS[extra] if modules is None else {m: EXTRAS[extra][m] for m in modules}
    return [dist for module, dist in wanted.items() if not _found(module)]


def require(extra: str, what: str, *, modules: tuple[str, ...] | None = None) -> None:
    """Return if every package of `extra` is installed.

    Args:
        extra: a key of `EXTRAS`.
        what: what needs it, as the message starts ("preemptible queue serve").
        modules: the modules of the extra that `what` imports, when it needs only some
            (the Kueue export needs PyYAML, not the kubernetes client).

    Raises:
        BackendNotInstalledError: a package is missing; the message names the `pip install`
            line and the error's ``extra`` the extra.
    """
    gone = missing(extra, modules)
    if gone:
        raise BackendNotInstalledError(
            f"{what} needs the {extra} extra ({', '.join(gone)} not installed): "
            f"{install_line(extra)}",
            extra=extra,
        )


def install_line(extra: str) -> str:
    """``pip install 'preemptible[EXTRA]'``: quoted, as shells other than bash need it."""
    return f"pip install 'preemptible[{extra}]'"


def extra_for_url(url: str) -> str | None:
    """The extra that installs the fsspec backend of `url` (``s3`` for s3://...), if one does.

    Each scheme of a chained URL (``simplecache::s3://...``) is looked at.
    """
    for scheme in re.findall(r"(?:^|::)([a-z][a-z0-9+.-]*)://", url.lower()):
        if scheme in _SCHEMES:
            return _SCHEMES[scheme]
    return None


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, a module set to None
        return False
