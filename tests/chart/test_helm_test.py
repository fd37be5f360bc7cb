"""What `helm test` and `helm install` tell a user, against the test API server: the hook's
check (files/helm-test.py, the script the test pod runs) passes when a real controller
answers on /metrics and every agent is ready, and names what is wrong otherwise; NOTES.txt
names the image and the dry-run state. No pods run here (no kubelet): the Deployment's and
DaemonSet's status are written as the kube-controller-manager would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import ControlPlane
from tests.support.controller import Controller, crds_installed

from .render import CHART, helm_env, run_helm

pytestmark = pytest.mark.envtest

SCRIPT = CHART / "files" / "helm-test.py"


def check(cp: ControlPlane, namespace: str, url: str) -> subprocess.CompletedProcess[str]:
    """The test pod's command, run here with the test cluster's kubeconfig."""
    env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    argv = [sys.executable, "-c", SCRIPT.read_text(), namespace, "unstick-controller",
            "unstick-agent", url]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def set_status(cp: ControlPlane, namespace: str, kind: str, status: dict[str, Any]) -> None:
    cp.kubectl("patch", kind, f"unstick-{'controller' if kind == 'deployment' else 'agent'}",
               "-n", namespace, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": status}))  # fmt: skip


@pytest.fixture
def workloads(helm: str, control_plane: ControlPlane, namespace: str) -> Iterator[None]:
    """The chart's Deployment and DaemonSet (as rendered) in the test's namespace."""
    out = run_helm(helm, "template", "unstick", str(CHART), "-n", namespace, "--skip-tests")
    docs = [
        d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] in ("Deployment", "DaemonSet")
    ]
    control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        yield
    finally:
        control_plane.kubectl("delete", "-n", namespace, "deployment/unstick-controller",
                              "daemonset/unstick-agent", "--wait=false")  # fmt: skip


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> Iterator[None]:
    """The CRDs, for a client-side dry run (it maps every kind, renders and creates nothing)."""
    with crds_installed(control_plane):
        yield


def test_the_check_passes_when_the_controller_answers_and_the_agents_run(
    control_plane: ControlPlane, crds: None, namespace: str, workloads: None, tmp_path: Path
) -> None:
    # one of the two replicas ready: the standby may still be starting (#31)
    set_status(control_plane, namespace, "deployment", {"replicas": 2, "readyReplicas": 1})
    set_status(control_plane, namespace, "daemonset", {
        "desiredNumberScheduled": 3, "numberReady": 3, "currentNumberScheduled": 3,
        "numberMisscheduled": 0})  # fmt: skip
    ctl = Controller(control_plane, tmp_path / "controller.log")
    try:
        ctl.start()
        url = f"http://127.0.0.1:{ctl.metrics_port}/metrics"
        ok = check(control_plane, namespace, url)
    finally:
        ctl.stop()
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        "controller: 1/2 replicas of unstick-controller ready",
        f"controller: answers at {url}",
        "agents: 3/3 of daemonset unstick-agent ready",
    ]
    # the controller is gone now: its /metrics no longer answers
    gone = check(control_plane, namespace, url)
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"FAILED controller: {url} does not answer")


def test_the_check_names_what_is_not_running(
    control_plane: ControlPlane, namespace: str, workloads: None
) -> None:
    set_status(control_plane, namespace, "deployment", {"replicas": 2, "readyReplicas": 0})
    set_status(control_plane, namespace, "daemonset", {
        "desiredNumberScheduled": 3, "numberReady": 2, "currentNumberScheduled": 3,
        "numberMisscheduled": 0})  # fmt: skip
    out = check(control_plane, namespace, "")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "FAILED controller: 0/2 replicas of unstick-controller ready",
        "FAILED agents: 2/3 of daemonset unstick-agent ready",
    ]


@pytest.mark.parametrize(
    ("args", "says", "never"),
    [
        ((), "RemediationPolicy is in DRY-RUN", "is ACTIVE"),
        (("--set", "policy.dryRun=false"), "RemediationPolicy is ACTIVE", "DRY-RUN"),
        (("--set", "policy.create=false"), "No RemediationPolicy was created", "DRY-RUN"),
    ],
)
def test_notes_name_the_image_and_the_dry_run_state(
    helm: str, control_plane: ControlPlane, crds: None, tmp_path: Path, args: tuple[str, ...],
    says: str, never: str,
) -> None:  # fmt: skip
    out = subprocess.run(
        [helm, "install", "notes-test", str(CHART), "-n", "notes-test", "--dry-run=client",
         f"--kubeconfig={control_plane.kubeconfig}", "--set", "image.tag=1.2.3", *args],
        capture_output=True, text=True, env=helm_env(tmp_path), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[1]
    assert "Image (controller and agents): ghcr.io/unstick-dev/unstick:1.2.3" in notes
    assert says in notes and never not in notes
    assert "helm test notes-test -n notes-test" in notes
