"""The chart, installed with `helm install` and the image built here from the project's
Dockerfile, runs on the real node: the controller Deployment and the agent DaemonSet
become Ready there (the agent privileged, hostPID, the kubelet root mounted with
Bidirectional propagation, the CRI socket), and both serve /metrics from their pods."""

from __future__ import annotations

import pytest

from devcluster.node import RealNode

from .support import Release, eventually, pod_logs, scrape

pytestmark = pytest.mark.node


def test_controller_and_agent_run_on_the_real_node(
    real_node: RealNode, unstick_release: Release
) -> None:
    pods = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in unstick_release.pods()
    }
    assert set(pods) == {"controller", "agent"}
    for pod in pods.values():
        assert pod["spec"]["nodeName"] == real_node.settings.name
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0, status
    # The agent really is on the node's host PID namespace and sees its kubelet root.
    assert pods["agent"]["spec"]["hostPID"] is True
    # `kubectl logs` reaches the real kubelet (its serving certificate is signed by the
    # control plane's CA; the API server dials the node's InternalIP).
    node = real_node.control_plane.request("GET", f"/api/v1/nodes/{real_node.settings.name}")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == real_node.settings.network.gateway, addresses
    assert "controller running: watching pods" in pod_logs(unstick_release, "controller")


def test_metrics_are_scraped_from_the_pods(unstick_release: Release) -> None:
    pods = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in unstick_release.pods()
    }
    controller_ip = pods["controller"]["status"]["podIP"]
    agent_ip = pods["agent"]["status"]["podIP"]  # hostNetwork: the node's address
    controller = eventually(
        lambda: scrape(f"http://{controller_ip}:9100/metrics"), 30, "controller /metrics"
    )
    agent = eventually(lambda: scrape(f"http://{agent_ip}:9101/metrics"), 30, "agent /metrics")
    assert "unstick_stuck_pods" in controller
    assert "unstick_node_orphaned_mounts" in agent
