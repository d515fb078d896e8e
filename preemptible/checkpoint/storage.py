"""Where checkpoint bytes go: a POSIX directory or any fsspec filesystem.

Two commit modes, because filesystems differ in what they can make atomic:

* ``rename`` (local POSIX disks): files are written into a temporary directory beside the
  target, fsynced, then the directory is renamed into place; ``rename(2)`` is atomic, so a reader
  sees the whole checkpoint or none of it, even across a power cut (the parent is fsynced too).
* ``manifest`` (object stores and every other fsspec filesystem): there is no atomic rename
  (s3fs's ``mv`` is copy + delete, per object), so data files are uploaded directly under unique
  names and ``manifest.json`` is written last with a single PUT. Until it lands, the step does
  not exist for readers; a second writer of the same step never overwrites the first one's files.

The storage layer only moves bytes; deciding what is valid, what to keep and what to collect is
the manager's job.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, BinaryIO, Protocol

import fsspec

from preemptible._extras import extra_for_url, install_line
from preemptible.checkpoint.manifest import MANIFEST_NAME, TMP_PREFIX, TRASH_PREFIX
from preemptible.errors import BackendNotInstalledError, ConfigError


class CommitMode(enum.StrEnum):
    RENAME = "rename"
    MANIFEST = "manifest"


@dataclass(frozen=True, slots=True)
class RootEntry:
    """One name directly under the checkpoint root."""

    name: str
    is_dir: bool
    mtime: float | None


class ReadableFile(Protocol):
    """What ``open_read`` returns: a local file (unbuffered) or an fsspec file."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readinto(self, buffer: memoryview, /) -> int | None: ...

    def __enter__(self) -> ReadableFile: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> None: ...


@dataclass(slots=True)
class Staging:
    """An in-progress save: where its files go and which ones it has written."""

    dirname: str
    nonce: str
    written: list[str] = field(default_factory=list)


class CheckpointStorage:
    """Byte-moving operations relative to one checkpoint root (a Protocol in spirit).

    Names are plain strings relative to the root, one directory level deep, so the same manager
    code drives a local disk, S3 or ``memory://``.
    """

    url: str
    commit_mode: CommitMode
    unique_names: bool = False
    """Data files get a per-save suffix even under ``rename``: the local tier of a two-tier
    checkpointer keeps the names its upload will use, so two nodes' uploads of one step never
    share a remote file name."""

    def list_root(self) -> list[RootEntry]:
        raise NotImplementedError

    def begin(self, step_dir: str, nonce: str) -> Staging:
        raise NotImplementedError

    def data_name(self, staging: Staging, base: str) -> str:
        """The file name to use for ``base`` in this save (unique per writer on object stores)."""
        if self.commit_mode is CommitMode.RENAME and not self.unique_names:
            return base
        stem, dot, ext = base.rpartition(".")
        return f"{stem}.{staging.nonce}{dot}{ext}" if dot else f"{base}.{staging.nonce}"

    def open_write(
        self, staging: Staging, name: str
    ) -> contextlib.AbstractContextManager[BinaryIO]:
        raise NotImplementedError

    def commit(self, staging: Staging, step_dir: str, manifest: bytes) -> bool:
        """Make the checkpoint visible. False if ``step_dir`` was already committed by someone."""
        raise NotImplementedError

    def abort(self, staging: Staging) -> None:
        raise NotImplementedError

    def open_read(self, dirname: str, name: str) -> ReadableFile:
        raise NotImplementedError

    def read_bytes(self, dirname: str, name: str) -> bytes:
        raise NotImplementedError

    def newest_mtime(self, dirname: str) -> float | None:
        raise NotImplementedError

    def delete(self, dirname: str, nonce: str, names: list[str]) -> None:
        """Remove a committed checkpoint made of ``names`` so that no reader can ever see a
        half-deleted one, and nothing else: another writer may be saving the same step into
        the same directory (a zombie behind its replacement)."""
        raise NotImplementedError

    def discard(self, dirname: str, nonce: str, names: list[str]) -> None:
        """Remove a committed checkpoint that failed verification, made of ``names``, so that
        a new save can commit its step; like `delete`, it is invisible from the first call on.

        Raises:
            FileNotFoundError: it is gone already (another writer's retention deleted it).
        """
        raise NotImplementedError

    def remove_tree(self, dirname: str) -> None:
        raise NotImplementedError

    def describe(self, dirname: str = "", name: str = "") -> str:
        parts = [p for p in (dirname, name) if p]
        return "/".join([self.url.rstrip("/"), *parts])


