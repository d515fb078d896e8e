"""Snapshots for background saves: the training loop resumes as soon as the state is captured.

A background save must capture the state at the moment ``save(..., blocking=False)`` is called,
because the next optimizer step mutates parameters in place. Two ways to capture it:

* ``copy``: copy every array into a host staging buffer that is reused between saves (pinned
  when the state lives on a GPU, so device-to-host copies are asynchronous DMA; the background
  writer waits on a CUDA event, not the training loop). The stall is one memcpy of the state on
  the CPU, and the D2H enqueue on a GPU.
* ``fork``: for CPU-resident state on a local disk, ``fork()`` the process; the child sees a
  copy-on-write snapshot of memory, writes and commits the checkpoint, and exits. The stall is
  the page-table copy (about 20 ms for 1 GiB on a 2-core VM, half a memcpy there). Pages the
  parent modifies meanwhile are copied by the kernel, so the memory cost is at most the state's
  size, as with ``copy``. Not used with CUDA tensors (a child cannot use the parent's CUDA
  context) nor with fsspec filesystems (their event loops and sessions belong to the parent).

``auto`` picks ``copy``. A training step rewrites the whole state (the optimizer updates every
parameter and moment), so under ``fork`` the kernel copies every page of the snapshot anyway,
a fault per 4 KiB page, while the child competes with the loop for the cores; timed as whole
loops, that cost the loop more than one memcpy in the stall in 7 of 9 runs of three shapes
(`benchmarks/async_save.py`; docs/internals/background-save-copies.md). ``fork`` stays for a
state the loop leaves mostly untouched between saves. Memory is bounded either way: at most one
save is in flight, and a save that would need more staging memory than the cap falls back to a
synchronous save and says so.
"""

from __future__ import annotations

import enum
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from preemptible.checkpoint.arrays import describe
from preemptible.checkpoint.serialize import Array, parse_torch_dtype
from preemptible.errors import StorageError

_ALIGN = 64


class AsyncMode(enum.StrEnum):
    AUTO = "auto"
    COPY = "copy"
    FORK = "fork"


@dataclass(slots=True)
class SaveHandle:
    """A save running in the background. ``wait()`` returns its `CheckpointInfo` or raises."""

    step: int
    stall_seconds: float
    mode: str
    _future: Future[Any] = field(repr=False)

    def wait(self, timeout: float | None = None) -> Any:
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()


def fork_supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def all_on_cpu(arrays: list[Array]) -> bool:
    return all(not isinstance(a, torch.Tensor) or a.device.type == "cpu" for a in arrays)


def state_bytes(arrays: list[Array]) -> int:
    return sum(_aligned(describe(a)[4]) for a in arrays)


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class StagingBuffer:
    """Host memory for ``copy`` snapshots, grown on demand and reused between saves.

    Only one save uses it at a time (the manager waits for the previous save first).
    """

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def stage(self, arrays: list[Array]) -> tuple[list[Array], Callable[[], None]]:
        """Copy ``arrays`` into the buffer; returns the copies and a function that waits for them.

        The returned waiter must run before the copies are read (it syncs pending D2H copies).
        """
        need = state_bytes(arrays)
        on_gpu = not all_on_cpu(arrays)
        if (
            self._buffer is None
            or self.capacity < need
            or (on_gpu and not self._buffer.is_pinned())
        ):
            self._buffer = None  # free the old one before allocating the new one
            pin = on_gpu and torch.cuda.is_available()
            self._buffer = torch.empty(max(need, 1), dtype=torch.uint8, pin_memory=pin)
        staged: list[Array] = []
        offset = 0
        for array in arrays:
            kind, dtype, shape, _, nbytes = describe(array)
            window = self._buffer[offset : offset + nbytes]
            offset += _aligned(nbytes)
            if kind == "numpy":
                assert isinstance(array, np.ndarray)
                dst = window.numpy().view(array.dtype).reshape(array.shape)
                np.copyto(dst, array)
                staged.append(dst)
                continue
            assert isinstance(array, torch.Tensor)
            if nbytes == 0:
                staged.append(torch.empty(shape, dtype=array.dtype))
                continue
            dst_t = window.view(parse_torch_dtype(dtype)).view(shape)
            dst_t.copy_(array.detach(), non_blocking=array.device.type == "cuda")
            staged.append(dst_t)
        if not on_gpu:
            return staged, lambda: None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        event.record()
        return staged, event.synchronize


@dataclass(frozen=True, slots=True)
class ForkedSave:
    """A child process writing a checkpoint from a copy-on-write snapshot."""

    pid: int
    result_fd: int

    def wait(self) -> bytes:
        """Block until the child exits; return what it reported, or raise what it raised."""
        chunks = []
        with os.fdopen(self.result_fd, "rb") as pipe:
            while chunk := pipe.read(1 << 16):
                chunks.append(chunk)
        _, status = os.waitpid(self.pid, 0)
        payload = b"".join(chunks)
        if os.WIFSIGNALED(status):
            raise StorageError(
                f"the background save process {self.pid} was killed by signal "
                f"{os.WTERMSIG(status)} before it committed; the previous checkpoint is intact"
            )
        kind, _, body = payload.partition(b"\n")
        if kind == b"ok":
            return body
        raise StorageError(
            f"background save failed: {body.decode(errors='replace') or 'no report from the child'}"
        )


def fork_and_run(work: Callable[[], bytes]) -> ForkedSave:
    """Run ``work`` in a forked child; its bytes (or its error) come back through a pipe.

    The child ignores preemption signals (the parent decides when to stop and waits for this
    save first) and leaves with ``os._exit``: no atexit handlers, no flushing of inherited
    buffers, nothing of the parent's is torn down twice.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(read_fd)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                signal.signal(sig, signal.SIG_IGN)
            try:
                payload = b"ok\n" + work()
            except BaseException as e:  # reported to the parent, which raises
                payload = b"error\n" + f"{type(e).__name__}: {e}".encode()
                code = 1
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(code)
    os.close(write_fd)
    return ForkedSave(pid=pid, result_fd=read_fd)
