"""Two tiers: commit to a fast local disk first, then make the checkpoint durable remotely.

A save to a node-local disk or tmpfs costs what the disk can do; a save to an object store
costs what the network can do, often ten times more. With ``Checkpointer(remote, local=PATH)``
the loop waits only for the local commit (the usual protocol: temp dir, fsync, rename), and an
uploader thread then copies that committed checkpoint to the remote, where the remote's own
protocol commits it (manifest last; the first commit of a step wins).

One upload runs at a time and the newest committed step always goes next: when the remote is
slower than the save interval, older steps waiting for their turn are skipped rather than
queued without end. An upload is never cut off half-way; one that dies with its process left
only files without a manifest, which no reader sees. Writing both tiers from the save itself
was rejected (the loop would wait for the slower one), and so was a second serialization for
the upload (the local files are what the remote must hold: `upload`).

Restores read the newest valid checkpoint of either tier, the local copy first on a tie.

A collective save of several ranks works with two tiers when every rank runs on one node and
shares the local directory (`check_one_node`): each rank writes its files there, rank 0
commits the manifest, and rank 0 alone runs the uploader, which copies all ranks' files. Across
nodes there is no directory every rank writes and one uploader reads, so that is refused
rather than given one uploader per node (several partial copies of one step to reconcile).
"""

from __future__ import annotations

import builtins
import logging
import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from preemptible.checkpoint.manifest import Manifest, step_dirname
from preemptible.checkpoint.reader import CheckpointReader, no_valid_checkpoint
from preemptible.checkpoint.records import CheckpointInfo
from preemptible.checkpoint.stats import CostTracker
from preemptible.checkpoint.storage import CheckpointStorage, LocalStorage, Staging, open_storage
from preemptible.checkpoint.upload import Commit, upload_step
from preemptible.distributed import local_world_size
from preemptible.errors import (
    CheckpointCorruptedError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    ConfigError,
    PreemptibleWarning,
    StorageError,
)

log = logging.getLogger("preemptible.checkpoint")

LOCAL = "local"
REMOTE = "remote"


@dataclass(frozen=True, slots=True)
class _Job:
    step: int
    started: float | None
    """``time.perf_counter()`` when its save started; None for a step an earlier process saved."""


class _Gone(Exception):
    """The local copy of a step was retired (a newer one superseded it) before its upload."""


