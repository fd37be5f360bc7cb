"""`helm lint --strict` and `helm template`, with default values and with every optional
part on, and what the rendered objects must (and must not) be."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from tests.support.controller import ALL_ACTIONS

from .render import (
    ALL_ON,
    CHART,
    by_kind,
    containers,
    one,
    rule_allows,
    run_helm,
    template,
    workloads,
)

VARIANTS = {"defaults": (), "all-on": ("-f", str(ALL_ON))}
COMMON_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "helm.sh/chart",
)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest, helm: str) -> list[dict[str, Any]]:
    return template(helm, *VARIANTS[request.param])


@pytest.fixture(scope="module")
def defaults(helm: str) -> list[dict[str, Any]]:
    return template(helm)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint_strict(helm: str, variant: str) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), *VARIANTS[variant])
    assert "0 chart(s) failed" in proc.stdout


def test_default_render_has_every_part(defaults: list[dict[str, Any]]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in defaults}
    assert kinds == {
        ("ServiceAccount", "unstick-controller"),
        ("ServiceAccount", "unstick-agent"),
        ("ClusterRole", "unstick-controller"),
        ("ClusterRole", "unstick-agent"),
        ("ClusterRoleBinding", "unstick-controller"),
        ("ClusterRoleBinding", "unstick-agent"),
        ("Role", "unstick-agent-events"),
        ("RoleBinding", "unstick-agent-events"),
        ("Deployment", "unstick-controller"),
        ("DaemonSet", "unstick-agent"),
        ("Service", "unstick-controller-metrics"),
        ("Service", "unstick-agent-metrics"),
        ("Role", "unstick-controller-leader-election"),
        ("RoleBinding", "unstick-controller-leader-election"),
        ("PodDisruptionBudget", "unstick-controller"),
        ("RemediationPolicy", "default"),
        ("ValidatingAdmissionPolicy", "unstick-remediation-writers"),
        ("ValidatingAdmissionPolicyBinding", "unstick-remediation-writers"),
    }


def test_all_on_adds_monitoring(helm: str) -> None:
    objects = template(helm, "-f", str(ALL_ON))
    assert {o["metadata"]["name"] for o in by_kind(objects, "ServiceMonitor")} == {
        "unstick-controller",
        "unstick-agent",
    }
    assert len(by_kind(objects, "PrometheusRule")) == 1


def test_every_object_has_the_standard_labels(rendered: list[dict[str, Any]]) -> None:
    for obj in rendered:
        labels = obj["metadata"].get("labels", {})
        missing = [k for k in COMMON_LABELS if k not in labels]
        assert not missing, f"{obj['kind']}/{obj['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/name"] == "unstick"
        assert labels["app.kubernetes.io/instance"] == "unstick"
    for w in workloads(rendered):
        pod_labels = w["spec"]["template"]["metadata"]["labels"]
        selector = w["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items()
        assert selector["app.kubernetes.io/component"] in ("controller", "agent")


def test_privileged_only_on_the_agent(rendered: list[dict[str, Any]]) -> None:
    for w in workloads(rendered):
        pod = w["spec"]["template"]["spec"]
        for c in containers(w):
            privileged = c.get("securityContext", {}).get("privileged", False)
            is_agent = w["kind"] == "DaemonSet" and c["name"] == "agent"
            assert privileged is is_agent, f"{w['kind']}/{c['name']} privileged={privileged}"
        if w["kind"] != "DaemonSet":
            assert not pod.get("hostPID") and not pod.get("hostNetwork")


def test_controller_is_locked_down(rendered: list[dict[str, Any]]) -> None:
    deploy = one(rendered, "Deployment", "unstick-controller")
    spec = deploy["spec"]
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == "unstick-controller"


def test_controller_probes_hit_the_kopf_liveness_endpoint(defaults: list[dict[str, Any]]) -> None:
    (c,) = one(defaults, "Deployment", "unstick-controller")["spec"]["template"]["spec"][
        "containers"
    ]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # `unstick controller --health-port` serves Kopf's liveness at /healthz (docs/controller.md).
    assert c["args"] == [
        "controller",
        "--leader-elect-lease-name=unstick-controller",
        "--leader-elect-lease-duration=15s",
        "--leader-elect-renew-deadline=10s",
        "--leader-elect-retry-period=2s",
        f"--health-port={ports['health']}",
        f"--metrics-port={ports['metrics']}",
        "--node-round-trip",  # controller.nodeRoundTrip, always explicit
    ]
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ports == {"metrics": 9100, "health": 8080}


def test_controller_flags_from_values(helm: str) -> None:
    objects = template(
        helm,
        "-f",
        str(ALL_ON),
        "--set",
        "controller.namespaceScope={a,b}",
        "--set",
        "controller.verbose=true",
        "--set",
        "controller.leaderElection.leaseName=other",
        "--set",
        "controller.leaderElection.leaseDuration=30s",
    )
    (c,) = one(objects, "Deployment", "unstick-controller")["spec"]["template"]["spec"][
        "containers"
    ]
    assert c["args"] == [
        "controller",
        "--leader-elect-lease-name=other",
        "--leader-elect-lease-duration=30s",
        "--leader-elect-renew-deadline=10s",
        "--leader-elect-retry-period=2s",
        "--health-port=8080",
        "--metrics-port=9100",
        "--namespace-scope=a",
        "--namespace-scope=b",
        "--verbose",
        "--node-round-trip",
        "--workers=16",
    ]
    assert one(objects, "Role", "unstick-controller-leader-election")["rules"][1][
        "resourceNames"
    ] == ["other"]


def test_agent_daemonset(defaults: list[dict[str, Any]]) -> None:
    ds = one(defaults, "DaemonSet", "unstick-agent")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]
    (c,) = pod["containers"]
    assert c["args"][:5] == [
        "agent",
        "--node-name=$(NODE_NAME)",
        "--kubelet-root=/var/lib/kubelet",
        "--host-proc=/host/proc",
        "--metrics-port=9101",
    ]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["kubelet-root"]["mountPath"] == "/var/lib/kubelet"
    assert mounts["kubelet-root"]["mountPropagation"] == "Bidirectional"
    assert volumes["kubelet-root"]["hostPath"]["path"] == "/var/lib/kubelet"
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    assert volumes["host-proc"]["hostPath"]["path"] == "/proc"
    assert c["securityContext"]["privileged"] is True
    assert c["securityContext"]["runAsUser"] == 0


def test_kubelet_root_value_moves_mount_and_flag_together(helm: str) -> None:
    objects = template(helm, "-f", str(ALL_ON))
    pod = one(objects, "DaemonSet", "unstick-agent")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "--kubelet-root=/var/lib/k0s/kubelet" in c["args"]
    assert "--cri-socket=/run/containerd/containerd.sock" in c["args"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["kubelet-root"]["mountPath"] == "/var/lib/k0s/kubelet"
    assert volumes["kubelet-root"]["hostPath"]["path"] == "/var/lib/k0s/kubelet"
    assert volumes["cri-socket"]["hostPath"] == {
        "path": "/run/containerd/containerd.sock",
        "type": "Socket",
    }


def test_bidirectional_propagation_only_for_the_kubelet_root(
    rendered: list[dict[str, Any]],
) -> None:
    for w in workloads(rendered):
        for c in containers(w):
            for m in c.get("volumeMounts", []):
                if m.get("mountPropagation") == "Bidirectional":
                    assert (w["kind"], m["name"]) == ("DaemonSet", "kubelet-root")


def test_every_container_has_resources(rendered: list[dict[str, Any]]) -> None:
    for w in workloads(rendered):
        for c in containers(w):
            res = c.get("resources", {})
            assert {"cpu", "memory"} <= res.get("requests", {}).keys(), c["name"]
            assert "memory" in res.get("limits", {}), c["name"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "ghcr.io/unstick-dev/unstick:0.1.0"),
        (
            ("--set", "image.repository=r.example.test/u", "--set", "image.tag=1.2.3"),
            "r.example.test/u:1.2.3",
        ),
        (
            (
                "--set",
                "image.repository=r.example.test/u",
                "--set",
                "image.digest=sha256:" + "a" * 64,
            ),
            "r.example.test/u@sha256:" + "a" * 64,
        ),
    ],
)
def test_every_image_comes_from_values(helm: str, args: tuple[str, ...], expected: str) -> None:
    objects = template(helm, *args)
    images = [c["image"] for w in workloads(objects) for c in containers(w)]
    assert len(images) == 2
    assert set(images) == {expected}
    pull = {c["imagePullPolicy"] for w in workloads(objects) for c in containers(w)}
    assert pull == {"IfNotPresent"}


def test_no_wildcards_and_no_secrets_in_rbac(rendered: list[dict[str, Any]]) -> None:
    roles = by_kind(rendered, "ClusterRole") + by_kind(rendered, "Role")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: {rule}"
            assert "secrets" not in rule.get("resources", [])
            assert "nonResourceURLs" not in rule


def test_agent_cannot_change_pods_or_nodes(defaults: list[dict[str, Any]]) -> None:
    rules = one(defaults, "ClusterRole", "unstick-agent")["rules"]
    for verb in ("delete", "patch", "update", "create", "deletecollection"):
        assert not rule_allows(rules, "", "pods", verb), verb
        assert not rule_allows(rules, "", "nodes", verb), verb
        # it writes a Remediation's status, never its spec (docs/agent.md)
        assert not rule_allows(rules, "unstick.dev", "remediations", verb), verb
        # it reads the policy in force and the namespace's opt-in itself (invariant 7)
        assert not rule_allows(rules, "unstick.dev", "remediationpolicies", verb), verb
        assert not rule_allows(rules, "", "namespaces", verb), verb
    assert not rule_allows(rules, "", "pods/eviction", "create")
    for verb in ("get", "list", "watch"):  # GET, or its own list+watch (docs/agent.md)
        assert rule_allows(rules, "unstick.dev", "remediationpolicies", verb), verb
        assert rule_allows(rules, "", "namespaces", verb), verb
    assert rule_allows(rules, "unstick.dev", "remediations", "watch")
    assert rule_allows(rules, "unstick.dev", "remediations/status", "patch")
    assert rule_allows(rules, "", "pods", "get")
    assert rule_allows(rules, "", "pods", "list")  # its node's, by field selector (docs)


def test_agent_rbac_is_what_it_uses(defaults: list[dict[str, Any]]) -> None:
    """#22 finding 6: no pod watch, no Nodes, Events only in `default` (its Node's)."""
    rules = one(defaults, "ClusterRole", "unstick-agent")["rules"]
    assert not rule_allows(rules, "", "pods", "watch")
    assert not rule_allows(rules, "", "nodes", "get")
    for verb in ("create", "patch", "update", "delete"):
        assert not rule_allows(rules, "", "events", verb), verb
        assert not rule_allows(rules, "events.k8s.io", "events", verb), verb
    role = one(defaults, "Role", "unstick-agent-events")
    assert role["metadata"]["namespace"] == "default"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    binding = one(defaults, "RoleBinding", "unstick-agent-events")
    assert binding["metadata"]["namespace"] == "default"
    assert binding["roleRef"]["name"] == "unstick-agent-events"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "unstick-agent", "namespace": "unstick"}
    ]


