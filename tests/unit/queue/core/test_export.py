"""`preemptible queue export`: Kueue objects checked against Kueue's CRD schemas, SLURM settings
parsed back, the CLI, and the checked-in integrations/kubernetes/kueue.yaml.

No Kubernetes API server runs here (none is installable on our machines). Instead every Kueue
object is validated against the `openAPIV3Schema` of its CRD and version (copied with Kueue's
licence into tests/data/kueue-schemas/), made strict: unknown fields fail, as with the API
server's strict field validation, where a plain structural schema would prune them silently.
The CEL rules (`x-kubernetes-validations`) that the objects touch are checked by hand.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from preemptible.cli.queue import app
from preemptible.errors import ConfigError
from preemptible.queue.core import parse_config_text
from preemptible.queue.core.config import QueueConfig
from preemptible.queue.export import (
    TIER_PRIORITY,
    export_files,
    kueue_objects,
    kueue_yaml,
    sacctmgr_script,
    slurm_conf,
)

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[4]
EXAMPLE = ROOT / "examples" / "queue.toml"
SCHEMAS = ROOT / "tests" / "data" / "kueue-schemas"
CHECKED_IN = ROOT / "integrations" / "kubernetes" / "kueue.yaml"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# Fractional CPUs and memory, a queue with no nominal table (unlimited CPUs and memory), a queue
# with fractional weight, capacity that no queue is guaranteed, preemption off, no backfill.
ODD = """
[cluster]
gpus = 16
cpus = 48.5
memory_gb = 300.5
[policy]
backfill = false
fair_share_half_life = "36h"
[preemption]
enabled = false
grace_max = "90s"
[[queues]]
name = "research"
weight = 1.5
nominal = { gpus = 6, cpus = 12.25, memory_gb = 64.5 }
borrowing_limit = { gpus = 2, cpus = 4 }
[[queues]]
name = "prod-2"
weight = 0.5
"""


def example() -> QueueConfig:
    return parse_config_text(EXAMPLE.read_text(), path=EXAMPLE)


def odd() -> QueueConfig:
    return parse_config_text(ODD)


# --- validation helpers --------------------------------------------------------------------------


@cache
def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema, from the copied CRDs."""
    out = {}
    for path in sorted(SCHEMAS.glob("kueue.x-k8s.io_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            out[(f"{group}/{version['name']}", kind)] = schema
    return out


def _strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists its fields."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def validate_kueue(obj: dict[str, Any]) -> None:
    schema = _crd_schemas()[(obj["apiVersion"], obj["kind"])]
    jsonschema.Draft202012Validator(schema).validate(obj)
    assert _DNS_LABEL.match(obj["metadata"]["name"])
    if "namespace" in obj["metadata"]:
        assert _DNS_LABEL.match(obj["metadata"]["namespace"])
    _check_cel_rules(obj)


def _check_cel_rules(obj: dict[str, Any]) -> None:
    """The CRDs' x-kubernetes-validations that these objects can break, by hand."""
    spec = obj.get("spec", {})
    for group in spec.get("resourceGroups", []):
        # "flavors must have the same number of resources as the coveredResources"
        for flavor in group["flavors"]:
            assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
    if obj["kind"] == "ClusterQueue":
        preemption = spec["preemption"]
        # "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never"
        assert not (
            preemption["reclaimWithinCohort"] == "Never"
            and preemption["borrowWithinCohort"]["policy"] != "Never"
        )
        # "borrowingLimit must be nil when cohort is empty"
        assert spec.get("cohortName") or spec.get("cohort")


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def quotas(cluster_queue: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [group] = cluster_queue["spec"]["resourceGroups"]
    [flavor] = group["flavors"]
    return {r["name"]: {k: v for k, v in r.items() if k != "name"} for r in flavor["resources"]}


# --- Kueue: schemas ------------------------------------------------------------------------------


@pytest.mark.parametrize("api_version", ["v1beta2", "v1beta1"])
@pytest.mark.parametrize("config", [example, odd], ids=["example", "odd"])
def test_every_kueue_object_validates_against_its_crd_schema(config: Any, api_version: str):
    objects = kueue_objects(config(), api_version=api_version)
    kinds = set()
    for obj in objects:
        kinds.add(obj["kind"])
        if obj["apiVersion"] == "v1":
            continue  # core kinds: see the kubernetes-validate test
        assert obj["apiVersion"] == f"kueue.x-k8s.io/{api_version}"
        validate_kueue(obj)
    assert kinds == {
        "ResourceFlavor",
        "Cohort",
        "ClusterQueue",
        "LocalQueue",
        "WorkloadPriorityClass",
        "Namespace",
    }


def test_the_strict_schema_catches_a_field_of_the_other_version():
    cq = by_kind(kueue_objects(example(), api_version="v1beta2"), "ClusterQueue")["team-a"]
    cq["spec"]["cohort"] = cq["spec"].pop("cohortName")  # v1beta1's name for the field
    with pytest.raises(jsonschema.ValidationError, match="cohort"):
        validate_kueue(cq)


def test_core_kinds_validate_with_kubernetes_validate():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    core = [o for o in kueue_objects(example()) if o["apiVersion"] == "v1"]
    assert [o["kind"] for o in core] == ["Namespace"] * 3
    for obj in core:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_the_yaml_holds_the_objects_after_a_comment():
    text = kueue_yaml(example())
    assert text.startswith("# ")
    assert list(yaml.safe_load_all(text)) == kueue_objects(example())


# --- Kueue: what the objects say -----------------------------------------------------------------


def test_quotas_and_borrowing_limits_come_from_the_example_queues():
    cqs = by_kind(kueue_objects(example()), "ClusterQueue")
    assert sorted(cqs) == ["team-a", "team-b", "team-c"]
    assert quotas(cqs["team-a"]) == {
        "nvidia.com/gpu": {"nominalQuota": 4, "borrowingLimit": 4},
        "cpu": {"nominalQuota": 32},
        "memory": {"nominalQuota": "256Gi"},
    }
    assert quotas(cqs["team-b"])["nvidia.com/gpu"] == {"nominalQuota": 2, "borrowingLimit": 4}
    assert quotas(cqs["team-c"])["nvidia.com/gpu"] == {"nominalQuota": 2, "borrowingLimit": 6}
    for cq in cqs.values():
        assert cq["spec"]["cohortName"] == "preemptible"
        assert cq["spec"]["queueingStrategy"] == "BestEffortFIFO"


def test_weights_become_fair_sharing_weights():
    cqs = by_kind(kueue_objects(example()), "ClusterQueue")
    assert {n: cq["spec"]["fairSharing"]["weight"] for n, cq in cqs.items()} == {
        "team-a": 2,
        "team-b": 1,
        "team-c": 1,
    }
    odd_cqs = by_kind(kueue_objects(odd()), "ClusterQueue")
    assert odd_cqs["research"]["spec"]["fairSharing"]["weight"] == "1.5"
    assert odd_cqs["prod-2"]["spec"]["fairSharing"]["weight"] == "0.5"


def test_tiers_become_priority_classes_in_tier_order():
    classes = by_kind(kueue_objects(example()), "WorkloadPriorityClass")
    values = {name: wpc["value"] for name, wpc in classes.items()}
    assert values == {"critical": 200, "high": 100, "normal": 0, "low": -100}
    assert values == {tier.value: v for tier, v in TIER_PRIORITY.items()}
    assert values["critical"] > values["high"] > values["normal"] > values["low"]


def test_preemption_mirrors_reclaim_and_tiers():
    for cq in by_kind(kueue_objects(example()), "ClusterQueue").values():
        assert cq["spec"]["preemption"] == {
            "reclaimWithinCohort": "Any",
            "borrowWithinCohort": {"policy": "LowerPriority"},
            "withinClusterQueue": "LowerPriority",
        }


def test_preemption_off_and_no_backfill_turn_kueue_preemption_off():
    for cq in by_kind(kueue_objects(odd()), "ClusterQueue").values():
        assert cq["spec"]["preemption"] == {
            "reclaimWithinCohort": "Never",
            "borrowWithinCohort": {"policy": "Never"},
            "withinClusterQueue": "Never",
        }
        assert cq["spec"]["queueingStrategy"] == "StrictFIFO"


def test_capacity_no_queue_is_guaranteed_belongs_to_the_cohort():
    objects = kueue_objects(odd())
    assert by_kind(objects, "Cohort")["preemptible"]["spec"] == {
        "resourceGroups": [
            {
                "coveredResources": ["nvidia.com/gpu", "cpu", "memory"],
                "flavors": [
                    {
                        "name": "default-flavor",
                        "resources": [
                            {"name": "nvidia.com/gpu", "nominalQuota": 10},
                            {"name": "cpu", "nominalQuota": "36250m"},
                            {"name": "memory", "nominalQuota": "236Gi"},
                        ],
                    }
                ],
            }
        ]
    }
    # The example guarantees the whole cluster: the cohort holds nothing of its own.
    assert by_kind(kueue_objects(example()), "Cohort")["preemptible"]["spec"] == {}


def test_fractional_amounts_and_unlimited_nominal_quotas():
    cqs = by_kind(kueue_objects(odd()), "ClusterQueue")
    assert quotas(cqs["research"]) == {
        "nvidia.com/gpu": {"nominalQuota": 6, "borrowingLimit": 2},
        "cpu": {"nominalQuota": "12250m", "borrowingLimit": 4},
        "memory": {"nominalQuota": "66048Mi"},
    }
    # No nominal table: no GPUs guaranteed, CPUs and memory unlimited; borrowing unlimited.
    assert quotas(cqs["prod-2"]) == {
        "nvidia.com/gpu": {"nominalQuota": 0},
        "cpu": {"nominalQuota": 0},
        "memory": {"nominalQuota": "0Gi"},
    }
    assert "Unlimited nominal quotas, for prod-2 (cpus), prod-2 (memory_gb)" in " ".join(
        line.lstrip("# ") for line in kueue_yaml(odd()).splitlines()
    )


def test_local_queues_live_in_one_namespace_per_queue_or_the_one_given():
    objects = kueue_objects(example())
    lqs = by_kind(objects, "LocalQueue")
    assert {
        n: (lq["metadata"]["namespace"], lq["spec"]["clusterQueue"]) for n, lq in lqs.items()
    } == {
        "team-a": ("team-a", "team-a"),
        "team-b": ("team-b", "team-b"),
        "team-c": ("team-c", "team-c"),
    }
    assert sorted(by_kind(objects, "Namespace")) == ["team-a", "team-b", "team-c"]
    shared = kueue_objects(example(), namespace="ml", cohort="gpus", flavor="h100")
    assert {lq["metadata"]["namespace"] for lq in by_kind(shared, "LocalQueue").values()} == {"ml"}
    assert sorted(by_kind(shared, "Namespace")) == ["ml"]
    assert sorted(by_kind(shared, "Cohort")) == ["gpus"]
    assert sorted(by_kind(shared, "ResourceFlavor")) == ["h100"]
    for obj in shared:
        if obj["apiVersion"] != "v1":
            validate_kueue(obj)


def test_the_comment_says_what_kueue_cannot_express():
    header = kueue_yaml(example()).split("\n---\n")[0]
    text = " ".join(line.lstrip("# ") for line in header.splitlines())
    assert "terminationGracePeriodSeconds" in text
    assert "clamp(1.5 * save_p95 + 10s, 30s, 1m)" in text
    assert "Minimum runtime" in text
    assert "half-life of 7d" in text
    assert "fairSharing: {enable: true}" in text
    assert "lent beyond a borrowing limit" in text  # the example's queues have limits


def test_the_comment_mentions_lending_beyond_limits_only_when_it_applies():
    unlimited = parse_config_text("[cluster]\ngpus = 8\n[[queues]]\nname = 'a'\n")
    assert "beyond a borrowing limit" not in kueue_yaml(unlimited)
    limited = parse_config_text(
        "[cluster]\ngpus = 8\n[policy]\nbeyond_limit = false\n[[queues]]\nname = 'a'\n"
        "nominal = { gpus = 4 }\nborrowing_limit = { gpus = 2 }\n"
    )
    assert "beyond a borrowing limit" not in kueue_yaml(limited)


def test_unscheduled_cpus_and_memory_are_not_covered_and_the_comment_says_so():
    config = parse_config_text(
        '[cluster]\ngpus = 4\n[[queues]]\nname = "a"\nnominal = {gpus = 4}\n'
    )
    [cq] = by_kind(kueue_objects(config), "ClusterQueue").values()
    assert cq["spec"]["resourceGroups"][0]["coveredResources"] == ["nvidia.com/gpu"]
    assert "excludeResourcePrefixes" in kueue_yaml(config)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[cluster]\ngpus = "auto"\n', "auto"),
        ('[cluster]\ngpus = 4\n[[queues]]\nname = "a"\nnominal = {gpus = 1.5}\n', "whole"),
        ('[cluster]\ngpus = 4\n[[queues]]\nname = "Team_A"\n', "Kubernetes name"),
        (
            '[cluster]\ngpus = 4\ncpus = 8\n[[queues]]\nname = "a"\nnominal = {cpus = 9}\n',
            "add up to 9",
        ),
    ],
    ids=["gpus-auto", "fractional-gpus", "bad-name", "cpus-over-cluster"],
)
def test_configs_kueue_cannot_take_raise_config_error(text: str, match: str):
    with pytest.raises(ConfigError, match=match):
        kueue_objects(parse_config_text(text))


def test_unknown_targets_and_versions_raise_config_error():
    with pytest.raises(ConfigError, match="kueue or slurm"):
        export_files(example(), "yarn")
    with pytest.raises(ConfigError, match="v1beta2 or v1beta1"):
        kueue_objects(example(), api_version="v1")


# --- SLURM ---------------------------------------------------------------------------------------


def parse_slurm_conf(text: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Top-level key=value settings and partitions by name, comments skipped."""
    settings: dict[str, str] = {}
    partitions: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        pairs = dict(pair.split("=", 1) for pair in line.split())
        if "PartitionName" in pairs:
            partitions[pairs["PartitionName"]] = pairs
        else:
            assert len(pairs) == 1, line
            settings.update(pairs)
    return settings, partitions


def test_slurm_conf_values_for_the_example():
    settings, partitions = parse_slurm_conf(slurm_conf(example()))
    assert settings == {
        "SchedulerType": "sched/backfill",
        "PreemptType": "preempt/partition_prio",
        "PreemptMode": "REQUEUE",
        "PreemptExemptTime": "0-00:05:00",
        "SlurmctldParameters": "preempt_send_user_signal",
        "JobRequeue": "1",
        "RequeueExit": "85",
        "PriorityType": "priority/multifactor",
        "PriorityDecayHalfLife": "7-00:00:00",
        "PriorityWeightFairshare": "10000",
        "PriorityWeightAge": "10000",
        "PriorityMaxAge": "0-02:00:00",
        "PriorityWeightPartition": "0",
        "PriorityWeightJobSize": "0",
        "PriorityWeightQOS": "0",
    }
    assert list(partitions) == ["low", "normal", "high", "critical"]
    assert [int(p["PriorityTier"]) for p in partitions.values()] == [1, 2, 3, 4]
    for name in ("low", "normal", "high"):
        assert partitions[name]["PreemptMode"] == "REQUEUE"
        assert partitions[name]["GraceTime"] == "60"  # grace_max = 1m
    assert partitions["critical"]["PreemptMode"] == "OFF"
    assert "GraceTime" not in partitions["critical"]
    assert [p["Default"] for p in partitions.values()] == ["NO", "YES", "NO", "NO"]
    assert {p["Nodes"] for p in partitions.values()} == {"ALL"}


def test_slurm_conf_without_preemption_or_backfill():
    settings, partitions = parse_slurm_conf(slurm_conf(odd()))
    assert settings["PreemptType"] == "preempt/none"
    assert settings["PreemptMode"] == "OFF"
    assert settings["SchedulerType"] == "sched/builtin"
    assert settings["PriorityDecayHalfLife"] == "1-12:00:00"
    assert {p["PreemptMode"] for p in partitions.values()} == {"OFF"}


def test_slurm_conf_comment_says_what_slurm_cannot_express():
    text = slurm_conf(example())
    assert "GraceTime is the largest grant (60s = grace_max)" in " ".join(
        line.lstrip("# ") for line in text.splitlines()
    )
    assert "#AccountingStorageType=accounting_storage/slurmdbd" in text


def sacctmgr_settings(script: str) -> dict[str, dict[str, str]]:
    out = {}
    for line in script.splitlines():
        if line.startswith("sacctmgr -i modify account "):
            words = line.split()
            out[words[4]] = dict(w.split("=", 1) for w in words[6:])
    return out


def test_sacctmgr_accounts_carry_fair_share_and_caps():
    script = sacctmgr_script(example())
    assert sacctmgr_settings(script) == {
        "team-a": {"Fairshare": "2", "GrpTRES": "gres/gpu=8,cpu=-1,mem=-1"},
        "team-b": {"Fairshare": "1", "GrpTRES": "gres/gpu=6,cpu=-1,mem=-1"},
        "team-c": {"Fairshare": "1", "GrpTRES": "gres/gpu=8,cpu=-1,mem=-1"},
    }
    assert subprocess.run(["sh", "-n"], input=script, text=True, check=False).returncode == 0
    odd_settings = sacctmgr_settings(sacctmgr_script(odd()))
    assert odd_settings["research"] == {"Fairshare": "150", "GrpTRES": "gres/gpu=8,cpu=17,mem=-1"}
    assert odd_settings["prod-2"] == {"Fairshare": "50", "GrpTRES": "gres/gpu=-1,cpu=-1,mem=-1"}


def test_slurm_takes_gpus_auto_but_not_names_slurm_cannot_use():
    auto = parse_config_text('[cluster]\ngpus = "auto"\n[[queues]]\nname = "a"\n')
    assert set(export_files(auto, "slurm")) == {"slurm.conf", "sacctmgr.sh"}
    bad = parse_config_text('[cluster]\ngpus = 4\n[[queues]]\nname = "team a"\n')
    with pytest.raises(ConfigError, match="SLURM account"):
        slurm_conf(bad)


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_writes_the_kueue_file_and_says_where(tmp_path: Path):
    result = CliRunner().invoke(app, ["export", "--to", "kueue", str(EXAMPLE), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "kueue.yaml").read_text() == kueue_yaml(example())
    assert f"wrote {tmp_path / 'kueue.yaml'}" in result.output


def test_cli_writes_the_slurm_files(tmp_path: Path):
    out = tmp_path / "new"
    result = CliRunner().invoke(app, ["export", "--to", "slurm", str(EXAMPLE), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "slurm.conf").read_text() == slurm_conf(example())
    assert (out / "sacctmgr.sh").read_text() == sacctmgr_script(example())
    assert (out / "sacctmgr.sh").stat().st_mode & 0o111
    assert sorted(p.name for p in out.iterdir()) == ["sacctmgr.sh", "slurm.conf"]


def test_cli_prints_without_an_output_folder():
    result = CliRunner().invoke(
        app,
        ["export", "--to", "kueue", str(EXAMPLE), "--namespace", "ml", "--kueue-api", "v1beta1"],
    )
    assert result.exit_code == 0, result.output
    assert result.output == kueue_yaml(example(), namespace="ml", api_version="v1beta1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "kueue", "BAD"], "gpus"),
        (["--to", "slurm", "MISSING"], "cannot read"),
        (["--to", "yarn", "GOOD"], "kueue or slurm"),
        (["--to", "slurm", "--cohort", "x", "GOOD"], "--to kueue only"),
    ],
    ids=["bad-config", "missing-file", "unknown-target", "kueue-option-for-slurm"],
)
def test_cli_bad_input_prints_one_error_line_and_exits_2(
    tmp_path: Path, args: list[str], message: str
):
    bad = tmp_path / "bad.toml"
    bad.write_text('[cluster]\ngpus = "many"\n')
    paths = {"BAD": str(bad), "MISSING": str(tmp_path / "nope.toml"), "GOOD": str(EXAMPLE)}
    result = CliRunner().invoke(app, ["export", *(paths.get(a, a) for a in args)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


# --- the checked-in file -------------------------------------------------------------------------


def test_checked_in_kueue_yaml_matches_the_generator():
    assert CHECKED_IN.read_text() == kueue_yaml(example()), (
        "integrations/kubernetes/kueue.yaml is out of date; regenerate it with "
        "`preemptible queue export --to kueue examples/queue.toml -o integrations/kubernetes`"
    )


def test_both_exports_say_what_becomes_of_elastic_ranges():
    kueue_header = kueue_yaml(example()).split("\n---\n")[0]
    assert "Elastic ranges (min_gpus, gpus_multiple)" in kueue_header
    assert "v1beta1 (Kueue before v0.18) they cannot be expressed" in kueue_header
    assert "SLURM has no shrink or grow in place" in slurm_conf(example())
