"""`kubectl unstick` through the real kubectl binary (bin/kubectl): kubectl finds the
`kubectl-unstick` entry point on PATH and runs it; `why` diagnoses a really stuck pod of
the test API server live, under the policy in force, and `snapshot` records that policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import Objects, crds_installed, policy_spec

pytestmark = pytest.mark.envtest

VENV_BIN = Path(sys.executable).parent
HOLD = "example.com/hold"


def _kubectl(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{cp.bin_dir}{os.pathsep}/usr/bin:/bin"
    env["KUBECONFIG"] = str(cp.kubeconfig)
    kubectl = str(cp.bin_dir / "kubectl")
    return subprocess.run([kubectl, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture(scope="module")
def objects(control_plane: ControlPlane) -> Iterator[Objects]:
    if not (VENV_BIN / "kubectl-unstick").exists():
        pytest.fail(f"no kubectl-unstick in {VENV_BIN}: pip install -e . (make venv)")
    with crds_installed(control_plane):
        objs = Objects(control_plane)
        before = objs.replace_policy("default", policy_spec())  # slack 1 s
        try:
            yield objs
        finally:
            objs.replace_policy("default", before)
            objs.api_client.close()


def test_kubectl_finds_the_plugin_and_its_help(control_plane: ControlPlane) -> None:
    listed = _kubectl(control_plane, "plugin", "list")
    assert str(VENV_BIN / "kubectl-unstick") in listed.stdout, listed
    helped = _kubectl(control_plane, "unstick", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: kubectl unstick")
    for command in ("status", "why", "snapshot", "diagnose"):
        assert command in helped.stdout
        sub = _kubectl(control_plane, "unstick", command, "--help")
        assert sub.returncode == 0, (command, sub.stderr)
    version = _kubectl(control_plane, "unstick", "--version")
    assert version.returncode == 0 and version.stdout.strip() == "unstick 0.1.0"


def test_kubectl_unstick_why_and_snapshot_of_a_stuck_pod(
    control_plane: ControlPlane, objects: Objects, namespace: str
) -> None:
    node = f"gone-{uuid.uuid4().hex[:6]}"  # no Node object: NodeGone once past the slack
    pod = objects.stuck_pod(namespace, node, remediate="true", finalizers=[HOLD])
    target = f"{namespace}/{pod['name']}"

    def why() -> dict[str, object] | None:
        out = _kubectl(control_plane, "unstick", "why", target, "--output", "json")
        assert out.returncode == 0, out.stderr
        report: dict[str, object] = json.loads(out.stdout)
        return report if report["stuck"] else None

    report = wait_until(why, timeout=30, what="kubectl unstick why: stuck")
    assert report["cause"] == "NodeGone" and report["pod"] == target
    assert [s["action"] for s in report["plan"]] == ["force-delete"]  # type: ignore[union-attr]
    text = _kubectl(control_plane, "unstick", "why", target)
    assert "NodeGone" in text.stdout and "(diagnosed under policy default)" in text.stdout
    snap = _kubectl(control_plane, "unstick", "snapshot", target)
    assert snap.returncode == 0, snap.stderr
    bundle = json.loads(snap.stdout)
    assert bundle["policy"]["metadata"]["name"] == "default"
    assert bundle["policy"]["spec"]["slackSeconds"] == 1
    assert objects.read_pod(namespace, pod["name"]) is not None, "why must not act"
    status = _kubectl(control_plane, "unstick", "status", "--output", "json")  # H6's command
    assert status.returncode == 0, status.stderr
    assert isinstance(json.loads(status.stdout), dict)


def test_kubectl_unstick_why_of_a_missing_pod_is_one_line(
    control_plane: ControlPlane, objects: Objects, namespace: str
) -> None:
    out = _kubectl(control_plane, "unstick", "why", f"{namespace}/nope")
    assert out.returncode == 1
    assert out.stderr.strip() == f"unstick why: pod {namespace}/nope not found"
    bad = _kubectl(control_plane, "unstick", "why", "a/b/c")  # a bare POD is kubectl's: valid
    assert bad.returncode == 2 and "is not NAMESPACE/POD" in bad.stderr
