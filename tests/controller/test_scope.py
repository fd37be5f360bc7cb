"""`--namespace-scope`: the controller watches and acts only in the namespaces it is given."""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import free_port
from tests.support.controller import policy_spec, running_controller

pytestmark = pytest.mark.envtest


def test_namespace_scope_limits_watch_and_actions(
    control_plane: ControlPlane, namespace: str, make_node: Any, tmp_path: Path
) -> None:
    health = free_port()
    args = ("--namespace-scope", namespace, "--health-port", str(health))
    policies = {"default": policy_spec()}
    with running_controller(control_plane, tmp_path, policies, extra_args=args) as (ctl, objects):
        other = f"t-{uuid.uuid4().hex[:10]}"
        objects.core.create_namespace({"metadata": {"name": other}})
        try:
            node = make_node(kubelet=False)
            outside = objects.pod(other, node, remediate="true")
            inside = objects.pod(namespace, node, remediate="true")
            objects.core.delete_node(node)
            objects.core.delete_namespaced_pod(outside["name"], other)
            objects.core.delete_namespaced_pod(inside["name"], namespace)
            objects.pod_gone(namespace, inside, timeout=60, what="force-delete in scope")
            assert objects.read_pod(other, outside["name"]) is not None
            assert objects.remediation(other, outside) is None
            assert f"watching pods in {namespace}" in ctl.log()
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=5) as r:
                body = json.loads(r.read())
            assert body["pods"]["synced"] is True
            assert body["pods"]["active"] is True
        finally:
            for pod in objects.core.list_namespaced_pod(other).items:
                objects.core.delete_namespaced_pod(pod.metadata.name, other, grace_period_seconds=0)
            objects.core.delete_namespace(other)
