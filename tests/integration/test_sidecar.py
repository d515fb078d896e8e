"""The real `preemptible sidecar` process, the real ``kubernetes`` client, a real SIGTERM.

The sidecar runs as a subprocess with the environment a pod gives it (``KUBERNETES_SERVICE_*``,
the downward API's ``POD_NAME``) and a service-account dir made in ``tmp_path``; the API server is
the local HTTPS server of `tests.k8s_api`, which records each request. This is not a cluster test:
no API server can run on our machines, so RBAC, admission and a real pod are not exercised.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("kubernetes")

from preemptible.checkpoint.stats import CheckpointCost, Summary
from preemptible.runtime.cost_file import read_cost_file, write_cost_file
from preemptible.runtime.reporters.kubernetes import cost_annotations
from tests.k8s_api import TOKEN, FakeCluster, assert_pod_patch, fake_cluster
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
AT = 1_767_225_600.0  # 2026-01-01T00:00:00Z
TIMEOUT = 30.0
TRAINER_ARGS = ("--steps", "20", "--every", "5", "--sync", "--dir")


class SidecarProcess:
    """`python -m preemptible sidecar ...` with its stderr collected line by line."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "preemptible", "sidecar", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
            process_group=0,
        )
        self.lines: list[str] = []  # appended by the reader thread
        self.stdout = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = TIMEOUT) -> re.Match[str]:
        """The first line that matches `pattern` (a regex), waiting for it."""
        regex = re.compile(pattern)

        def seen() -> re.Match[str] | None:
            exited = self.proc.poll() is not None
            if exited:
                self._reader.join(timeout=5)  # every line it wrote is in
            found = next((m for m in map(regex.search, list(self.lines)) if m), None)
            assert found or not exited, f"exit {self.proc.returncode} before {pattern!r}; {said()}"
            return found

        def said() -> str:
            return "the sidecar said:\n" + "\n".join(self.lines)

        return wait_until(seen, f"a line matching {pattern!r}", timeout=timeout, describe=said)

    def terminate(self, timeout: float) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)  # it writes nothing to stdout: no pipe fills
        self._reader.join(timeout=5)
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def cost(*, step: int, p95: float, nbytes: int) -> CheckpointCost:
    save = Summary(last=p95, mean=p95, p95=p95, count=step)
    return CheckpointCost(
        save=save,
        stall=Summary(mean=0.01, p95=0.02),
        persist=save,
        restore=Summary(last=0.75),
        bytes=nbytes,
        last_checkpoint_step=step,
        last_checkpoint_time=AT + step,
    )


def pod_env(cluster: FakeCluster, **extra: str) -> dict[str, str]:
    """What the pod's sidecar container sees: the service variables, the downward API, no more."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        **cluster.env,
        "POD_NAME": "train-abc12",
        "PREEMPTIBLE_SERVICE_ACCOUNT_DIR": str(cluster.service_account_dir),
        "PREEMPTIBLE_LOG_LEVEL": "DEBUG",  # the token must stay out of even the debug log
        **extra,
    }


def iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def metrics(port: int) -> dict[str, float]:
    """The gauges ``/metrics`` serves, by name."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    pairs = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def wait_gauge(port: int, name: str, value: float, timeout: float = TIMEOUT) -> dict[str, float]:
    """``/metrics`` once gauge `name` holds `value` (the reporters' thread sets it)."""

    def holds() -> dict[str, float] | None:
        seen = metrics(port)
        return seen if seen.get(name) == value else None

    return wait_until(
        holds,
        f"{name} to be {value}",
        timeout=timeout,
        describe=lambda: f"/metrics: {metrics(port)}",
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    with fake_cluster(tmp_path / "k8s-api", namespace="team-a") as fake:
        yield fake


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """The emptyDir both containers mount."""
    path = tmp_path / "shared"
    path.mkdir()
    return path


def start_sidecar(cluster: FakeCluster, cost_file: Path) -> tuple[SidecarProcess, int]:
    sidecar = SidecarProcess(
        ["--cost-file", str(cost_file), "--metrics-port", "0", "--poll-seconds", "0.1"],
        pod_env(cluster),
    )
    start = sidecar.wait_line(r"watching .* reporting to .*/metrics on http://127\.0\.0\.1:(\d+)")
    return sidecar, int(start.group(1))


def test_the_sidecar_patches_its_pod_serves_metrics_and_exits_0_on_sigterm(
    cluster: FakeCluster, shared: Path
) -> None:
    cost_file = shared / "cost.json"
    sidecar, port = start_sidecar(cluster, cost_file)
    try:
        start = sidecar.lines[-1]
        api = f"https://127.0.0.1:{cluster.server.port}"
        assert f"the annotations of pod team-a/train-abc12 ({api})" in start
        # 1. the trainer's first save
        write_cost_file(cost_file, cost(step=100, p95=2.5, nbytes=4096))
        cluster.server.wait_for(1, timeout=TIMEOUT)
        gauges = wait_gauge(port, "preemptible_checkpoint_bytes", 4096)
        assert gauges["preemptible_save_seconds"] == 2.5
        assert gauges["preemptible_restore_seconds"] == 0.75
        assert gauges["preemptible_last_checkpoint_timestamp_seconds"] == AT + 100
        # 2. a later save, large enough a change to pass the 30 s rate limit at once
        write_cost_file(cost_file, cost(step=200, p95=6.0, nbytes=4096))
        cluster.server.wait_for(2, timeout=TIMEOUT)
        wait_gauge(port, "preemptible_save_seconds", 6.0)
        # 3. the kubelet's SIGTERM
        started = time.monotonic()
        code = sidecar.terminate(timeout=TIMEOUT)
        took = time.monotonic() - started
    finally:
        sidecar.kill()
    assert code == 0 and took < 3.0, f"exit {code} after {took:.1f} s"

    first, second = cluster.server.requests
    assert_pod_patch(
        first,
        namespace="team-a",
        pod="train-abc12",
        annotations={
            "preemptible.dev/save-seconds-p95": "2.500",
            "preemptible.dev/restore-seconds": "0.750",
            "preemptible.dev/checkpoint-bytes": "4096",
            "preemptible.dev/last-checkpoint-time": "2026-01-01T00:01:40Z",
        },
    )
    assert_pod_patch(second, namespace="team-a", pod="train-abc12", annotations=None)
    assert second["body"]["metadata"]["annotations"]["preemptible.dev/save-seconds-p95"] == "6.000"
    assert second["body"]["metadata"]["annotations"]["preemptible.dev/last-checkpoint-time"] == (
        "2026-01-01T00:03:20Z"
    )

    ours = [line for line in sidecar.lines if "preemptible.runtime.sidecar:" in line]
    assert sum("INFO" in line and "watching" in line for line in ours) == 1
    assert sum("INFO" in line and "new cost" in line for line in ours) == 2
    assert any("SIGTERM received: stopping" in line for line in ours)
    assert not [line for line in ours if "WARNING" in line]  # the missing file was no warning
    assert TOKEN not in sidecar.stdout + "\n".join(sidecar.lines)


def test_bad_input_is_one_error_line_and_exit_2(cluster: FakeCluster, shared: Path) -> None:
    env = pod_env(cluster, PREEMPTIBLE_SERVICE_ACCOUNT_DIR=str(shared / "no-account"))
    done = subprocess.run(
        [sys.executable, "-m", "preemptible", "sidecar", "--cost-file", str(shared / "c.json")],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "300"},
        cwd=REPO,
        timeout=TIMEOUT,
    )
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("error: no service-account token in ") and "no-account" in line


