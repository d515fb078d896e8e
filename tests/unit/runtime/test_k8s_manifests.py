"""integrations/kubernetes/job.yaml and rbac.yaml: valid objects that say what the docs say.

No Kubernetes API server runs in our tests. Every object is validated offline, strictly (an
unknown field fails), against the schemas `kubernetes-validate` ships for Kubernetes 1.29, the
first release with native sidecars on by default, and for the newest it ships. The rest are
checks of what the objects mean: the grace annotation, who gets the token, what the Role allows,
that the sidecar's arguments parse with the real CLI and the trainer's with the real script.
"""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from preemptible._env_names import COST_FILE_ENV, POD_GRACE_ENV
from preemptible.cli import app
from preemptible.runtime.reporters.kubernetes import SERVICE_ACCOUNT_DIR
from preemptible.runtime.sidecar import SidecarOptions

kubernetes_validate = pytest.importorskip("kubernetes_validate")

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "integrations" / "kubernetes"
GRACE_ANNOTATION = "preemptible.dev/grace-seconds"
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def load(name: str) -> list[dict[str, Any]]:
    return [obj for obj in yaml.safe_load_all((K8S / name).read_text()) if obj]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind]
    return found


JOB = one(load("job.yaml"), "Job")
POD = JOB["spec"]["template"]
SPEC = POD["spec"]
[SIDECAR] = SPEC["initContainers"]
[TRAINER] = SPEC["containers"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mounts_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def volumes() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in SPEC["volumes"]}


