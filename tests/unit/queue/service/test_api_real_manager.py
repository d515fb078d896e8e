"""schemathesis against the served schema with the real `QueueManager` behind it.

The manager is the real one, with its SQLite store and its loop, and only the executor is
inert: schemathesis submits arbitrary commands, so nothing may run. An admitted job "runs" until
it is told to go, which is enough to reach every state (pending, running, preempting, cancelled)
and every route's checks. Half the generated job ids are swapped for ids of jobs that exist
(called with the job's own token where the route wants it), so the per-job routes meet real
jobs and not only 404s. Long polls are cut to a fraction of a
second.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis

from preemptible.queue.service.app import create_app
from preemptible.queue.service.auth import resolve_tokens
from preemptible.queue.service.manager import QueueManager
from preemptible.queue.service.store import Store
from preemptible.queue.service.views import SubmitRequest

from .fake_manager import ADMIN_TOKEN, ENVIRON, InertExecutor, make_config

_state = Path(tempfile.mkdtemp(prefix="schema-real-manager-"))
# Rate limits are tested in test_limits.py; here they would only cut the cases short (429):
# an array of a thousand jobs is charged as a listing of them.
_unlimited = dataclasses.replace(make_config().service, rate_per_s=1e6, burst=1_000_000)
_manager = QueueManager(
    dataclasses.replace(make_config(), service=_unlimited),
    Store(_state),
    InertExecutor(),  # type: ignore[arg-type]
    state_dir=_state,
    url="http://127.0.0.1:9",
    poll_s=0.02,
)
for _i in range(12):  # more than the GPUs: some run, some wait
    _manager.submit(SubmitRequest(queue=("team-a", "team-b")[_i % 2], gpus=2, command=["train.py"]))
_manager.step()

schema = schemathesis.openapi.from_asgi(
    "/openapi.json", create_app(_manager, tokens=resolve_tokens(make_config(), ENVIRON))
)
schema.config.update(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
schema.config.generation.update(max_examples=25, allow_extra_parameters=False)
# A schema-valid request may still name a queue this machine lacks (400), a job that does not
# exist (404), or a job whose state forbids it (409), or give a range of sizes the schema cannot
# express (`min_gpus` above `gpus`, a multiple that does not divide them: 422, `JobSpecError`).
schema.config.checks.positive_data_acceptance.expected_statuses = [
    "2xx", "400", "401", "403", "404", "409", "422",
]  # fmt: skip
schema.config.checks.negative_data_rejection.expected_statuses = [
    "400", "401", "403", "404", "405", "413", "422",
]  # fmt: skip


JOB_ROUTES = ("cost", "checkpointed", "notice")
"""Routes for the job's own token: a real job is called with its token."""


@pytest.fixture(scope="module", autouse=True)
def running_manager() -> Iterator[QueueManager]:
    _manager.start()
    yield _manager
    _manager.stop()


@schema.parametrize()
def test_the_api_over_the_real_manager_conforms_to_its_schema(case: schemathesis.Case[Any]) -> None:
    params = case.path_parameters or {}
    job_id = params.get("job_id")
    if isinstance(job_id, str) and len(job_id) % 2 == 0:
        with _manager.lock:
            ids = sorted(_manager.jobs)
        params["job_id"] = ids[len(job_id) % len(ids)]
        if case.path.rsplit("/", 1)[-1] in JOB_ROUTES:
            token = _manager._job_token(params["job_id"])
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
    wait = (case.query or {}).get("wait")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0.05:
        case.query["wait"] = 0.05  # still valid: only shorter
    case.call_and_validate()
