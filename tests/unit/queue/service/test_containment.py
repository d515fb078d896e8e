"""How the executor contains jobs on this host: chosen once, strongest first, and said why.

The probes run for real: on this host's cgroup hierarchies (a process is really moved into a
cgroup made for the purpose), and on hosts this one is not, described by a mount table the
test writes (containment.MOUNTS) whose hierarchies are plain folders or places no one may write.
What containment then does to jobs is in test_executor.py and test_manager.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from preemptible.errors import QueueError
from preemptible.queue.service import containment
from preemptible.queue.service.containment import Mechanism
from preemptible.queue.service.executor import ProcessExecutor


def host_with_mounts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *lines: str) -> None:
    """From now on the probes read this mount table instead of the host's."""
    table = tmp_path / "mounts"
    table.write_text("".join(f"{line}\n" for line in lines))
    monkeypatch.setattr(containment, "MOUNTS", str(table))


NO_CGROUPS = (
    "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0",
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0",
)


def test_the_strongest_mechanism_this_host_offers_is_chosen() -> None:
    survey = containment.survey()
    chosen = containment.choose()

    assert [found.mechanism for found in survey] == list(Mechanism)
    assert chosen == next(found for found in survey if found.available)
    assert survey[-1].available  # the process group is always there to fall back on
    if chosen.mechanism.is_cgroup:
        assert chosen.cgroup_root is not None and chosen.cgroup_root.endswith("/preemptible")
        assert chosen.why.startswith(f"{chosen.mechanism} at ")
        assert "every process of a job is tracked" in chosen.why


def test_without_a_cgroup_the_subreaper_is_chosen_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host_with_mounts(monkeypatch, tmp_path, *NO_CGROUPS)

    chosen = containment.choose()

    assert chosen.mechanism is Mechanism.SUBREAPER and chosen.cgroup_root is None
    assert chosen.why.startswith("no writable cgroup: child subreaper; a process that escapes")
    assert ProcessExecutor().containment == chosen
    reasons = {found.mechanism: found.why for found in containment.survey()}
    assert reasons[Mechanism.CGROUP_V2] == "no cgroup2 file system is mounted"
    assert reasons[Mechanism.CGROUP_V1_FREEZER] == (
        "no cgroup v1 hierarchy with the freezer controller is mounted"
    )


def test_a_mechanism_forced_where_the_host_lacks_it_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host_with_mounts(monkeypatch, tmp_path, *NO_CGROUPS)

    with pytest.raises(QueueError, match="cgroup v2 cannot contain jobs on this host: no cgroup2"):
        ProcessExecutor(containment=Mechanism.CGROUP_V2)
    assert ProcessExecutor(containment=Mechanism.PROCESS_GROUP).containment.why.startswith(
        "no writable cgroup and no child subreaper: process group only; a process that calls "
        "setsid leaves the group"
    )


def test_a_folder_that_is_not_a_cgroup_or_cannot_be_written_is_not_taken_for_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plain = tmp_path / "not a cgroup"  # the table writes its space as \040, as the kernel does
    plain.mkdir()
    host_with_mounts(
        monkeypatch,
        tmp_path,
        "cgroup2 /proc/sys cgroup2 rw,nosuid,nodev,noexec,relatime 0 0",
        f"cgroup2 {str(plain).replace(' ', chr(92) + '040')} cgroup2 rw,relatime 0 0",
        "cgroup /proc/sys/kernel cgroup rw,relatime,freezer 0 0",
    )

    v2, freezer = (
        containment.probe(Mechanism.CGROUP_V2),
        containment.probe(Mechanism.CGROUP_V1_FREEZER),
    )

    assert not v2.available and not freezer.available
    unwritable, not_cgroup = v2.why.split("; ", 1)
    assert unwritable.startswith("cannot make a cgroup under /proc/sys/preemptible (")
    assert unwritable.endswith("): run the manager as root, or give its user that folder")
    assert not_cgroup == (
        f"{plain}/preemptible: a cgroup has no cgroup.kill or cgroup.freeze here (cgroup v2 "
        "needs Linux 5.2 or later)"
    )
    assert list((plain / "preemptible").iterdir()) == []  # the probe cleaned up after itself
    assert freezer.why.startswith("cannot make a cgroup under /proc/sys/kernel/preemptible")
    assert containment.choose().mechanism is Mechanism.SUBREAPER
