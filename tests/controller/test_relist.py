"""A pod watch that expired (410 Gone) is relisted and nothing is missed.

A control plane of its own, with the watch cache off (watches are served by etcd) and the
API server's periodic compaction off, so the test decides when history is gone: the
controller is frozen (SIGSTOP), the API server restarted (its watch connection drops),
a pod is deleted on a deleted node, and etcd is compacted past the controller's last
resourceVersion. Resumed, the controller re-watches from that version, gets 410 Gone,
relists, and still force-deletes the pod.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane, ControlPlaneSettings, node_manifest
from devcluster.process import wait_until
from tests.support.controller import Controller, Objects, crds_installed, policy_spec

pytestmark = [pytest.mark.envtest, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    settings = ControlPlaneSettings(
        extra_apiserver_args=("--watch-cache=false", "--etcd-compaction-interval=0")
    )
    plane = ControlPlane(settings).start()
    try:
        yield plane
    finally:
        plane.stop()


def _etcd(cp: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{cp.etcd_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        result: dict[str, Any] = json.loads(resp.read())
    return result


def _compact_etcd(cp: ControlPlane) -> int:
    """Compact etcd at its current revision (the gRPC gateway of etcd v3)."""
    key = base64.b64encode(b"/registry").decode()
    revision = int(_etcd(cp, "/v3/kv/range", {"key": key})["header"]["revision"])
    _etcd(cp, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


def test_expired_watch_is_relisted_and_nothing_missed(cp: ControlPlane, tmp_path: Path) -> None:
    with crds_installed(cp):
        objects = Objects(cp)
        objects.create_policy("default", policy_spec())
        objects.core.create_namespace(
            {"metadata": {"name": "relist", "labels": {"unstick.dev/remediate": "true"}}}
        )
        objects.core.create_node(node_manifest("lost-node", kubelet=False))
        pod = objects.pod("relist", "lost-node")
        controller = Controller(cp, tmp_path / "controller.log").start()
        try:
            assert controller.proc is not None
            os.kill(controller.proc.pid, signal.SIGSTOP)
            try:
                cp.restart_apiserver()
                objects = Objects(cp)  # fresh connections to the restarted server
                objects.core.delete_node("lost-node")
                objects.core.delete_namespaced_pod(pod["name"], "relist")
                _compact_etcd(cp)
            finally:
                os.kill(controller.proc.pid, signal.SIGCONT)
            wait_until(
                lambda: "410 Gone), relisting" in controller.log(),
                timeout=60,
                what="the controller to see its watch expired",
            )
            objects.pod_gone(
                "relist",
                pod,
                timeout=60,
                what="the pod deleted while the watch was gone to be force-deleted",
            )
            incident = wait_until(
                lambda: objects.incident("relist", pod), timeout=30, what="the pod's node incident"
            )
            assert incident["status"]["cause"] == "NodeGone"
        finally:
            controller.stop()
