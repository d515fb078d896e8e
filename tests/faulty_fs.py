"""An fsspec filesystem that fails writes on purpose: ``faulty://`` over an in-memory store.

``FaultPlan.fail_after_bytes`` counts bytes written through any file or ``pipe_file``; the
write that crosses it raises ``OSError(errno)`` (ENOSPC by default), as a full disk or a dropped
connection would. Everything else behaves like ``memory://``.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

import fsspec
from fsspec.implementations.memory import MemoryFileSystem


@dataclass
class FaultPlan:
    fail_after_bytes: int | None = None
    errno: int = errno.ENOSPC
    written: int = 0
    failures: int = 0

    def charge(self, nbytes: int) -> None:
        if self.fail_after_bytes is not None and self.written + nbytes > self.fail_after_bytes:
            self.failures += 1
            raise OSError(self.errno, os.strerror(self.errno))
        self.written += nbytes


PLAN = FaultPlan()


class _FaultyFile:
    def __init__(self, inner):
        self._inner = inner

    def write(self, data) -> int:
        PLAN.charge(len(memoryview(data).cast("B")))
        return self._inner.write(data)

    def close(self) -> None:
        PLAN.charge(0)  # the commit itself can fail too (fail_after_bytes reached exactly)
        self._inner.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *args) -> None:
        if exc_type is None:
            self.close()
        else:
            self._inner.discard() if hasattr(self._inner, "discard") else None

    def __getattr__(self, name):
        return getattr(self._inner, name)


class FaultyFileSystem(MemoryFileSystem):
    protocol = ("faulty",)
    store: dict = {}  # noqa: RUF012 - class-level like MemoryFileSystem's, but separate
    pseudo_dirs = [""]  # noqa: RUF012

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).removeprefix("faulty://"))

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode, **kwargs)
        return _FaultyFile(f) if "w" in mode or "a" in mode else f

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        PLAN.charge(len(value))
        return super().pipe_file(path, value, mode=mode, **kwargs)


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