class LocalStorage(CheckpointStorage):
    """A POSIX directory: temp dir + fsync + rename."""

    commit_mode = CommitMode.RENAME

    def __init__(self, root: str, *, unique_names: bool = False):
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root
        self.unique_names = unique_names

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def list_root(self) -> list[RootEntry]:
        try:
            it = os.scandir(self.root)
        except FileNotFoundError:
            return []
        entries = []
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted by a concurrent writer while we listed
                entries.append(RootEntry(e.name, e.is_dir(follow_symlinks=False), st.st_mtime))
        return entries

    def begin(self, step_dir: str, nonce: str) -> Staging:
        os.makedirs(self.root, exist_ok=True)
        dirname = f"{TMP_PREFIX}{step_dir}-{nonce}"
        os.mkdir(self._path(dirname))
        return Staging(dirname=dirname, nonce=nonce)

    @contextlib.contextmanager
    def open_write(self, staging: Staging, name: str) -> Iterator[BinaryIO]:
        staging.written.append(name)
        with open(self._path(staging.dirname, name), "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())

    def commit(self, staging: Staging, step_dir: str, manifest: bytes) -> bool:
        with self.open_write(staging, MANIFEST_NAME) as f:
            f.write(manifest)
        _fsync_dir(self._path(staging.dirname))
        try:
            os.rename(self._path(staging.dirname), self._path(step_dir))
        except OSError as e:
            if os.path.isdir(self._path(step_dir)):
                return False  # ENOTEMPTY / EEXIST: another writer committed this step first
            raise e
        _fsync_dir(self.root)
        return True

    def abort(self, staging: Staging) -> None:
        shutil.rmtree(self._path(staging.dirname), ignore_errors=True)

    def open_read(self, dirname: str, name: str) -> ReadableFile:
        f = open(self._path(dirname, name), "rb", buffering=0)  # noqa: SIM115 - returned
        # Checkpoint files are read once, front to back: ask for aggressive readahead.
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return f

    def read_bytes(self, dirname: str, name: str) -> bytes:
        with open(self._path(dirname, name), "rb") as f:
            return f.read()

    def newest_mtime(self, dirname: str) -> float | None:
        path = self._path(dirname)
        times = [os.stat(path).st_mtime]
        with contextlib.suppress(OSError), os.scandir(path) as it:
            times.extend(e.stat().st_mtime for e in it)
        return max(times)

    def delete(self, dirname: str, nonce: str, names: list[str]) -> None:
        # Saves stage in a .tmp- folder of their own and rename: the folder holds only this.
        trash = f"{TRASH_PREFIX}{dirname}-{nonce}"
        os.rename(self._path(dirname), self._path(trash))
        _fsync_dir(self.root)
        self.remove_tree(trash)

    def discard(self, dirname: str, nonce: str, names: list[str]) -> None:
        self.delete(dirname, nonce, names)

    def remove_tree(self, dirname: str) -> None:
        shutil.rmtree(self._path(dirname), ignore_errors=True)


class FsspecStorage(CheckpointStorage):
    """Any fsspec filesystem: unique data names, manifest written last as the commit marker."""

    commit_mode = CommitMode.MANIFEST

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, url: str):
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url

    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def list_root(self) -> list[RootEntry]:
        self.fs.invalidate_cache(self.root)
        try:
            infos = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        return [
            RootEntry(
                name=info["name"].rstrip("/").rsplit("/", 1)[-1],
                is_dir=info.get("type") == "directory",
                mtime=_info_mtime(info),
            )
            for info in infos
        ]

    def begin(self, step_dir: str, nonce: str) -> Staging:
        self.fs.makedirs(self._path(step_dir), exist_ok=True)
        return Staging(dirname=step_dir, nonce=nonce)

    @contextlib.contextmanager
    def open_write(self, staging: Staging, name: str) -> Iterator[BinaryIO]:
        staging.written.append(name)
        with self.fs.open(self._path(staging.dirname, name), "wb") as f:
            yield f

    def commit(self, staging: Staging, step_dir: str, manifest: bytes) -> bool:
        path = self._path(step_dir, MANIFEST_NAME)
        self.fs.invalidate_cache(self._path(step_dir))
        if self.fs.exists(path):
            return False
        try:  # an exclusive write (S3: If-None-Match), so that of two racing writers one wins
            self.fs.pipe_file(path, manifest, mode="create")
        except FileExistsError:
            return False
        except OSError as e:
            # Some stores report the failed precondition as another error (SeaweedFS: HTTP 412
            # without the condition's name); the manifest there tells who won.
            self.fs.invalidate_cache(self._path(step_dir))
            try:
                stored: bytes = self.fs.cat_file(path)  # fsspec is untyped
            except FileNotFoundError:
                raise e from None
            return stored == manifest
        return True

    def abort(self, staging: Staging) -> None:
        paths = [self._path(staging.dirname, n) for n in staging.written]
        with contextlib.suppress(Exception):  # best effort: garbage collection catches the rest
            self.fs.rm(paths)

    def open_read(self, dirname: str, name: str) -> ReadableFile:
        f: ReadableFile = self.fs.open(self._path(dirname, name), "rb")  # fsspec is untyped
        return f

    def read_bytes(self, dirname: str, name: str) -> bytes:
        data: bytes = self.fs.cat_file(self._path(dirname, name))  # fsspec is untyped
        return data

    def newest_mtime(self, dirname: str) -> float | None:
        self.fs.invalidate_cache(self._path(dirname))
        times = [_info_mtime(i) for i in self.fs.find(self._path(dirname), detail=True).values()]
        known = [t for t in times if t is not None]
        return max(known) if known else None

    def delete(self, dirname: str, nonce: str, names: list[str]) -> None:
        # Manifest first: from then on the step is invisible, whatever happens to the rest. Then
        # only what it lists: saves write into the step's folder (unique names, manifest last),
        # so another writer's save of the same step may be there, half-written; if abandoned,
        # garbage collection removes it once stale.
        self.fs.rm_file(self._path(dirname, MANIFEST_NAME))
        paths = [self._path(dirname, name) for name in names]
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(paths)
        self.fs.invalidate_cache(self._path(dirname))
        with contextlib.suppress(OSError):  # a folder left empty (object stores have none)
            if not self.fs.ls(self._path(dirname)):
                self.fs.rmdir(self._path(dirname))
        self.fs.invalidate_cache(self.root)

    def discard(self, dirname: str, nonce: str, names: list[str]) -> None:
        # The new save's uploads are in the same directory already: the same as `delete`.
        self.delete(dirname, nonce, names)

    def remove_tree(self, dirname: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._path(dirname), recursive=True)
        self.fs.invalidate_cache(self.root)


