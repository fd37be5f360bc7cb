"""A real `helm install` into the test API server (etcd + kube-apiserver, RBAC on):
every object is accepted (CRDs established, RBAC valid, the default policy validates
against its CRD), and impersonated `kubectl auth can-i` proves what each component's
ServiceAccount may and may not do. No pods run here (no kubelet, no scheduler): this is
about what the API server accepts and authorizes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .render import CHART, helm_env

pytestmark = pytest.mark.envtest

# Names of their own, so the install cannot collide with objects other tests create
# in the same (session-wide) API server: the policy is cluster-scoped. controller.peeringName
# (deprecated, ignored since the leader Lease) is still set: an install of before upgraded
# with --reuse-values (test_turning_dry_run_off_is_one_upgrade) carries it.
RELEASE = "unstick-chart-test"
NAMESPACE = "unstick-chart-test"
POLICY = "chart-test-default"
CRDS = (
    "remediations.unstick.dev",
    "remediationpolicies.unstick.dev",
)


class Release:
    def __init__(self, helm: str, control_plane: Any, home: Path) -> None:
        self.helm = helm
        self.cp = control_plane
        self.env = helm_env(home)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.helm, *args, f"--kubeconfig={self.cp.kubeconfig}", "--namespace", NAMESPACE],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=180,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {args[0]} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.cp.kubectl("get", *args, "-o", "json").stdout)

    def can_i(self, sa: str, verb: str, resource: str, *extra: str) -> bool:
        proc = self.cp.kubectl(
            "auth",
            "can-i",
            verb,
            resource,
            f"--as=system:serviceaccount:{NAMESPACE}:{sa}",
            *extra,
            check=False,
        )
        answer = proc.stdout.strip()
        assert answer in ("yes", "no"), proc.stdout + proc.stderr
        return answer == "yes"


@pytest.fixture(scope="module")
def release(
    helm: str, control_plane: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Release, str]]:
    rel = Release(helm, control_plane, tmp_path_factory.mktemp("helm-home"))
    try:
        proc = rel.run(
            "install",
            RELEASE,
            str(CHART),
            "--create-namespace",
            "--set",
            f"controller.peeringName={RELEASE}",
            "--set",
            f"policy.name={POLICY}",
            "--timeout",
            "2m",
        )
        yield rel, proc.stdout
    finally:
        rel.run("uninstall", RELEASE, "--timeout", "2m", check=False)
        control_plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def test_install_is_deployed_and_says_what_to_do(release: tuple[Release, str]) -> None:
    rel, notes = release
    status = json.loads(rel.run("status", RELEASE, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    assert "kubectl annotate pod POD unstick.dev/remediate=true" in notes
    assert "kubectl get remediations -A" in notes
    assert "DRY-RUN" in notes
    assert "--set policy.dryRun=false" in notes


def test_crds_are_established(release: tuple[Release, str]) -> None:
    rel, _ = release
    for name in CRDS:
        conditions = {c["type"]: c["status"] for c in rel.get("crd", name)["status"]["conditions"]}
        assert conditions.get("Established") == "True", name


def test_every_object_was_accepted(release: tuple[Release, str]) -> None:
    rel, _ = release
    for kind, name in (
        ("deployment", "unstick-chart-test-controller"),
        ("daemonset", "unstick-chart-test-agent"),
        ("serviceaccount", "unstick-chart-test-controller"),
        ("serviceaccount", "unstick-chart-test-agent"),
        ("service", "unstick-chart-test-controller-metrics"),
        ("service", "unstick-chart-test-agent-metrics"),
    ):
        obj = rel.get(kind, name, "-n", NAMESPACE)
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    for kind, name in (
        ("clusterrole", "unstick-chart-test-controller"),
        ("clusterrolebinding", "unstick-chart-test-agent"),
    ):
        assert rel.get(kind, name)["metadata"]["name"] == name


def test_default_policy_is_stored_in_dry_run(release: tuple[Release, str]) -> None:
    rel, _ = release
    policy = rel.get("remediationpolicy", POLICY)
    assert policy["spec"]["dryRun"] is True
    assert policy["spec"]["finalizerAllowlist"] == []


AGENT = "unstick-chart-test-agent"
CONTROLLER = "unstick-chart-test-controller"


@pytest.mark.parametrize(
    ("sa", "verb", "resource", "extra", "allowed"),
    [
        # the agent: reads, writes its Remediations' status, changes nothing else
        (AGENT, "delete", "pods", ("-n", "default"), False),
        (AGENT, "patch", "pods", ("-n", "default"), False),
        (AGENT, "create", "pods/eviction", ("-n", "default"), False),
        (AGENT, "list", "pods", ("-A",), True),
        (AGENT, "get", "secrets", ("-n", NAMESPACE), False),
        (AGENT, "list", "secrets", ("-A",), False),
        (AGENT, "get", "nodes", (), False),  # it never reads Nodes (#22 finding 6)
        (AGENT, "watch", "pods", ("-A",), False),  # it lists its node's pods, never watches
        (AGENT, "patch", "nodes", (), False),
        (AGENT, "watch", "remediations.unstick.dev", ("-A",), True),
        (AGENT, "patch", "remediations.unstick.dev", ("--subresource=status", "-n", "x"), True),
        (AGENT, "patch", "remediations.unstick.dev", ("-n", "x"), False),
        (AGENT, "delete", "remediations.unstick.dev", ("-n", "x"), False),
        (AGENT, "create", "remediations.unstick.dev", ("-n", "x"), False),
        # it re-derives opt-in and the policy in force itself (invariant 7): reads only
        (AGENT, "get", "remediationpolicies.unstick.dev", (), True),
        (AGENT, "patch", "remediationpolicies.unstick.dev", (), False),
        (AGENT, "get", "namespaces", (), True),
        (AGENT, "patch", "namespaces", (), False),
        # the OrphanedPodDirs Event on its Node (docs/aftermath.md), nothing else of Events
        (AGENT, "create", "events", ("-n", "default"), True),
        (AGENT, "create", "events", ("-n", NAMESPACE), False),  # only its Node's, in default
        (AGENT, "patch", "events", ("-n", "default"), False),
        (AGENT, "delete", "events", ("-n", "default"), False),
        # the controller: force-delete and remove-finalizer on pods, its own resources
        (CONTROLLER, "delete", "pods", ("-n", "default"), True),
        (CONTROLLER, "patch", "pods", ("-n", "default"), True),
        (CONTROLLER, "create", "pods", ("-n", "default"), False),
        (CONTROLLER, "get", "secrets", ("-n", NAMESPACE), False),
        (CONTROLLER, "list", "secrets", ("-A",), False),
        (CONTROLLER, "get", "csinodes.storage.k8s.io", (), True),
        (CONTROLLER, "list", "volumeattachments.storage.k8s.io", (), True),
        # blocked replacements: watch VolumeAttachments and attach/mount Events, never detach
        (CONTROLLER, "watch", "volumeattachments.storage.k8s.io", (), True),
        (CONTROLLER, "delete", "volumeattachments.storage.k8s.io", (), False),
        (CONTROLLER, "patch", "volumeattachments.storage.k8s.io", (), False),
        (CONTROLLER, "watch", "events", ("-A",), True),
        (CONTROLLER, "watch", "namespaces", (), True),
        (CONTROLLER, "get", "persistentvolumes", (), True),
        (CONTROLLER, "get", "persistentvolumeclaims", ("-n", "default"), True),
        (CONTROLLER, "delete", "nodes", (), False),
        (CONTROLLER, "create", "events", ("-n", "default"), True),
        (CONTROLLER, "create", "events.events.k8s.io", ("-n", "default"), True),
        (CONTROLLER, "create", "remediations.unstick.dev", ("-n", "x"), True),
        (
            CONTROLLER,
            "patch",
            "remediations.unstick.dev",
            ("--subresource=status", "-n", "x"),
            True,
        ),
        (CONTROLLER, "watch", "remediationpolicies.unstick.dev", (), True),
        # the leader Lease: its own, in the release's namespace only
        (CONTROLLER, "create", "leases.coordination.k8s.io", ("-n", NAMESPACE), True),
        (CONTROLLER, "update", f"leases.coordination.k8s.io/{CONTROLLER}", ("-n", NAMESPACE), True),
        (CONTROLLER, "get", f"leases.coordination.k8s.io/{CONTROLLER}", ("-n", NAMESPACE), True),
        (CONTROLLER, "update", "leases.coordination.k8s.io/other", ("-n", NAMESPACE), False),
        (
            CONTROLLER,
            "delete",
            f"leases.coordination.k8s.io/{CONTROLLER}",
            ("-n", NAMESPACE),
            False,
        ),
        (CONTROLLER, "create", "leases.coordination.k8s.io", ("-n", "default"), False),
        (CONTROLLER, "update", "clusterroles.rbac.authorization.k8s.io", (), False),
    ],
)
def test_service_account_permissions(
    release: tuple[Release, str],
    sa: str,
    verb: str,
    resource: str,
    extra: tuple[str, ...],
    allowed: bool,
) -> None:
    rel, _ = release
    assert rel.can_i(sa, verb, resource, *extra) is allowed


def test_turning_dry_run_off_is_one_upgrade(release: tuple[Release, str]) -> None:
    rel, _ = release
    proc = rel.run("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "policy.dryRun=false")
    assert rel.get("remediationpolicy", POLICY)["spec"]["dryRun"] is False
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl get remediations -A" in notes
    assert "DRY-RUN" not in notes
