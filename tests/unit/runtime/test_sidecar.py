"""The cost file read back, and the sidecar's loop: new costs on, bad files kept out.

The pod-annotation tests run the real ``kubernetes`` client against the local HTTPS server of
`tests.k8s_api` (not a cluster: RBAC, admission and the pod object are not exercised).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from preemptible.checkpoint.stats import CheckpointCost, CostTracker, Summary
from preemptible.errors import ConfigError
from preemptible.runtime.cost_file import read_cost_file, write_cost_file
from preemptible.runtime.reporters import Reporters
from preemptible.runtime.sidecar import Sidecar, SidecarOptions

AT = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def cost(
    *, step: int = 10, p95: float = 2.0, restore: float = 1.5, nbytes: int = 1000
) -> CheckpointCost:
    """A cost as it reads back from a file: the numbers the file does not keep are 0."""
    save = Summary(last=p95 / 2, mean=p95 / 1.5, p95=p95, count=step // 5)
    return CheckpointCost(
        save=save,
        stall=Summary(mean=0.05, p95=0.1),
        persist=save,
        restore=Summary(last=restore),
        bytes=nbytes,
        last_checkpoint_step=step,
        last_checkpoint_time=AT + step,
    )


class Recording:
    """A reporter that keeps what it was handed; `got` is set at every report."""

    name = "recording"

    def __init__(self) -> None:
        self.costs: list[CheckpointCost] = []
        self.got = threading.Event()
        self.closed = False

    def report(self, cost: CheckpointCost) -> None:
        self.costs.append(cost)
        self.got.set()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Sidecar, Recording, Path]]:
    sink = Recording()
    path = tmp_path / "shared" / "cost.json"
    sidecar = Sidecar(path, Reporters([sink]), poll_s=0.05)
    yield sidecar, sink, path
    sidecar.close()


# --- read_cost_file -------------------------------------------------------------------------------


def test_a_cost_file_reads_back_as_the_cost_that_was_written(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    write_cost_file(path, cost(), now=AT + 60)
    assert read_cost_file(path) == cost()


def test_a_measured_cost_reads_back_with_what_the_file_keeps(tmp_path: Path) -> None:
    tracker = CostTracker()
    for i, seconds in enumerate((0.5, 0.75, 3.0)):
        tracker.record_stall(seconds / 10)
        tracker.record_save(step=5 * (i + 1), persist_seconds=seconds, nbytes=4096, at=AT + i)
    tracker.record_restore(1.25)
    tracker.record_restore(2.5)
    measured = tracker.snapshot()
    write_cost_file(tmp_path / "cost.json", measured)
    back = read_cost_file(tmp_path / "cost.json")
    assert back.save == measured.save == back.persist
    assert (back.stall.p95, back.stall.mean) == (measured.stall.p95, measured.stall.mean)
    assert back.restore.last == 2.5
    assert (back.bytes, back.last_checkpoint_step, back.last_checkpoint_time) == (4096, 15, AT + 2)


def test_the_cost_file_is_readable_by_a_sidecar_running_as_another_user(tmp_path: Path) -> None:
    write_cost_file(tmp_path / "cost.json", cost())
    assert stat.S_IMODE((tmp_path / "cost.json").stat().st_mode) == 0o644


def test_the_fields_beyond_the_contract_may_be_missing(tmp_path: Path) -> None:
    data = cost().to_json(updated_at=AT)
    for key in ("save_seconds_mean", "save_seconds_last", "stall_seconds_mean"):
        del data[key]
    data["last_checkpoint_step"] = data["last_checkpoint_time"] = None
    (tmp_path / "cost.json").write_text(json.dumps(data))
    back = read_cost_file(tmp_path / "cost.json")
    assert (back.save.mean, back.save.last, back.stall.mean) == (0.0, 0.0, 0.0)
    assert back.save.p95 == 2.0
    assert back.last_checkpoint_step is None and back.last_checkpoint_time is None


def _with(**changes: Any) -> str:
    data = cost().to_json(updated_at=AT)
    for key, value in changes.items():
        if value is _DROP:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data)


_DROP = object()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param('{"save_seconds_p95": 1.0', "is not JSON", id="truncated"),
        pytest.param("", "is not JSON", id="empty"),
        pytest.param("[1, 2]", "a JSON list, not an object", id="a list"),
        pytest.param(_with(bytes=_DROP), "has no field 'bytes'", id="missing field"),
        pytest.param(_with(samples="3"), "'samples' must be an integer", id="string count"),
        pytest.param(_with(bytes=1.5), "'bytes' must be an integer", id="fractional bytes"),
        pytest.param(_with(save_seconds_p95=True), "'save_seconds_p95' must be", id="bool"),
        pytest.param(_with(save_seconds_p95=None), "'save_seconds_p95' must be", id="null"),
        pytest.param(_with(restore_seconds=-1), "'restore_seconds' must be a finite", id="neg"),
        pytest.param(
            _with(save_seconds_p95=float("nan")), "'save_seconds_p95' must be a finite", id="nan"
        ),
    ],
)
def test_a_malformed_cost_file_raises_a_config_error_that_names_it(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "cost.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="cost file") as raised:
        read_cost_file(path)
    assert says in str(raised.value) and str(path) in str(raised.value)


def test_a_missing_cost_file_is_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_cost_file(tmp_path / "nope.json")


# --- the loop -------------------------------------------------------------------------------------


def test_a_missing_file_is_waited_for_quietly_then_read(watched: Any, caplog: Any) -> None:
    sidecar, sink, path = watched
    with caplog.at_level(logging.DEBUG, logger="preemptible"):
        assert sidecar.poll() is None
        assert sidecar.poll() is None
    assert not caplog.records
    write_cost_file(path, cost())
    assert sidecar.poll() == cost()
    assert sink.got.wait(5) and sink.costs == [cost()]


def test_each_rewrite_is_handed_on_once_and_an_unchanged_file_not_again(
    watched: Any, caplog: Any
) -> None:
    sidecar, sink, path = watched
    with caplog.at_level(logging.INFO, logger="preemptible"):
        write_cost_file(path, cost(step=10))
        assert sidecar.poll() == cost(step=10)
        assert sidecar.poll() is None  # same file
        write_cost_file(path, cost(step=10), now=AT + 99)  # rewritten, same cost
        assert sidecar.poll() is None
        write_cost_file(path, cost(step=15, nbytes=2000))
        assert sidecar.poll() == cost(step=15, nbytes=2000)
        assert sidecar.reporters.flush()
    assert [c.last_checkpoint_step for c in sink.costs] == [10, 15]
    news = [r.getMessage() for r in caplog.records if "new cost" in r.getMessage()]
    assert news == [
        "new cost: step 10, save p95 2.000 s, restore 1.500 s, 1000 bytes",
        "new cost: step 15, save p95 2.000 s, restore 1.500 s, 2000 bytes",
    ]


def test_a_malformed_file_is_logged_once_and_the_last_good_values_stay(
    watched: Any, caplog: Any
) -> None:
    sidecar, sink, path = watched
    write_cost_file(path, cost(step=10))
    sidecar.poll()
    with caplog.at_level(logging.WARNING, logger="preemptible"):
        path.write_text("{not json")
        assert sidecar.poll() is None
        path.write_text('{"still": "not a cost file"}')  # another bad version: no new line
        assert sidecar.poll() is None
    assert sidecar.cost == cost(step=10)
    [warning] = caplog.records
    assert "is not JSON" in warning.getMessage()
    assert "keeping the last good values" in warning.getMessage()
    write_cost_file(path, cost(step=20))
    assert sidecar.poll() == cost(step=20)
    assert sidecar.reporters.flush()
    assert [c.last_checkpoint_step for c in sink.costs] == [10, 20]


def test_a_file_without_a_measured_save_is_not_reported(watched: Any) -> None:
    sidecar, sink, path = watched
    write_cost_file(path, CostTracker().snapshot())  # all zeros: 0 s would be a lie
    assert sidecar.poll() is None
    assert sidecar.reporters.flush() and sink.costs == []


def test_stop_ends_the_loop_at_once_and_close_closes_the_reporters(watched: Any) -> None:
    sidecar, sink, path = watched
    sidecar.poll_s = 30.0
    runner = threading.Thread(target=sidecar.run)
    runner.start()
    write_cost_file(path, cost())
    time.sleep(0.2)  # the loop is in its 30 s wait now
    started = time.monotonic()
    sidecar.stop()
    runner.join(timeout=5)
    assert not runner.is_alive() and time.monotonic() - started < 1.0
    sidecar.close()
    assert sink.closed


# --- options and reporters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        pytest.param({"annotations": False}, "nowhere to report", id="no sink"),
        pytest.param({"poll_s": 0.0}, "--poll-seconds", id="zero poll"),
        pytest.param({"poll_s": float("inf")}, "--poll-seconds", id="inf poll"),
        pytest.param({"metrics_port": 70000}, "--metrics-port", id="port"),
    ],
)
def test_bad_options_raise_a_config_error_naming_the_flag(
    tmp_path: Path, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        SidecarOptions(cost_file=tmp_path / "c.json", **options)


def test_annotations_outside_a_pod_or_without_a_token_are_refused_with_the_fix(
    tmp_path: Path,
) -> None:
    pytest.importorskip("kubernetes")
    options = SidecarOptions(cost_file=tmp_path / "c.json", service_account_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"KUBERNETES_SERVICE_HOST .* not set"):
        Sidecar.from_options(options, {})
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match=f"no service-account token in {tmp_path}"):
        Sidecar.from_options(options, env)


def test_a_metrics_port_in_use_is_a_config_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        options = SidecarOptions(
            cost_file=tmp_path / "c.json", annotations=False, metrics_port=port
        )
        with pytest.raises(ConfigError, match=f"cannot serve /metrics on 127.0.0.1:{port}"):
            Sidecar.from_options(options, {})


def test_the_cli_spells_the_constants_of_the_modules() -> None:
    from preemptible.cli import sidecar as cli
    from preemptible.runtime import sidecar
    from preemptible.runtime.reporters import kubernetes

    # The variable names come from preemptible._env_names on both sides (a house rule).
    assert cli.SERVICE_ACCOUNT_DIR == kubernetes.SERVICE_ACCOUNT_DIR
    assert cli.DEFAULT_POLL_S == sidecar.DEFAULT_POLL_S


# --- against the local API server -----------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("kubernetes")
    from tests.k8s_api import fake_cluster

    with fake_cluster(tmp_path, namespace="ml") as fake:
        yield fake


def annotations_sent(cluster: Any) -> list[dict[str, str]]:
    return [r["body"]["metadata"]["annotations"] for r in cluster.server.requests]


def test_a_rewritten_cost_file_becomes_a_patch_with_the_new_values(
    cluster: Any, tmp_path: Path
) -> None:
    path = tmp_path / "cost.json"
    options = SidecarOptions(
        cost_file=path, pod="train-x7", service_account_dir=cluster.service_account_dir
    )
    sidecar = Sidecar.from_options(options, cluster.env)  # namespace: the account's file
    assert sidecar.targets == (
        f"the annotations of pod ml/train-x7 (https://127.0.0.1:{cluster.server.port})",
    )
    try:
        write_cost_file(path, cost(step=10, p95=2.0, nbytes=1000))
        sidecar.poll()
        cluster.server.wait_for(1)
        write_cost_file(path, cost(step=20, p95=5.0, nbytes=1000))  # p95 x2.5: past the limit
        sidecar.poll()
        cluster.server.wait_for(2)
    finally:
        sidecar.close()
    first, second = cluster.server.requests
    assert first["path"] == second["path"] == "/api/v1/namespaces/ml/pods/train-x7"
    assert annotations_sent(cluster) == [
        {
            "preemptible.dev/save-seconds-p95": "2.000",
            "preemptible.dev/restore-seconds": "1.500",
            "preemptible.dev/checkpoint-bytes": "1000",
            "preemptible.dev/last-checkpoint-time": "2026-01-01T00:00:10Z",
        },
        {
            "preemptible.dev/save-seconds-p95": "5.000",
            "preemptible.dev/restore-seconds": "1.500",
            "preemptible.dev/checkpoint-bytes": "1000",
            "preemptible.dev/last-checkpoint-time": "2026-01-01T00:00:20Z",
        },
    ]


def test_flags_beat_the_downward_api_variables(cluster: Any, tmp_path: Path) -> None:
    env = {**cluster.env, "POD_NAME": "from-env", "POD_NAMESPACE": "env-ns"}
    base = SidecarOptions(
        cost_file=tmp_path / "c.json", service_account_dir=cluster.service_account_dir
    )
    by_env = Sidecar.from_options(base, env)
    by_flags = Sidecar.from_options(
        SidecarOptions(
            cost_file=tmp_path / "c.json",
            pod="flag-pod",
            namespace="flag-ns",
            service_account_dir=cluster.service_account_dir,
        ),
        env,
    )
    by_env.close()
    by_flags.close()
    assert "pod env-ns/from-env " in by_env.targets[0]
    assert "pod flag-ns/flag-pod " in by_flags.targets[0]


def test_an_unreadable_file_is_logged_once_not_raised(
    watched: Any, caplog: Any, tmp_path: Path
) -> None:
    sidecar, _sink, path = watched
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()  # a directory where the file should be: read_bytes fails with an OSError
    with caplog.at_level(logging.WARNING, logger="preemptible"):
        assert sidecar.poll() is None
        os.utime(path, ns=(1, 1))  # changed: looked at again, still unreadable, still one line
        assert sidecar.poll() is None
    assert len(caplog.records) == 1 and "nothing reported yet" in caplog.records[0].getMessage()