# --- the schemas ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["job.yaml", "rbac.yaml"])
def test_every_object_validates_strictly(name: str, version: str) -> None:
    objects = load(name)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_strict_schema_catches_a_misspelt_field() -> None:
    job = copy.deepcopy(JOB)
    job["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        kubernetes_validate.validate(job, "1.29.0", strict=True)


def test_every_object_lives_in_the_namespace_of_a_local_queue() -> None:
    queues = {
        (o["metadata"]["namespace"], o["metadata"]["name"])
        for o in load("kueue.yaml")
        if o["kind"] == "LocalQueue"
    }
    tiers = {
        o["metadata"]["name"] for o in load("kueue.yaml") if o["kind"] == "WorkloadPriorityClass"
    }
    namespace = JOB["metadata"]["namespace"]
    assert (namespace, JOB["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]) in queues
    assert JOB["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] in tiers
    assert JOB["spec"]["suspend"] is True  # Kueue admits it
    for obj in load("job.yaml") + load("rbac.yaml"):
        assert obj["metadata"]["namespace"] == namespace, obj["kind"]


# --- grace ---------------------------------------------------------------------------------------


def test_the_grace_annotation_equals_the_termination_grace_period() -> None:
    assert POD["metadata"]["annotations"][GRACE_ANNOTATION] == str(
        SPEC["terminationGracePeriodSeconds"]
    )


def test_the_trainer_reads_the_grace_through_the_downward_api() -> None:
    assert env_of(TRAINER)[POD_GRACE_ENV] == {
        "fieldRef": {"fieldPath": f"metadata.annotations['{GRACE_ANNOTATION}']"}
    }


# --- credentials ----------------------------------------------------------------------------------


def test_only_the_sidecar_mounts_a_token() -> None:
    assert SPEC["automountServiceAccountToken"] is False
    with_token = {
        name
        for name, v in volumes().items()
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
    }
    assert len(with_token) == 1
    [token_volume] = with_token
    assert mounts_of(SIDECAR)[token_volume]["mountPath"] == SERVICE_ACCOUNT_DIR
    assert mounts_of(SIDECAR)[token_volume]["readOnly"] is True
    assert token_volume not in mounts_of(TRAINER)
    assert not any("secret" in v for v in volumes().values())
    assert not [m for m in mounts_of(TRAINER).values() if "serviceaccount" in m["mountPath"]]


def test_the_token_volume_holds_what_the_in_cluster_config_reads() -> None:
    [token_volume] = [v for v in volumes().values() if "projected" in v]
    sources = token_volume["projected"]["sources"]
    token, ca, namespace = sources
    assert token["serviceAccountToken"]["path"] == "token"
    assert ca["configMap"] == {
        "name": "kube-root-ca.crt",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert namespace["downwardAPI"]["items"] == [
        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
    ]


def test_the_role_allows_patching_pods_and_nothing_else() -> None:
    rbac = load("rbac.yaml")
    assert sorted(o["kind"] for o in rbac) == ["Role", "RoleBinding", "ServiceAccount"]
    role = one(rbac, "Role")
    [rule] = role["rules"]
    assert rule["apiGroups"] == [""] and rule["resources"] == ["pods"]
    assert set(rule["verbs"]) <= {"get", "patch"} and "patch" in rule["verbs"]
    assert set(rule) == {"apiGroups", "resources", "verbs"}  # no nonResourceURLs
    binding = one(rbac, "RoleBinding")
    account = one(rbac, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert SPEC["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False


# --- the two containers ---------------------------------------------------------------------------


def sidecar_params() -> dict[str, Any]:
    """The sidecar's command line, parsed by the real `preemptible` CLI (nothing runs)."""
    assert SIDECAR["command"] == ["preemptible", "sidecar"]
    group = typer.main.get_command(app)
    command = group.commands["sidecar"]
    context = command.make_context("sidecar", list(SIDECAR["args"]))
    return dict(context.params)


def test_the_sidecar_is_a_native_sidecar() -> None:
    assert SIDECAR["restartPolicy"] == "Always"  # an init container that keeps running
    assert "restartPolicy" not in TRAINER  # the API server refuses it on a plain container
    assert SPEC["restartPolicy"] == "Never"  # podFailurePolicy needs it


def test_the_sidecar_arguments_parse_with_the_real_cli_and_make_valid_options() -> None:
    params = sidecar_params()
    options = SidecarOptions(
        cost_file=params["cost_file"],
        metrics_port=params["metrics_port"],
        metrics_addr=params["metrics_addr"],
        poll_s=params["poll_seconds"],
        annotations=params["annotations"],
    )
    assert options.metrics_addr == "0.0.0.0" and options.annotations
    assert {"containerPort": options.metrics_port, "name": "metrics"} in SIDECAR["ports"]
    assert POD["metadata"]["annotations"]["prometheus.io/port"] == str(options.metrics_port)


def test_a_bad_sidecar_argument_would_be_caught() -> None:
    group = typer.main.get_command(app)
    command = group.commands["sidecar"]
    with pytest.raises(Exception, match="No such option"):
        command.make_context("sidecar", ["--cost-fil=/x"])


def test_both_containers_meet_at_the_cost_file_on_the_shared_empty_dir() -> None:
    cost_file = Path(str(sidecar_params()["cost_file"]))
    assert env_of(TRAINER)[COST_FILE_ENV] == str(cost_file)
    [shared] = [n for n, v in volumes().items() if "emptyDir" in v]
    for container in (SIDECAR, TRAINER):
        assert mounts_of(container)[shared]["mountPath"] == str(cost_file.parent)
    assert mounts_of(SIDECAR)[shared]["readOnly"] is True
    assert not mounts_of(TRAINER)[shared].get("readOnly", False)


def test_the_sidecar_knows_its_pod_from_the_downward_api() -> None:
    env = env_of(SIDECAR)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def _script_options(script: Path) -> set[str]:
    """The ``--flags`` a script's argparse parser declares (read from its source)."""
    options: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            options.update(
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and str(a.value).startswith("--")
            )
    return options


def test_the_trainer_runs_a_script_of_this_repository_with_flags_it_has() -> None:
    python, script = TRAINER["command"]
    assert python == "python" and TRAINER["workingDir"] == "/app"
    path = REPO / script
    assert path.is_file()
    assert "@preemptible(" in path.read_text()
    flags = {a for a in TRAINER["args"] if a.startswith("--")}
    assert flags and flags <= _script_options(path)
    checkpoints = TRAINER["args"][TRAINER["args"].index("--dir") + 1]
    [name] = [
        n for n, m in mounts_of(TRAINER).items() if checkpoints.startswith(m["mountPath"] + "/")
    ]
    assert "persistentVolumeClaim" in volumes()[name]  # outlives the pod: the next one resumes
    claim = one(load("job.yaml"), "PersistentVolumeClaim")
    assert volumes()[name]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_the_job_does_not_count_a_preemption_as_a_failure() -> None:
    rules = JOB["spec"]["podFailurePolicy"]["rules"]
    assert {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    } in rules
    [exit_rule] = [r for r in rules if "onExitCodes" in r]
    assert exit_rule["action"] == "Ignore"
    assert exit_rule["onExitCodes"] == {
        "containerName": "trainer",
        "operator": "In",
        "values": [143],
    }


def test_the_header_comments_name_files_that_exist() -> None:
    for name in ("job.yaml", "rbac.yaml"):
        for mentioned in re.findall(r"[\w/.-]+\.(?:py|yaml|md)\b", (K8S / name).read_text()):
            assert (K8S / mentioned).exists() or (REPO / mentioned).exists(), mentioned