def open_storage(
    root: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    commit_mode: CommitMode | str | None = None,
) -> CheckpointStorage:
    """Pick the storage for a local path or fsspec URL.

    Raises:
        BackendNotInstalledError: the URL's scheme needs a package that is not installed.
        ConfigError: the URL cannot be understood, or a commit mode the filesystem cannot honour.
    """
    url = os.fspath(root)
    mode = CommitMode(commit_mode) if commit_mode is not None else None
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        extra = extra_for_url(url)
        fix = install_line(extra) if extra else "install the fsspec backend it names"
        raise BackendNotInstalledError(
            f"no filesystem installed for {url!r} ({e}): {fix}", extra=extra
        ) from e
    except ValueError as e:
        raise ConfigError(f"cannot open checkpoint root {url!r}: {e}") from e
    is_local = "file" in _protocols(fs)
    if is_local and mode in (None, CommitMode.RENAME):
        return LocalStorage(path)
    if mode is CommitMode.RENAME:
        raise ConfigError(
            f"{url!r} is not a local POSIX path, so it has no atomic rename; "
            "use commit_mode='manifest'"
        )
    return FsspecStorage(fs, path, url)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _info_mtime(info: dict[str, Any]) -> float | None:
    for key in ("mtime", "LastModified", "last_modified", "created", "updated"):
        value = info.get(key)
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, dt.datetime):
            return value.timestamp()
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None