def test_controller_rbac_covers_its_actions(defaults: list[dict[str, Any]]) -> None:
    rules = one(defaults, "ClusterRole", "unstick-controller")["rules"]
    for verb in ("get", "list", "watch", "delete", "patch"):
        assert rule_allows(rules, "", "pods", verb), verb
    assert not rule_allows(rules, "", "pods", "create")
    assert not rule_allows(rules, "", "nodes", "patch")
    for group, resource, verb in (
        ("", "nodes", "watch"),
        ("", "namespaces", "watch"),
        ("", "persistentvolumeclaims", "get"),
        ("", "persistentvolumes", "get"),
        ("storage.k8s.io", "csinodes", "get"),
        ("storage.k8s.io", "volumeattachments", "list"),
        ("unstick.dev", "remediations", "create"),
        ("unstick.dev", "remediations/status", "patch"),
        ("unstick.dev", "remediationpolicies", "watch"),
        ("unstick.dev", "remediationpolicies/status", "patch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ):
        assert rule_allows(rules, group, resource, verb), (resource, verb)
    for group in ("", "events.k8s.io"):
        assert rule_allows(rules, group, "events", "create")
        assert rule_allows(rules, group, "events", "patch")
    assert not rule_allows(rules, "unstick.dev", "remediationpolicies", "patch")
    assert not rule_allows(rules, "apiextensions.k8s.io", "customresourcedefinitions", "create")


def test_bindings_point_at_their_own_service_accounts(rendered: list[dict[str, Any]]) -> None:
    for component in ("controller", "agent"):
        binding = one(rendered, "ClusterRoleBinding", f"unstick-{component}")
        assert binding["roleRef"]["name"] == f"unstick-{component}"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"unstick-{component}", "namespace": "unstick"}
        ]


