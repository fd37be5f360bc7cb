"""The controller's hot standby in the chart (issue #31): two replicas by default on
different nodes, a PodDisruptionBudget, a short eviction toleration, the leader election's
flags and its Lease's RBAC, and the two controller alerts (promtool on synthetic series)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .render import by_kind, one, refused, template

CONTROLLER = "unstick-controller"
JOB = "unstick-controller-metrics"
SELECTOR = {"app.kubernetes.io/name": "unstick", "app.kubernetes.io/instance": "unstick",
            "app.kubernetes.io/component": "controller"}  # fmt: skip


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment", CONTROLLER)["spec"]["template"]["spec"]
    return spec


def test_defaults_are_a_hot_standby(helm: str) -> None:
    objects = template(helm)
    deploy = one(objects, "Deployment", CONTROLLER)
    assert deploy["spec"]["replicas"] == 2
    pod = pod_spec(objects)
    required = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == [
        {"labelSelector": {"matchLabels": SELECTOR}, "topologyKey": "kubernetes.io/hostname"}
    ]
    assert deploy["spec"]["selector"]["matchLabels"] == SELECTOR
    tolerations = {t["key"]: t for t in pod["tolerations"]}
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        assert tolerations[key] == {
            "key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30
        }  # fmt: skip
    pdb = one(objects, "PodDisruptionBudget", CONTROLLER)
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": SELECTOR}}
    (c,) = pod["containers"]
    assert "--leader-elect-lease-name=unstick-controller" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert not by_kind(objects, "ClusterKopfPeering")


def test_the_lease_rbac_is_its_own_namespace_and_name(helm: str) -> None:
    objects = template(helm, "--set", "controller.leaderElection.leaseName=mine")
    role = one(objects, "Role", "unstick-controller-leader-election")
    assert role["metadata"]["namespace"] == "unstick"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["mine"],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(objects, "RoleBinding", "unstick-controller-leader-election")
    assert binding["roleRef"]["name"] == "unstick-controller-leader-election"
    assert binding["subjects"][0]["name"] == CONTROLLER
    cluster_rules = one(objects, "ClusterRole", CONTROLLER)["rules"]
    assert not [r for r in cluster_rules if "kopf.dev" in r.get("apiGroups", [])]


def test_one_replica_has_no_pdb_and_no_anti_affinity(helm: str) -> None:
    objects = template(helm, "--set", "controller.replicas=1")
    assert not by_kind(objects, "PodDisruptionBudget")
    assert "podAntiAffinity" not in (pod_spec(objects).get("affinity") or {})


def test_without_election_only_one_replica(helm: str) -> None:
    objects = template(
        helm, "--set", "controller.replicas=1", "--set", "controller.leaderElection.enabled=false"
    )
    (c,) = pod_spec(objects)["containers"]
    assert "--standalone" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--leader-elect")]
    assert not [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("election")]
    message = refused(helm, "--set", "controller.leaderElection.enabled=false")
    assert "controller.replicas > 1 needs controller.leaderElection.enabled" in message


def test_spreading_values(helm: str) -> None:
    objects = template(
        helm,
        "--set", "controller.podAntiAffinity=preferred",
        "--set", "controller.priorityClassName=system-cluster-critical",
        "--set", "controller.evictionTolerationSeconds=null",
        "--set-json",
        'controller.topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"topology.kubernetes.io/zone","whenUnsatisfiable":"ScheduleAnyway"}]',
    )  # fmt: skip
    pod = pod_spec(objects)
    preferred = pod["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred == [
        {
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": {"matchLabels": SELECTOR},
                "topologyKey": "kubernetes.io/hostname",
            },
        }
    ]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert "tolerations" not in pod
    (constraint,) = pod["topologySpreadConstraints"]
    assert constraint["labelSelector"] == {"matchLabels": SELECTOR}
    assert constraint["topologyKey"] == "topology.kubernetes.io/zone"
    none = pod_spec(template(helm, "--set", "controller.podAntiAffinity=none"))
    assert "affinity" not in none


def test_the_controller_alerts_fire_as_documented(helm: str, promtool: str, tmp_path: Path) -> None:
    objects = template(helm, "--set", "prometheusRule.enabled=true")
    rules = one(objects, "PrometheusRule", "unstick")["spec"]
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(yaml.safe_dump(rules))
    a = {"job": JOB, "pod": "unstick-controller-a"}
    b = {"job": JOB, "pod": "unstick-controller-b"}

    def sel(name: str, labels: dict[str, str]) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    def alert(minute: int, name: str, firing: bool) -> dict[str, Any]:
        exp = [{"exp_labels": {"severity": "critical"}}] if firing else []
        if firing:
            rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == name)
            exp[0]["exp_annotations"] = rule["annotations"]
        return {"eval_time": f"{minute}m", "alertname": name, "exp_alerts": exp}

    spec = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {  # both controllers gone from t=2m to t=10m, then one back
                "interval": "1m",
                "input_series": [
                    {"series": sel("up", a), "values": "1 1 0 0 0 0 0 0 0 0 1x10"},
                    {"series": sel("up", b), "values": "1 1 0 0 0 0 0 0 0 0 0x10"},
                ],
                "alert_rule_test": [
                    alert(6, "UnstickControllerDown", False),
                    alert(8, "UnstickControllerDown", True),
                    alert(11, "UnstickControllerDown", False),
                ],
            },
            {  # both up; the leader stops leading at t=2m (a third holder), back at t=8m
                "interval": "1m",
                "input_series": [
                    {"series": sel("up", a), "values": "1x15"},
                    {"series": sel("up", b), "values": "1x15"},
                    {
                        "series": sel("unstick_controller_leader", a),
                        "values": "1 1 0 0 0 0 0 0 1x8",
                    },
                    {"series": sel("unstick_controller_leader", b), "values": "0x15"},
                ],
                "alert_rule_test": [
                    alert(3, "UnstickNoLeader", False),
                    alert(5, "UnstickNoLeader", True),
                    alert(9, "UnstickNoLeader", False),
                    alert(5, "UnstickControllerDown", False),
                ],
            },
            {  # a failover: no leader for one minute only
                "interval": "1m",
                "input_series": [
                    {"series": sel("up", a), "values": "1x10"},
                    {"series": sel("unstick_controller_leader", a), "values": "1 1 0 1x7"},
                ],
                "alert_rule_test": [alert(4, "UnstickNoLeader", False)],
            },
        ],
    }
    test_file = tmp_path / "rules.test.yaml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_default_policy_render_is_unchanged_by_replicas(helm: str, replicas: str) -> None:
    objects = template(helm, "--set", f"controller.replicas={replicas}")
    assert one(objects, "Deployment", CONTROLLER)["spec"]["replicas"] == int(replicas)
