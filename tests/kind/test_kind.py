"""The whole thing in a real kind cluster (pytest-kind): the image built from the
Dockerfile, the chart installed with helm, a pod stuck on a deleted node force-deleted.

Needs Docker and kind: skipped with the reason where there is no Docker engine (as on the
development machines of this project). Run with `pytest -m kind tests/kind`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from unstick.devcluster.process import wait_until

pytestmark = [pytest.mark.kind, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "unstick:kind-test"


@pytest.fixture(scope="module")
def cluster(kind_cluster: Any) -> Any:
    subprocess.run(["docker", "build", "-t", IMAGE, str(ROOT)], check=True)
    kind_cluster.load_docker_image(IMAGE)
    subprocess.run(
        [
            "helm", "install", "unstick", str(ROOT / "charts/unstick"), "-n", "unstick",
            "--create-namespace", f"--kubeconfig={kind_cluster.kubeconfig_path}",
            "--set", "image.repository=unstick", "--set", "image.tag=kind-test",
            "--set", "policy.dryRun=false", "--wait", "--timeout", "5m",
        ],
        check=True,
    )  # fmt: skip
    return kind_cluster


def test_pod_on_deleted_node_is_force_deleted(cluster: Any) -> None:
    cluster.kubectl("create", "namespace", "kind-demo")
    cluster.kubectl("label", "namespace", "kind-demo", "unstick.dev/remediate=true")
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ghost"}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orphan", "namespace": "kind-demo"},
        "spec": {"nodeName": "ghost", "containers": [{"name": "c", "image": "busybox"}]},
    }
    for obj in (node, pod):
        subprocess.run(
            ["kubectl", f"--kubeconfig={cluster.kubeconfig_path}", "apply", "-f", "-"],
            input=json.dumps(obj), text=True, check=True,
        )  # fmt: skip
    cluster.kubectl("delete", "pod", "orphan", "-n", "kind-demo", "--wait=false")
    cluster.kubectl("delete", "node", "ghost")

    def gone() -> bool:
        out = cluster.kubectl("get", "pods", "-n", "kind-demo", "-o", "name")
        return "orphan" not in out

    wait_until(gone, timeout=300, what="unstick to force-delete the pod of the deleted node")
    rems = json.loads(cluster.kubectl("get", "remediations", "-n", "kind-demo", "-o", "json"))
    assert [r["status"]["cause"] for r in rems["items"]] == ["NodeGone"]
