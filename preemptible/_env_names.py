"""Every ``PREEMPTIBLE_*`` environment variable, named once.

The queue manager hands a job some of them and the SDK reads them; the launcher, the
reporters, the sidecar and the logs read the rest. Both sides import the names from here, so
a renamed variable cannot leave one side reading what the other no longer writes.
"""

from __future__ import annotations

PREFIX = "PREEMPTIBLE_"
"""The manager's own variables of this prefix (its admin token, or a SLURM lead time that does
not apply to jobs) are not inherited by a job; a job's come from its launch."""

# --- what the queue manager hands each job ------------------------------------------------------

URL_ENV = "PREEMPTIBLE_QUEUE_URL"
"""The queue manager's base URL: the job reports its cost and polls for notices there."""
JOB_ID_ENV = "PREEMPTIBLE_JOB_ID"
"""The job's id in the queue manager."""
TOKEN_ENV = "PREEMPTIBLE_TOKEN"
"""The job's own token: it may act for this job only."""
GRACE_ENV = "PREEMPTIBLE_GRACE_SECONDS"
"""Grace period in seconds, set by the queue manager or the user; beats every other source."""
COST_FILE_ENV = "PREEMPTIBLE_COST_FILE"
"""Where the job writes its measured checkpoint cost (read by the sidecar and the manager)."""
ATTEMPT_ENV = "PREEMPTIBLE_ATTEMPT"
"""Which attempt of the job this is, from 1."""
GPUS_ENV = "PREEMPTIBLE_GPUS"
"""How many GPUs this attempt has: an elastic job's size may change from one to the next."""
BEAT_ENV = "PREEMPTIBLE_BEAT_SECONDS"
"""How often the job reports its step to the queue manager, which watches it for hangs."""
ARRAY_ID_ENV = "PREEMPTIBLE_ARRAY_ID"
"""The array a job belongs to ("a7"); unset for a job submitted alone."""
ARRAY_INDEX_ENV = "PREEMPTIBLE_ARRAY_INDEX"
"""A job's index in its array (`queue submit --array 0-99`); unset for a job submitted alone."""

# --- what the user or the cluster sets -----------------------------------------------------------

SLURM_SIGNAL_ENV = "PREEMPTIBLE_SLURM_SIGNAL_SECONDS"
"""Mirror of ``sbatch --signal=...@N``: a number of seconds, or the ``--signal`` value itself."""
POD_GRACE_ENV = "PREEMPTIBLE_POD_GRACE_SECONDS"
"""Set by the pod spec to its ``terminationGracePeriodSeconds`` (Kubernetes does not expose it)."""
MTBF_ENV = "PREEMPTIBLE_MTBF_SECONDS"
"""The mean time between preemptions the checkpoint interval assumes."""
REPORTERS_ENV = "PREEMPTIBLE_REPORTERS"
"""Comma-separated reporter names (``kubernetes,slurm,prometheus``) or ``none``; unset: auto."""
METRICS_PORT_ENV = "PREEMPTIBLE_METRICS_PORT"
"""Serve the Prometheus gauges on 127.0.0.1 at this port."""
ANNOTATION_PREFIX_ENV = "PREEMPTIBLE_ANNOTATION_PREFIX"
"""The prefix of the pod annotations the Kubernetes reporter writes."""
SERVICE_ACCOUNT_DIR_ENV = "PREEMPTIBLE_SERVICE_ACCOUNT_DIR"
"""Where the sidecar reads its service account (token, ``ca.crt``, namespace); tests set it."""
LOG_LEVEL_ENV = "PREEMPTIBLE_LOG_LEVEL"
"""The log level of the queue manager and the sidecar (``INFO`` unless set)."""

NOTICES_ENV = "PREEMPTIBLE_NOTICES"
"""Which clouds' metadata servers to watch for notices: ``aws,gcp,azure``, ``auto`` or ``none``
(the default: unset costs nothing outside a cloud)."""
NOTICES_POLL_ENV = "PREEMPTIBLE_NOTICES_POLL_SECONDS"
"""Seconds between two polls of a cloud's metadata server (5 unless set; AWS asks for 5)."""
AWS_REBALANCE_ENV = "PREEMPTIBLE_AWS_REBALANCE"
"""What an AWS rebalance recommendation does: ``log`` (the default) or ``stop`` (save and exit)."""
AZURE_METADATA_ENDPOINT_ENV = "PREEMPTIBLE_AZURE_METADATA_ENDPOINT"
"""The Azure Instance Metadata Service's base URL (``http://169.254.169.254`` unless set)."""

CRASH_AT_ENV = "PREEMPTIBLE_CRASH_AT"
"""For the fault-injection tests only: the manager kills itself at this named moment."""

# --- what ``preemptible launch`` sets for its child ----------------------------------------------

LAUNCH_ENV = "PREEMPTIBLE_LAUNCH_PID"
"""Set by ``preemptible launch`` for its child: signals reach this process through it."""
LAUNCH_TRANSLATES_ENV = "PREEMPTIBLE_LAUNCH_TRANSLATES"
"""Comma-separated signals that ``preemptible launch`` turns into SIGTERM for its child."""
