"""Whom jobs run as, from real passwd entries. The switch to another user needs root and is
tested where it runs (`test_executor.py`); the decisions are tested here for any user, by
naming the manager's uid.
"""

from __future__ import annotations

import pytest

from preemptible.errors import ConfigError
from preemptible.queue.core import parse_config
from preemptible.queue.service.isolation import (
    JobUser,
    job_users,
)

NOBODY = 65534
"""The uid of `nobody` (Debian and most distributions): a manager that is not root."""


def config(**run_as: str):
    """Queues `a` and `b`, each with the `run_as` given for it."""
    queues = [{"name": q} | ({"run_as": run_as[q]} if q in run_as else {}) for q in "ab"]
    return parse_config({"cluster": {"gpus": 2}, "queues": queues})


@pytest.fixture(autouse=True)
def _nobody_exists() -> None:
    try:
        JobUser.lookup("nobody")
    except KeyError:
        pytest.skip("this machine has no user `nobody`")


# --- whom jobs run as ----------------------------------------------------------------------------


def test_a_user_is_read_from_its_passwd_entry() -> None:
    user = JobUser.lookup("nobody")
    assert (user.uid, user.name) == (NOBODY, "nobody") and user.gid in user.groups
    assert user.environment() == {"HOME": user.home, "USER": "nobody", "LOGNAME": "nobody"}
    assert user.runner_ids() == f"{NOBODY}:{user.gid}:{','.join(map(str, user.groups))}"


def test_a_root_manager_switches_to_each_queues_user() -> None:
    users = job_users(config(a="nobody", b="nobody"), euid=0)
    assert users == {"a": JobUser.lookup("nobody"), "b": JobUser.lookup("nobody")}


def test_a_root_manager_refuses_a_missing_user_and_root_itself() -> None:
    with pytest.raises(ConfigError, match="'a': run_as = 'pq-no-such-user': there is no such"):
        job_users(config(a="pq-no-such-user"), euid=0)
    with pytest.raises(ConfigError, match="jobs never run as root"):
        job_users(config(a="root"), euid=0)


def test_a_manager_that_is_not_root_runs_every_job_as_itself() -> None:
    # run_as naming the manager's own user needs no switch; any other user needs root.
    assert job_users(config(a="nobody"), euid=NOBODY) == {}
    with pytest.raises(ConfigError, match=r"switching to another user needs root.*as nobody"):
        job_users(config(a="root"), euid=NOBODY)
