"""What is inside a checkpoint, read from its index alone (no array data is loaded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from preemptible.checkpoint.arrays import ArrayEntry
from preemptible.checkpoint.serialize import TAG


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf:
    """One value of the saved state: an array (dtype, shape, bytes) or a Python value."""

    key: str
    kind: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    nbytes: int = 0
    value: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "bytes": self.nbytes,
            "value": self.value,
        }


def leaves(tree: Any, entries: list[ArrayEntry], prefix: str = "") -> list[Leaf]:
    """Flatten the state tree into dotted keys, arrays described by their index entries."""
    out: list[Leaf] = []
    _walk(tree, entries, prefix, out)
    return out


def _walk(node: Any, entries: list[ArrayEntry], key: str, out: list[Leaf]) -> None:
    if isinstance(node, list):
        for i, v in enumerate(node):
            _walk(v, entries, f"{key}[{i}]", out)
        return
    if not isinstance(node, dict):
        out.append(Leaf(key=key, kind=type(node).__name__, value=_short(node)))
        return
    tag = node.get(TAG)
    if tag is None:
        for k, v in node.items():
            _walk(v, entries, f"{key}.{k}" if key else k, out)
    elif tag in ("tensor", "ndarray", "npscalar"):
        e = entries[node["id"]]
        kind = {"tensor": "tensor", "ndarray": "ndarray", "npscalar": "numpy scalar"}[tag]
        out.append(Leaf(key=key, kind=kind, dtype=e.dtype, shape=e.shape, nbytes=e.nbytes))
    elif tag == "dtensor":
        out.append(Leaf(key=key, kind="dtensor", value="sharded (torch.distributed.checkpoint)"))
    elif tag in ("tuple",):
        for i, v in enumerate(node["items"]):
            _walk(v, entries, f"{key}[{i}]", out)
    elif tag == "dict":
        for k, v in node["items"]:
            _walk(v, entries, f"{key}[{_short(k)}]", out)
    else:
        out.append(Leaf(key=key, kind=str(tag), value=_short(node)))


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