class Uploader:
    """The background half of a two-tier checkpointer: one upload at a time, newest first.

    ``submit`` is called after each local commit, from whichever thread committed; the rest
    of the work runs on the uploader's own thread. When the thread starts it compares the two
    tiers: a local step newer than the remote's newest (its upload was cut off by the end of an
    earlier process) is uploaded first.

    Args:
        local: the local tier (read only here).
        remote: the remote tier (read, and written through ``commit``).
        commit: the remote's commit of a staged copy.
        clean_remote: the remote's retention, after a step became durable there.
        clean_local: the local tier's retention, which asks `protected` what to keep.
        cost: where upload times go.
        attempts: tries per step before its failure is reported by `wait_durable`.
        backoff_secs: the wait after the first failed try; it doubles up to ``max_backoff_secs``.
    """

    def __init__(
        self,
        *,
        local: CheckpointReader,
        remote: CheckpointReader,
        commit: Commit,
        clean_remote: Callable[[int], None],
        clean_local: Callable[[], None],
        cost: CostTracker,
        attempts: int = 5,
        backoff_secs: float = 0.5,
        max_backoff_secs: float = 30.0,
    ):
        self.local, self.remote = local, remote
        self._commit = commit_copy(remote, commit)
        self._clean_remote, self._clean_local = clean_remote, clean_local
        self._cost = cost
        self.attempts, self.backoff_secs, self.max_backoff_secs = (
            attempts,
            backoff_secs,
            max_backoff_secs,
        )
        self._cond = threading.Condition()
        self._pending: _Job | None = None
        self._uploading: int | None = None
        self._durable: int | None = None
        self._error: StorageError | None = None
        self._starting = True  # until the two tiers have been compared
        self._closing = False
        self._abandon = False
        self._thread = threading.Thread(target=self._run, name="preemptible-upload", daemon=True)

    def start(self) -> None:
        """Start the thread, once the checkpointer that owns this uploader is complete."""
        self._thread.start()

    # --- any thread ----------------------------------------------------------------------------

    @property
    def durable_step(self) -> int | None:
        """The newest step known to be committed remotely (None: none, or not known yet)."""
        with self._cond:
            return self._durable

    def protected(self) -> set[int]:
        """Local steps that retention must keep: the one uploading and the one waiting."""
        with self._cond:
            steps = {self._uploading} if self._uploading is not None else set()
            if self._pending is not None:
                steps.add(self._pending.step)
            return steps

    def submit(self, step: int, started: float | None) -> None:
        """Upload ``step`` (committed locally) next; a step waiting for its turn is skipped
        for it if older."""
        with self._cond:
            if self._closing:
                raise StorageError("the checkpointer is closed: it uploads nothing more")
            if self._pending is None or step >= self._pending.step:
                skipped = self._pending
                if skipped is not None and skipped.step != step:
                    log.info("upload of step %d skipped: step %d is newer", skipped.step, step)
                self._pending = _Job(step, started)
            self._cond.notify_all()

    def wait_durable(self, timeout: float | None = None) -> bool:
        """Wait until every step submitted so far is durable remotely (or was superseded by a
        newer durable one). False if ``timeout`` seconds passed first.

        Raises:
            StorageError: the newest upload failed after every retry (raised once).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._busy():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            error, self._error = self._error, None
        if error is not None:
            raise error
        return True

    def close(self, *, wait: bool = True) -> None:
        """Stop the thread: after the uploads owed (``wait``), or after the current one."""
        with self._cond:
            self._closing = True
            self._abandon = not wait
            self._cond.notify_all()
        if wait:
            self._thread.join()

    def _busy(self) -> bool:
        return self._starting or self._pending is not None or self._uploading is not None

    # --- the uploader's thread -----------------------------------------------------------------

    def _run(self) -> None:
        self._reconcile()
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                if self._pending is None or self._abandon:
                    self._pending = None
                    self._cond.notify_all()
                    return
                job, self._pending = self._pending, None
                self._uploading = job.step
            try:
                self._upload_with_retries(job)
            finally:
                with self._cond:
                    self._uploading = None
                    self._cond.notify_all()

    def _reconcile(self) -> None:
        """Learn the remote's newest step; queue a newer local one (an upload cut off before)."""
        try:
            remote = next(self.remote._newest_first(), None)
            local = next(self.local._newest_first(), None)
        except Exception as e:  # the first upload tries again; restore reads what it can
            log.warning("could not compare the local and remote checkpoints: %r", e)
            remote = local = None
        with self._cond:
            if remote is not None:
                self._durable = max(remote[1].step, self._durable or -1)
            newer = local is not None and (remote is None or local[1].step > remote[1].step)
            if newer and local is not None and self._pending is None:
                log.info(
                    "step %d is on the local tier only (its upload did not finish): uploading "
                    "it to %s",
                    local[1].step,
                    self.remote.url,
                )
                self._pending = _Job(local[1].step, None)
            self._starting = False
            self._cond.notify_all()

    def _upload_with_retries(self, job: _Job) -> None:
        delay = self.backoff_secs
        for attempt in range(1, self.attempts + 1):
            try:
                self._upload(job)
                with self._cond:
                    self._error = None
                return
            except _Gone:
                log.info("upload of step %d skipped: retired locally for a newer step", job.step)
                return
            except (CheckpointCorruptedError, CheckpointFormatError) as e:
                self._fail(job, f"its local copy fails verification ({e}); it stays local only")
                return
            except Exception as e:
                final = attempt == self.attempts
                log.warning(
                    "upload of step %d to %s failed (try %d of %d): %r%s",
                    job.step,
                    self.remote.url,
                    attempt,
                    self.attempts,
                    e,
                    "" if final else f"; trying again in {delay:.1f} s",
                )
                if final:
                    self._fail(job, f"{self.attempts} tries failed, the last with {e!r}")
                    return
            with self._cond:  # back off; a newer step or an abandoning close cuts it short
                end = time.monotonic() + delay
                while not self._abandon and (self._pending is None) and time.monotonic() < end:
                    self._cond.wait(end - time.monotonic())
                if self._abandon or self._pending is not None:
                    return  # the newer step goes instead; it reports its own outcome
            delay = min(delay * 2, self.max_backoff_secs)

    def _fail(self, job: _Job, why: str) -> None:
        error = StorageError(
            f"step {job.step} is committed on the local tier {self.local.url} but could not be "
            f"made durable at {self.remote.url}: {why}. It is restored from the local tier on "
            "this node only; the next save uploads its own step. Fix the remote (credentials, "
            "space, network) or save again"
        )
        log.error("%s", error)
        with self._cond:
            self._error = error

    def _upload(self, job: _Job) -> None:
        dirname = step_dirname(job.step)
        manifest = self.local._read_manifest(dirname)
        if manifest is None:
            raise _Gone()
        started = time.perf_counter()
        if self.remote._read_manifest(dirname) is None:
            try:
                upload_step(
                    self.local.storage,
                    dirname,
                    manifest,
                    self.remote.storage,
                    nonce=uuid.uuid4().hex[:12],
                    max_workers=self.remote.max_workers,
                    commit=self._commit,
                )
            except FileNotFoundError as e:
                if self.local._read_manifest(dirname) is None:
                    raise _Gone() from e
                raise
        now = time.perf_counter()
        self._cost.record_upload(
            step=job.step,
            upload_seconds=now - started,
            durable_seconds=None if job.started is None else now - job.started,
            at=time.time(),
        )
        with self._cond:
            self._durable = max(job.step, self._durable if self._durable is not None else -1)
        log.info("step %d is durable at %s", job.step, self.remote.url)
        self._clean_remote(job.step)
        self._clean_local()


