"""`preemptible sidecar`: the trainer's cost file, sent to the pod's annotations and /metrics.

    preemptible sidecar --cost-file PATH [--pod NAME --namespace NS] [--metrics-port N]

Runs until SIGTERM or SIGINT, then exits 0. Bad input prints one ``error:`` line and exits 2.
The work is `preemptible.runtime.sidecar`; this module only parses and reports.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from preemptible._env_names import COST_FILE_ENV, LOG_LEVEL_ENV, SERVICE_ACCOUNT_DIR_ENV
from preemptible.cli._common import fail
from preemptible.errors import PreemptibleError

# Spelled out rather than imported: `preemptible.runtime.sidecar` loads prometheus-client and
# the reporters, which `preemptible --help` need not pay for. A test checks that they equal the
# constants of `preemptible.runtime.sidecar` and the reporter.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_POLL_S = 1.0

CostFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--cost-file",
        envvar=COST_FILE_ENV,
        show_envvar=True,
        metavar="PATH",
        help="The cost file the trainer writes, on a volume both containers mount (required).",
        show_default=False,
    ),
]
PodOpt = Annotated[
    str | None,
    typer.Option(
        "--pod",
        metavar="NAME",
        help="This pod's name (default: $POD_NAME, then $HOSTNAME).",
        show_default=False,
    ),
]
NamespaceOpt = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        metavar="NS",
        help="This pod's namespace (default: $POD_NAMESPACE, then the service account's).",
        show_default=False,
    ),
]
AnnotationsOpt = Annotated[
    bool,
    typer.Option(
        "--annotations/--no-annotations",
        help="Patch the pod's annotations (off: serve /metrics only).",
    ),
]
MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        metavar="N",
        help="Serve Prometheus gauges on this port at /metrics (default: not served).",
        show_default=False,
    ),
]
MetricsAddrOpt = Annotated[
    str,
    typer.Option(
        "--metrics-addr",
        metavar="ADDR",
        help="Address /metrics listens on; 0.0.0.0 lets Prometheus scrape the pod's IP.",
    ),
]
PollOpt = Annotated[
    float,
    typer.Option("--poll-seconds", metavar="SECONDS", help="Seconds between looks at the file."),
]
ServiceAccountOpt = Annotated[
    Path,
    typer.Option(
        "--service-account-dir",
        envvar=SERVICE_ACCOUNT_DIR_ENV,
        show_envvar=True,
        metavar="DIR",
        help="The mounted service account: token, ca.crt, namespace.",
    ),
]


def sidecar_command(
    cost_file: CostFileOpt = None,
    pod: PodOpt = None,
    namespace: NamespaceOpt = None,
    annotations: AnnotationsOpt = True,
    metrics_port: MetricsPortOpt = None,
    metrics_addr: MetricsAddrOpt = "127.0.0.1",
    poll_seconds: PollOpt = DEFAULT_POLL_S,
    service_account_dir: ServiceAccountOpt = Path(SERVICE_ACCOUNT_DIR),
) -> None:
    """Watch the trainer's cost file; patch this pod's annotations and serve /metrics.

    Run it as a second container of the training pod (integrations/kubernetes/job.yaml): the trainer writes its measured checkpoint cost to $PREEMPTIBLE_COST_FILE on a shared emptyDir after every save, and the sidecar patches the pod's preemptible.dev/ annotations with it (a JSON merge patch, through the in-cluster service account) and sets the Prometheus gauges. Only the sidecar mounts a token, so the trainer needs no API credentials.

    A missing file is waited for (the trainer writes it after its first save); an unreadable one is logged once and the last good values are kept. It logs one line at start and one per new cost, and exits 0 on SIGTERM or SIGINT.

    /metrics listens on 127.0.0.1 unless --metrics-addr says otherwise; the Job passes 0.0.0.0 so that Prometheus can scrape the pod's IP.
    """  # noqa: E501 (typer keeps line breaks in help: one paragraph per line)
    if cost_file is None:
        fail(f"--cost-file PATH (or ${COST_FILE_ENV}) is required: the file the trainer writes")
    level = os.environ.get(LOG_LEVEL_ENV, "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        fail(f"${LOG_LEVEL_ENV} must be DEBUG, INFO, WARNING or ERROR, got {level!r}")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from preemptible.runtime.sidecar import Sidecar, SidecarOptions, run_until_signalled

    try:
        options = SidecarOptions(
            cost_file=cost_file,
            pod=pod,
            namespace=namespace,
            annotations=annotations,
            metrics_port=metrics_port,
            metrics_addr=metrics_addr,
            poll_s=poll_seconds,
            service_account_dir=service_account_dir,
        )
        sidecar = Sidecar.from_options(options, os.environ)
    except PreemptibleError as error:
        fail(error)
    run_until_signalled(sidecar)