def test_a_trainer_without_credentials_writes_the_file_the_sidecar_reports(
    cluster: FakeCluster, shared: Path, tmp_path: Path
) -> None:
    """The Job's trainer command (integrations/kubernetes/job.yaml), shortened."""
    cost_file = shared / "cost.json"
    sidecar, port = start_sidecar(cluster, cost_file)
    try:
        # What the kubelet gives a container with automountServiceAccountToken: false: the
        # service variables, no token (none is mounted at the default path on this machine).
        trainer_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PREEMPTIBLE_")},
            "KUBERNETES_SERVICE_HOST": cluster.env["KUBERNETES_SERVICE_HOST"],
            "KUBERNETES_SERVICE_PORT": cluster.env["KUBERNETES_SERVICE_PORT"],
            "PREEMPTIBLE_COST_FILE": str(cost_file),
            "PREEMPTIBLE_POD_GRACE_SECONDS": "120",
        }
        started_at = time.time()
        trainer = subprocess.run(
            [sys.executable, "examples/plain_pytorch.py", *TRAINER_ARGS, str(tmp_path / "ckpt")],
            capture_output=True,
            text=True,
            env=trainer_env,
            cwd=REPO,
            timeout=60,
        )
        assert trainer.returncode == 0, trainer.stderr
        written = read_cost_file(cost_file)
        assert written.last_checkpoint_step == 19 and written.save.count == 4  # 4, 9, 14, 19
        assert written.last_checkpoint_time is not None
        gauges = wait_gauge(
            port, "preemptible_last_checkpoint_timestamp_seconds", written.last_checkpoint_time
        )
        assert gauges["preemptible_save_seconds"] == written.save.p95
        cluster.server.wait_for(1, timeout=TIMEOUT)
        code = sidecar.terminate(timeout=TIMEOUT)
    finally:
        sidecar.kill()
    assert code == 0
    # The gauges followed every rewrite up to the last save (above). The first patch carries
    # the save the sidecar saw first, an earlier one perhaps: the 30 s rate limit holds the
    # later ones back. So it is checked for its keys and its time, between start and last save.
    [request, *_later] = cluster.server.requests
    assert request["path"] == "/api/v1/namespaces/team-a/pods/train-abc12"
    patched: dict[str, str] = request["body"]["metadata"]["annotations"]
    assert set(patched) == set(cost_annotations(written))
    at = patched["preemptible.dev/last-checkpoint-time"]
    assert iso(started_at) <= at <= iso(written.last_checkpoint_time)
    assert TOKEN not in trainer.stdout + trainer.stderr
