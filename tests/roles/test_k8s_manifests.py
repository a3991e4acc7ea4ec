"""The orchestrator role's Kubernetes objects (entry point ``kubernetes``) are valid Kubernetes, offline.

Each case runs the role for real with ``ansible-playbook`` on this machine (the entry point only renders, on the
controller), reads the files it wrote, and validates every object against the Kubernetes JSON schemas that the
``kubernetes-validate`` package bundles, strictly (an unknown field fails), for the oldest and the newest
Kubernetes minor we name. No cluster is involved: none can run here (docs/orchestrator-role.md).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "k8s-test-token-3c9a71e0"
# The oldest Kubernetes minor still maintained when this was written, and the newest the package knows.
VERSIONS = ["1.31", kubernetes_validate.latest_version()]
BASE_VARS: dict[str, Any] = {
    "devin_outposts_orchestrator_outpost": "gpu-pool",
    "devin_outposts_orchestrator_token": TOKEN,
    "devin_outposts_orchestrator_k8s_image": "registry.example.com/devin-outposts:0.1.0",
}


@pytest.fixture(autouse=True)
def _collection_link() -> None:
    if not (ROOT / ".cache/collections/ansible_collections/devin/outposts").exists():
        pytest.fail("run through scripts/test.sh (scripts/lib.sh links the checkout into .cache/collections)")


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Validation must work offline: any socket this process opens fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("kubernetes-validate tried to use the network")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


def render(tmp_path: Path, role_vars: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Run the role's kubernetes entry point, writing the manifests to ``tmp_path/out``."""
    play = [{
        "name": "Render the orchestrator's Kubernetes objects", "hosts": "localhost", "connection": "local",
        "gather_facts": False,
        "tasks": [
            {"name": "Render", "ansible.builtin.include_role": {"name": "devin.outposts.orchestrator",
                                                                "tasks_from": "kubernetes"},
             "vars": {"devin_outposts_orchestrator_k8s_manifest_dir": str(tmp_path / "out"), **role_vars}},
            {"name": "Save the facts", "ansible.builtin.copy": {
                "content": "{{ devin_outposts_orchestrator_k8s_objects | to_json }}",
                "dest": str(tmp_path / "objects.json"), "mode": "0600"}},
        ],
    }]  # fmt: skip
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play), encoding="utf-8")
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DEVIN_OUTPOSTS_TOKEN", "DEVIN_API_URL")},
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".cache" / "collections"),
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_VERBOSITY": "2",
    }
    command = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
               "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)]  # fmt: skip
    return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def default_render(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One rendering with the base variables, shared by the tests that only read it."""
    out = tmp_path_factory.mktemp("default")
    return out, render(out, BASE_VARS)


def manifests(tmp_path: Path) -> dict[str, dict[str, Any]]:
    out = tmp_path / "out"
    return {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(out.glob("*.yml"))}


def assert_valid(objects: dict[str, dict[str, Any]]) -> None:
    for version in VERSIONS:
        for name, obj in objects.items():
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name} is not valid Kubernetes {version}: {exc.message} at {list(exc.path)}")


def test_the_default_objects_are_valid_and_keep_the_token_in_the_secret(default_render: tuple[Path, Any]) -> None:
    tmp_path, done = default_render
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert TOKEN not in out  # -vv, and still nowhere in the play's output
    objects = manifests(tmp_path)
    assert list(objects) == ["00-secret.yml", "10-serviceaccount.yml", "20-role.yml", "30-rolebinding.yml",
                             "40-configmap.yml", "50-deployment.yml"]  # fmt: skip
    assert_valid(objects)
    secret_file = tmp_path / "out" / "00-secret.yml"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert objects["00-secret.yml"]["stringData"] == {"token": TOKEN}
    for name in objects:
        if name != "00-secret.yml":
            assert TOKEN not in (tmp_path / "out" / name).read_text(encoding="utf-8"), name
    # The fact users apply holds the same objects as the files, the Secret apart.
    facts = json.loads((tmp_path / "objects.json").read_text(encoding="utf-8"))
    assert facts == [objects[n] for n in list(objects)[1:]]
    assert TOKEN not in json.dumps(facts)


def test_the_deployment_runs_orchestrate_with_the_token_from_the_secret(default_render: tuple[Path, Any]) -> None:
    tmp_path, done = default_render
    assert done.returncode == 0
    deployment = manifests(tmp_path)["50-deployment.yml"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["devin-outposts", "orchestrate"]
    assert "args" not in container  # all configuration in the environment
    env = {e["name"]: e for e in container["env"]}
    assert env["DEVIN_ORCHESTRATOR_DRIVER"]["value"] == "kubernetes"
    assert env["DEVIN_ORCHESTRATOR_OUTPOST"]["value"] == "gpu-pool"
    assert env["DEVIN_OUTPOSTS_TOKEN"] == {"name": "DEVIN_OUTPOSTS_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "devin-outposts-orchestrator-token", "key": "token"}}}  # fmt: skip
    # A fixed acceptor id, so a rescheduled pod (its state dir is an emptyDir) adopts its own sessions.
    assert env["DEVIN_ORCHESTRATOR_ACCEPTOR_ID"]["value"].startswith("k8s-devin-outposts-")
    assert pod["serviceAccountName"] == "devin-outposts-orchestrator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_role_is_namespaced_and_least_privilege(default_render: tuple[Path, Any]) -> None:
    tmp_path, done = default_render
    assert done.returncode == 0
    objects = manifests(tmp_path)
    role, binding = objects["20-role.yml"], objects["30-rolebinding.yml"]
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "devin-outposts"
    # Exactly the kubernetes driver's needs (docs/orchestrator-kubernetes.md, "RBAC").
    assert granted_by(role) == {
        ("", "pods"): {"get", "list", "watch", "create", "delete"},
        ("", "secrets"): {"list", "create", "delete", "patch"},
        ("", "persistentvolumeclaims"): {"get", "list", "create", "delete", "patch"},
        ("networking.k8s.io", "networkpolicies"): {"get", "list", "create", "delete", "patch"},
        ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    }
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "devin-outposts-orchestrator"}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "devin-outposts-orchestrator",
                                    "namespace": "devin-outposts"}]  # fmt: skip


def test_the_role_grants_exactly_what_the_driver_calls(default_render: tuple[Path, Any], tmp_path: Path) -> None:
    """The driver, through every call it has against the package's fake API server (a process of its own: this
    one has no sockets), needs each verb the Role grants, and no other."""
    tmp_path_default, done = default_render
    assert done.returncode == 0
    calls = subprocess.run([sys.executable, str(Path(__file__).with_name("k8s_driver_calls.py")), str(tmp_path)],
                           capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert calls.returncode == 0, calls.stderr
    used: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in json.loads(calls.stdout):
        used.setdefault((group, resource), set()).add(verb)
    granted = granted_by(manifests(tmp_path_default)["20-role.yml"])
    assert used == granted


def granted_by(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    return {(group, resource): set(rule["verbs"])
            for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}


def test_an_owner_deployment_without_uid_may_be_read_by_name_only(tmp_path: Path) -> None:
    """The driver looks up an owner Deployment given without uid: the Role then grants get on that one."""
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "devin-outposts-orchestrator"}
    assert render(tmp_path, {**BASE_VARS, "devin_outposts_orchestrator_driver_config": {"owner": owner}}).returncode == 0
    objects = manifests(tmp_path)
    assert_valid(objects)
    rules = [r for r in objects["20-role.yml"]["rules"] if r["apiGroups"] == ["apps"]]
    assert rules == [{"apiGroups": ["apps"], "resources": ["deployments"],
                      "resourceNames": ["devin-outposts-orchestrator"], "verbs": ["get"]}]  # fmt: skip


def test_every_option_still_renders_valid_objects(tmp_path: Path) -> None:
    """Driver config and CA into the ConfigMap, pull secrets, node selector, tolerations, labels, no metrics, an
    existing Secret: still valid, and the ConfigMap's driver.json is the driver config as JSON."""
    driver_config = {"namespace": "devin-outposts", "image": "registry.example.com/worker:1",
                     "pod_template": {"spec": {"nodeSelector": {"pool": "sessions"}}}}  # fmt: skip
    role_vars = {
        **BASE_VARS,
        "devin_outposts_orchestrator_token": "",
        "devin_outposts_orchestrator_k8s_create_secret": False,
        "devin_outposts_orchestrator_k8s_secret_name": "made-by-external-secrets",
        "devin_outposts_orchestrator_driver_config": driver_config,
        "devin_outposts_orchestrator_ca_certificate": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "devin_outposts_orchestrator_k8s_image_pull_secrets": ["regcred"],
        "devin_outposts_orchestrator_k8s_node_selector": {"kubernetes.io/os": "linux"},
        "devin_outposts_orchestrator_k8s_tolerations": [{"key": "dedicated", "operator": "Equal",
                                                         "value": "devin", "effect": "NoSchedule"}],
        "devin_outposts_orchestrator_k8s_labels": {"team": "platform"},
        "devin_outposts_orchestrator_k8s_annotations": {"prometheus.io/scrape": "false"},
        "devin_outposts_orchestrator_k8s_metrics_addr": "",
        "devin_outposts_orchestrator_k8s_replicas": 2,
        "devin_outposts_orchestrator_snapshot_ttl": 3600,
        "devin_outposts_orchestrator_resume_policy": "snapshot",
        "devin_outposts_orchestrator_env": {"EXTRA": "1"},
    }  # fmt: skip
    done = render(tmp_path, role_vars)
    assert done.returncode == 0, done.stdout + done.stderr
    objects = manifests(tmp_path)
    assert "00-secret.yml" not in objects
    assert_valid(objects)
    config = objects["40-configmap.yml"]["data"]
    assert json.loads(config["driver.json"]) == driver_config
    assert config["ca.pem"].startswith("-----BEGIN CERTIFICATE-----")
    pod = objects["50-deployment.yml"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}
    assert env["DEVIN_ORCHESTRATOR_DRIVER_CONFIG"] == "/etc/devin-outposts-orchestrator/driver.json"
    assert env["DEVIN_CA_BUNDLE"] == "/etc/devin-outposts-orchestrator/ca.pem"
    assert env["DEVIN_ORCHESTRATOR_SNAPSHOT_TTL"] == "3600"
    assert env["DEVIN_OUTPOSTS_TOKEN"] == {"secretKeyRef": {"name": "made-by-external-secrets", "key": "token"}}
    assert "DEVIN_ORCHESTRATOR_METRICS_ADDR" not in env and "livenessProbe" not in pod["containers"][0]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_several_outposts_run_in_one_deployment_with_one_acceptor_id(tmp_path: Path) -> None:
    """One Deployment (one Lease, one acceptor id) serves every outpost of the list, each cap where given."""
    role_vars = {**BASE_VARS, "devin_outposts_orchestrator_outpost": "",
                 "devin_outposts_orchestrator_outposts": [{"outpost": "gpu-pool", "max_concurrent": 2},
                                                          {"outpost": "cpu-pool"}]}  # fmt: skip
    done = render(tmp_path, role_vars)
    assert done.returncode == 0, done.stdout + done.stderr
    objects = manifests(tmp_path)
    assert_valid(objects)
    pod = objects["50-deployment.yml"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}
    assert env["DEVIN_ORCHESTRATOR_OUTPOST"] == "gpu-pool=2,cpu-pool"
    assert env["DEVIN_ORCHESTRATOR_ACCEPTOR_ID"].startswith("k8s-devin-outposts-")