def commit_copy(remote: CheckpointReader, commit: Commit) -> Commit:
    """The remote commit of an upload: ``commit``, except when the remote already holds this
    very copy (the same files, names included: an earlier try whose answer was lost, or
    another process uploading the same local directory). Then it is kept as it is: aborting
    the staged copy would delete the committed checkpoint's own files."""

    def commit_or_keep(staging: Staging, dirname: str, manifest: Manifest) -> Manifest:
        if remote.storage.commit(staging, dirname, manifest.to_bytes()):
            return manifest
        existing = remote._read_manifest(dirname)
        if existing is not None and existing.files == manifest.files:
            return existing
        return commit(staging, dirname, manifest)

    return commit_or_keep


# --- reading across the two tiers --------------------------------------------------------------

_Candidate = tuple[str, CheckpointReader, str, Manifest]


def _candidates(local: CheckpointReader, remote: CheckpointReader) -> builtins.list[_Candidate]:
    """Committed checkpoints of both tiers, newest first, the local copy first on a tie."""
    found: list[_Candidate] = [(LOCAL, local, d, m) for d, m in local._scan()[0]]
    try:
        found += [(REMOTE, remote, d, m) for d, m in remote._scan()[0]]
    except StorageError as e:  # the local tier may still have what is needed
        warnings.warn(
            f"cannot list the remote tier ({e}); using the local tier only",
            PreemptibleWarning,
            stacklevel=4,
        )
    return sorted(found, key=lambda c: (-c[3].step, c[0] != LOCAL))


def list_across(local: CheckpointReader, remote: CheckpointReader) -> list[CheckpointInfo]:
    """Every committed step of either tier, oldest first, described by its local copy if any."""
    infos: dict[int, CheckpointInfo] = {}
    for _, reader, dirname, manifest in reversed(_candidates(local, remote)):
        infos[manifest.step] = reader._info(dirname, manifest)  # the local copy comes last
    return [infos[s] for s in sorted(infos)]


def load_across(
    local: CheckpointReader,
    remote: CheckpointReader,
    step: int | None,
    load: Callable[[CheckpointReader, str, Manifest], Any],
) -> tuple[str, int, Any] | None:
    """Load the newest valid checkpoint of either tier (of ``step`` if given) with ``load``.

    Returns ``(tier, step, data)``, or None when neither tier holds a committed checkpoint. A
    copy that fails verification is skipped with a `PreemptibleWarning` for the next one: the
    other tier's copy of the same step, or an older step.

    Raises:
        CheckpointNotFoundError: ``step`` was given and neither tier has committed it.
        CheckpointCorruptedError: ``step`` was given and every copy of it fails verification.
        NoValidCheckpointError: ``step`` is None and every committed copy fails verification.
    """
    candidates = [c for c in _candidates(local, remote) if step is None or c[3].step == step]
    if step is not None and not candidates:
        raise CheckpointNotFoundError(
            f"no committed checkpoint for step {step} under {local.url} or {remote.url}"
        )
    failed: list[tuple[int, str]] = []
    for tier, reader, dirname, manifest in candidates:
        try:
            return tier, manifest.step, load(reader, dirname, manifest)
        except (CheckpointCorruptedError, CheckpointFormatError) as e:
            failed.append((manifest.step, f"{tier} copy: {e}"))
            warnings.warn(
                f"skipping the {tier} copy of checkpoint step {manifest.step} at "
                f"{reader.url}: {e}; trying the next valid copy",
                PreemptibleWarning,
                stacklevel=4,
            )
    if not failed:
        return None
    if step is not None:
        raise CheckpointCorruptedError(
            f"every copy of checkpoint step {step} is corrupted: "
            + "; ".join(p for _, p in failed),
            step=step,
            problems=[p for _, p in failed],
        )
    raise no_valid_checkpoint(f"{local.url} and {remote.url}", failed)


