"""Policy export: one queue configuration as Kueue objects or as SLURM settings.

The same `queue.toml` drives the simulator, the reference queue manager and, through this
package, a cluster's own scheduler. These are pure functions from a `QueueConfig` to text, one
back end per module (`kueue.py`, `slurm.py`); the CLI (`preemptible queue export`) writes the
text to files or stdout.

Neither scheduler can say everything the config says. Rather than drop a setting silently, each
output starts with comments that name what was not expressed and where it goes instead (the
negotiated grace, for example, becomes the pod's `terminationGracePeriodSeconds` or a SLURM
GraceTime that is an upper bound). docs/user-guide/schedulers.md explains the mapping.
"""

from __future__ import annotations

import enum
from typing import Any

from preemptible.errors import ConfigError
from preemptible.queue.core.config import QueueConfig
from preemptible.queue.export.kueue import (
    KUEUE_API_VERSIONS,
    TIER_PRIORITY,
    kueue_objects,
    kueue_yaml,
)
from preemptible.queue.export.slurm import sacctmgr_script, slurm_conf

__all__ = [
    "KUEUE_API_VERSIONS",
    "TIER_PRIORITY",
    "ExportTarget",
    "export_files",
    "kueue_objects",
    "kueue_yaml",
    "sacctmgr_script",
    "slurm_conf",
]


class ExportTarget(enum.StrEnum):
    """The schedulers `queue export` writes for."""

    KUEUE = "kueue"
    SLURM = "slurm"


def export_files(config: QueueConfig, to: ExportTarget | str, **options: Any) -> dict[str, str]:
    """The files of one export, by name: `kueue.yaml`, or `slurm.conf` and `sacctmgr.sh`.

    Args:
        config: the parsed queue configuration.
        to: "kueue" or "slurm".
        **options: passed to `kueue_yaml` (namespace, cohort, flavor, api_version).

    Raises:
        ConfigError: the target is unknown or the config cannot be exported to it.
    """
    try:
        target = ExportTarget(to)
    except ValueError:
        raise ConfigError(f"unknown export target {to!r}; use kueue or slurm") from None
    if target is ExportTarget.KUEUE:
        return {"kueue.yaml": kueue_yaml(config, **options)}
    if options:
        raise ConfigError(f"the slurm export takes no options (got {', '.join(sorted(options))})")
    return {"slurm.conf": slurm_conf(config), "sacctmgr.sh": sacctmgr_script(config)}
