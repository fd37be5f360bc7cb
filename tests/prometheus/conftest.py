"""The stack the Prometheus tests run against, once per module: the real control plane,
the controller and an agent as real processes, and a real Prometheus scraping both and
evaluating the chart's own alerting rules (rendered with short `for:` durations)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane, node_manifest
from devcluster.process import Process, free_port, wait_until
from devcluster.prometheus import Prometheus, RenderedChart, ScrapeTarget, render_chart
from tests.support.controller import Controller, Objects, crds_installed, policy_spec

# Short durations so that pending → firing takes seconds; the shipped defaults are minutes.
TEST_VALUES: dict[str, Any] = {
    "prometheusRule": {
        "stuckFor": "4s",
        "notRemediableFor": "4s",
        "csiDriverMissingFor": "4s",
        "namespaceBlockedByApiFor": "4s",
        "agentDownFor": "4s",
        "agentsAbsentFor": "4s",
        "failedWindow": "2m",
        "refusalWindow": "2m",
    },
    "grafanaDashboard": {"enabled": True},
}
ORPHAN_UID = "0rphan00-0000-4000-8000-000000000000"


@dataclass
class Stack:
    cp: ControlPlane
    objects: Objects
    controller: Controller
    prometheus: Prometheus
    chart: RenderedChart
    agent_node: str


def _agent(cp: ControlPlane, node: str, work: Path, port: int) -> Process:
    """`unstick agent` for `node` with a kubelet root and a mount table of its own: one
    orphaned mount (a pod dir the API does not know) for unstick_node_orphaned_mounts."""
    root = work / "kubelet"
    orphan = root / "pods" / ORPHAN_UID / "volumes" / "kubernetes.io~empty-dir" / "cache"
    orphan.mkdir(parents=True)
    (work / "mountinfo").write_text(f"60 22 0:50 / {orphan} rw - tmpfs tmpfs rw\n")
    exe = Path(sys.executable).parent / "unstick"
    argv = [str(exe), "agent", "--node-name", node, "--kubelet-root", str(root)]
    argv += ["--host-proc", "/proc", "--mountinfo", str(work / "mountinfo")]
    argv += ["--kubeconfig", str(cp.kubeconfig), "--metrics-port", str(port)]
    argv += ["--metrics-address", "127.0.0.1", "--state-dir", str(work / "state")]
    argv += ["--kubelet-healthz", "http://127.0.0.1:9/healthz", "--log-level", "WARNING"]
    return Process("agent", argv, work / "agent.log").start()


@pytest.fixture(scope="module")
def control_plane() -> Iterator[ControlPlane]:
    """The stack's own control plane, in place of the session's here (and so under the
    session's `core_api` and `namespace` too): the session's holds what earlier tests left
    (Remediations the stack's controller refuses as forged fire UnstickRequestsRefused in
    the healthy test: seen once tests/envtest no longer ran in between, hack/run-tests.sh)."""
    with ControlPlane() as cp:
        yield cp


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("prometheus")
    chart = render_chart(control_plane.bin_dir / "helm", TEST_VALUES)
    with crds_installed(control_plane):
        objects = Objects(control_plane)
        # `default` serves every namespace: pods not opted in are judged with its slack (1 s)
        before = objects.replace_policy("default", policy_spec(probeMaxAgeSeconds=30))
        node = f"prom-{uuid.uuid4().hex[:6]}"
        objects.core.create_node(node_manifest(node, kubelet=False))
        # The old flow, run with --no-node-round-trip: test_alerts' failing action plays
        # the agent through its probe request and spec.nodeSteps (what an agent of the
        # previous release answers; supported for one more release, docs/upgrading.md).
        controller = Controller(
            control_plane, work / "controller.log", extra_args=("--no-node-round-trip",)
        )
        agent: Process | None = None
        prometheus: Prometheus | None = None
        try:
            controller.start()
            # Chosen once the controller listens: two free_port() calls before either binds
            # can return the same port (then the agent died with EADDRINUSE and Prometheus
            # scraped the controller twice, both "up").
            agent_port = free_port()
            assert agent_port != controller.metrics_port
            agent = _agent(control_plane, node, work, agent_port)
            (ctl_job, _), (agent_job, _) = (
                chart.metrics_services[c] for c in ("controller", "agent")
            )
            targets = [
                ScrapeTarget(ctl_job, f"127.0.0.1:{controller.metrics_port}"),
                ScrapeTarget(agent_job, f"127.0.0.1:{agent_port}", {"node": node}),
            ]
            prometheus = Prometheus(control_plane.bin_dir, targets, chart.rule_groups).start()
            wait_until(
                lambda: prometheus.targets_up() == {ctl_job: "up", agent_job: "up"},
                timeout=60,
                what="both targets up in Prometheus",
            )
            yield Stack(control_plane, objects, controller, prometheus, chart, node)
        finally:
            if prometheus is not None:
                print(prometheus.log_tail())
                prometheus.stop()
            if agent is not None:
                print(agent.log_tail())
                agent.stop()
            controller.stop()
            print(controller.log()[-3000:])
            objects.core.delete_node(node)
            objects.replace_policy("default", before)
            objects.api_client.close()