def check_local(local: str | os.PathLike[str], remote: CheckpointStorage, local_keep: Any) -> str:
    """The local tier's absolute path, once it is known to be usable with ``remote``.

    Raises:
        ConfigError: ``local`` is not a local path, is (or nests with) the remote, or
            ``local_keep`` is not a positive integer.
    """
    if isinstance(local_keep, bool) or not isinstance(local_keep, int) or local_keep < 1:
        raise ConfigError(
            f"local_keep must be a positive integer (how many checkpoints the local tier "
            f"keeps; the newest is always kept), got {local_keep!r}"
        )
    where = os.fspath(local)
    storage = open_storage(where)
    if not isinstance(storage, LocalStorage):
        raise ConfigError(
            f"local={where!r} is not a path on this node: the local tier must be a local disk "
            "or tmpfs directory (e.g. local='/tmp/ckpt'); put the durable URL first, as the "
            "checkpointer's root"
        )
    if isinstance(remote, LocalStorage):
        a, b = os.path.realpath(storage.root), os.path.realpath(remote.root)
        if a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep):
            raise ConfigError(
                f"local={where!r} and the root {remote.url!r} are the same directory or one "
                "holds the other: give the local tier a directory of its own, on a local "
                "disk, or drop local= to save to the root alone"
            )
    return storage.root


# --- collective saves: every rank on one node -------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where one rank of a collective two-tier save runs and writes."""

    host: str
    local: str
    """The local tier's real path."""
    local_world_size: int | None
    """Ranks on its node, as the launcher says (``LOCAL_WORLD_SIZE``); None if unset."""
    uploads: bool
    """It runs an uploader (it took itself for rank 0 when the checkpointer was made)."""


def one_node_problem(places: builtins.list[RankPlace]) -> str | None:
    """Why these ranks (one `RankPlace` per rank) cannot share one local tier; None if they can."""
    world = len(places)
    sizes = sorted({p.local_world_size for p in places if p.local_world_size is not None})
    if sizes and sizes[0] < world:
        return f"the job spans several nodes (WORLD_SIZE={world}, LOCAL_WORLD_SIZE={sizes[0]})"
    hosts = sorted({p.host for p in places})
    if len(hosts) > 1:
        return f"the ranks run on {len(hosts)} hosts ({', '.join(hosts[:3])})"
    dirs = sorted({p.local for p in places})
    if len(dirs) > 1:
        return f"the ranks were given {len(dirs)} local directories ({', '.join(dirs[:3])})"
    uploaders = [rank for rank, p in enumerate(places) if p.uploads]
    if uploaders != [0]:
        return (
            f"ranks {uploaders} upload instead of rank 0 alone (the checkpointer took its rank "
            "from RANK before the process group existed: create it after init_process_group)"
        )
    return None


def check_one_node(local_root: str, group: Any, *, uploads: bool) -> None:
    """Refuse a collective two-tier save unless every rank is on one node with one local tier.

    All ranks call it (it gathers over ``group``) and all raise alike. ``uploads``: whether
    this rank runs an uploader (rank 0 alone must).

    Raises:
        ConfigError: the ranks span several nodes or were given different local directories.
    """
    mine = RankPlace(
        socket.gethostname(), os.path.realpath(local_root), local_world_size(), uploads
    )
    places: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(places, mine, group=group)
    problem = one_node_problem(places)
    if problem is not None:
        raise ConfigError(
            f"two tiers (local=) with a collective save of several ranks need every rank on "
            f"one node, all given the same local directory, but {problem}. Supported: one "
            "process, or every rank of a single-node job (torchrun --nnodes=1). For a job "
            "over several nodes drop local= and save to the shared root directly, or pass "
            "collective=False to a checkpointer that one rank saves with"
        )