def test_a_broken_object_is_caught(default_render: tuple[Path, Any]) -> None:
    """The validation can fail: a misspelt field and a wrong type are both reported."""
    tmp_path, done = default_render
    assert done.returncode == 0
    deployment = manifests(tmp_path)["50-deployment.yml"]
    deployment["spec"]["replica"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
    deployment["spec"].pop("replica")
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    ("role_vars", "expected"),
    [
        ({"devin_outposts_orchestrator_k8s_image": ""}, "must name an image with devin-outposts[kubernetes]"),
        ({"devin_outposts_orchestrator_k8s_namespace": "Not_A_Label"}, "must be DNS labels"),
        ({"devin_outposts_orchestrator_token": ""}, "no token: set devin_outposts_orchestrator_token"),
        ({"devin_outposts_orchestrator_outpost": ""}, "no outpost: set devin_outposts_orchestrator_outpost"),
        ({"devin_outposts_orchestrator_validate_certs": False}, "the orchestrator always verifies TLS"),
        ({"devin_outposts_orchestrator_outposts": [{"outpost": "other"}]}, "not both"),
        ({"devin_outposts_orchestrator_outpost": "", "devin_outposts_orchestrator_outposts": [
            {"outpost": "a", "max_concurrent": 0}]}, "max_concurrent 1 or more"),
        ({"devin_outposts_orchestrator_outpost": "", "devin_outposts_orchestrator_outposts": [
            {"outpost": "a"}, {"outpost": "a"}]}, "each outpost of the list once"),
        ({"devin_outposts_orchestrator_k8s_metrics_addr": "8080"}, "must be HOST:PORT"),
        ({"devin_outposts_orchestrator_driver_config": {"namespace": "elsewhere"}}, "the Role only grants access there"),
    ],
    ids=["no-image", "bad-namespace", "no-token", "no-outpost", "validate-certs-false", "outpost-and-outposts",
         "outpost-cap-zero", "outpost-twice", "bad-metrics-addr", "other-namespace"],
)
def test_bad_inputs_are_refused_before_anything_is_written(tmp_path: Path, role_vars: dict[str, Any],
                                                           expected: str) -> None:
    done = render(tmp_path, {**BASE_VARS, **role_vars})
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert expected in out, out
    assert not (tmp_path / "out").exists()
