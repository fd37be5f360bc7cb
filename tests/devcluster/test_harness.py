"""The harness itself: real binaries, a real API server, and the behaviour the rest of
the suite relies on (a pod on a kubelet-less node stays Terminating; kwok finalises)."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.pods import pod_body

pytestmark = pytest.mark.envtest


def _pinned_minor() -> str:
    """'v1.<minor>.' of the k8s.io/kubernetes tools/kubernetes/go.mod pins (what make tools
    built; make test-matrix pins another version in its own copy), or of
    $UNSTICK_KUBE_VERSION (make test-envtest KUBE_VERSION=...: another version's binaries)."""
    other = re.match(r"v1\.\d+\.", os.environ.get("UNSTICK_KUBE_VERSION", ""))
    if other:
        return other.group(0)
    gomod = Path(__file__).parents[2] / "tools" / "kubernetes" / "go.mod"
    match = re.search(r"^require k8s\.io/kubernetes (v1\.\d+\.)", gomod.read_text(), re.M)
    assert match, f"{gomod}: no 'require k8s.io/kubernetes v1.N.P' line"
    return match.group(1)


K8S = _pinned_minor()


def _version(control_plane: ControlPlane, *argv: str) -> str:
    out = subprocess.run(
        [str(control_plane.bin_dir / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout + out.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("kube-apiserver", "--version"), f"Kubernetes {K8S}"),
        (("kubectl", "version", "--client"), f"Client Version: {K8S}"),
        (("kube-controller-manager", "--version"), f"Kubernetes {K8S}"),
        (("etcd", "--version"), "etcd Version: 3.6."),
        (("kwok", "--version"), "kwok version v0.8.0"),
        (("helm", "version"), 'Version:"v3.'),
    ],
)
def test_binaries_print_real_versions(
    control_plane: ControlPlane, argv: tuple[str, ...], expected: str
) -> None:
    assert expected in _version(control_plane, *argv)


def test_api_server_is_real(control_plane: ControlPlane) -> None:
    version = control_plane.request("GET", "/version")
    assert version["gitVersion"].startswith(K8S)
    assert control_plane.request("GET", "/readyz") == "ok"
    # RBAC is on: an unknown user is forbidden, not let through.
    out = control_plane.kubectl("auth", "can-i", "delete", "pods", "--as=someone", check=False)
    assert out.stdout.strip() == "no"


def test_pod_without_kubelet_stays_terminating_kwok_pod_goes(
    core_api: client.CoreV1Api, kwok: Any, namespace: str, make_node: Any
) -> None:
    lost = make_node(kubelet=False)
    served = make_node(kubelet=True)
    core_api.create_namespaced_pod(namespace, pod_body("stuck", lost))
    core_api.create_namespaced_pod(namespace, pod_body("fine", served))
    wait_until(
        lambda: core_api.read_namespaced_pod("fine", namespace).status.phase == "Running",
        timeout=60,
        what="kwok to run the pod on its node",
    )

    core_api.delete_namespaced_pod("stuck", namespace)
    core_api.delete_namespaced_pod("fine", namespace)

    def fine_gone() -> bool:
        names = {p.metadata.name for p in core_api.list_namespaced_pod(namespace).items}
        return "fine" not in names

    wait_until(fine_gone, timeout=60, what="kwok to finalise the pod on its node")
    # The kwok pod was finalised after its 1 s grace period; the other one is still here.
    stuck = core_api.read_namespaced_pod("stuck", namespace)
    assert stuck.metadata.deletion_timestamp is not None
    assert stuck.metadata.deletion_grace_period_seconds == 1
    assert stuck.spec.node_name == lost


def test_crd_can_be_applied_and_watched(control_plane: ControlPlane, namespace: str) -> None:
    group = f"g{uuid.uuid4().hex[:6]}.unstick.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    api_client = control_plane.api_client()
    try:
        ext = client.ApiextensionsV1Api(api_client)
        ext.create_custom_resource_definition(crd)

        def established() -> bool:
            got = ext.read_custom_resource_definition(f"widgets.{group}")
            return any(
                c.type == "Established" and c.status == "True"
                for c in (got.status.conditions or [])
            )

        wait_until(established, timeout=30, what="the CRD to be Established")
        custom = client.CustomObjectsApi(api_client)
        custom.create_namespaced_custom_object(
            group,
            "v1",
            namespace,
            "widgets",
            {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": "w1"},
                "spec": {"size": 3},
            },
        )
        seen = []
        w = watch.Watch()
        for event in w.stream(
            custom.list_namespaced_custom_object,
            group,
            "v1",
            namespace,
            "widgets",
            timeout_seconds=10,
        ):
            seen.append(
                (event["type"], event["object"]["metadata"]["name"], event["object"]["spec"])
            )
            w.stop()
        assert seen == [("ADDED", "w1", {"size": 3})]
        ext.delete_custom_resource_definition(f"widgets.{group}")
    finally:
        api_client.close()