def test_default_policy_is_dry_run_and_parses(defaults: list[dict[str, Any]]) -> None:
    from unstick.core.policy.remediation_policy import RemediationPolicy, parse_policy

    obj = one(defaults, "RemediationPolicy", "default")
    assert obj["spec"]["dryRun"] is True
    assert "restart-kubelet" not in obj["spec"]["actions"]
    policy = parse_policy(obj)
    # Apart from the permitted actions (a spec without `actions` permits only observe;
    # the chart lists docs/contracts.md's set), the chart's defaults are the core's.
    assert replace(policy, actions=RemediationPolicy().actions) == RemediationPolicy()
    assert {str(a) for a in policy.actions} == set(ALL_ACTIONS)


def test_all_on_policy_parses(helm: str) -> None:
    from unstick.core.policy.remediation_policy import parse_policy

    obj = one(template(helm, "-f", str(ALL_ON)), "RemediationPolicy", "default")
    assert obj["spec"]["dryRun"] is False
    policy = parse_policy(obj)
    assert policy.dry_run is False
    assert {str(a) for a in policy.actions} == {
        "observe",
        "unmount",
        "rmdir-stale",
        "restart-kubelet",
        "force-delete",
    }
    assert policy.finalizer_allowlist == ("example.com/cleanup",)
    assert policy.lazy_unmount is True


def test_policy_can_be_left_out(helm: str) -> None:
    objects = template(helm, "--set", "policy.create=false")
    assert not by_kind(objects, "RemediationPolicy")


def test_metric_services_select_their_pods(defaults: list[dict[str, Any]]) -> None:
    for component, port in (("controller", 9100), ("agent", 9101)):
        svc = one(defaults, "Service", f"unstick-{component}-metrics")
        assert svc["spec"]["ports"] == [
            {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
        ]
        kind = "Deployment" if component == "controller" else "DaemonSet"
        pod_labels = one(defaults, kind, f"unstick-{component}")["spec"]["template"]["metadata"][
            "labels"
        ]
        assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_rendered_yaml_round_trips(rendered: list[dict[str, Any]]) -> None:
    # Every object is plain data (no leftover template syntax in keys or values).
    text = yaml.safe_dump_all(rendered)
    assert "{{ ." not in text and "<no value>" not in text


def test_chart_app_version_is_the_package_version() -> None:
    import tomllib

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((CHART.parents[1] / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"]
