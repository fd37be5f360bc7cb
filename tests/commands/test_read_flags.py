"""The read commands with kubectl's flags against a real kube-apiserver: `-n NAMESPACE POD`,
a bare POD in the context's namespace, `--context` picking a context that is not the
current one, and `-o json|yaml|wide` giving the same data in each format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import ControlPlane

pytestmark = pytest.mark.envtest

VENV_BIN = Path(sys.executable).parent


def unstick(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [str(VENV_BIN / "unstick"), *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, (args, out.stderr)
    return out


@pytest.fixture
def stuck_pod(core_api: Any, namespace: str, make_node: Any) -> str:
    """web-0 Terminating on a node without a kubelet, held by a finalizer."""
    node = make_node(kubelet=False)
    core_api.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "web-0", "finalizers": ["example.com/hold"]},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "registry.example/app:1"}],
            },
        },
    )
    core_api.delete_namespaced_pod("web-0", namespace)
    return "web-0"


@pytest.fixture
def two_contexts(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Path:
    """The test cluster's kubeconfig with a second, unreachable cluster as the current
    context; the working context `good` defaults to the test's namespace."""
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    (real,) = config["contexts"]
    config["clusters"].append({"name": "dead", "cluster": {"server": "https://127.0.0.1:1"}})
    config["contexts"] = [
        {"name": "dead", "context": {"cluster": "dead", "user": real["context"]["user"]}},
        {"name": "good", "context": {**real["context"], "namespace": namespace}},
    ]
    config["current-context"] = "dead"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_snapshot_with_n_and_yaml_is_the_json_bundle(
    control_plane: ControlPlane, namespace: str, stuck_pod: str
) -> None:
    kc = ("--kubeconfig", str(control_plane.kubeconfig))
    as_yaml = yaml.safe_load(
        unstick("snapshot", "-n", namespace, stuck_pod, *kc, "-o", "yaml").stdout
    )
    as_json = json.loads(unstick("snapshot", f"{namespace}/{stuck_pod}", *kc).stdout)
    for bundle in (as_yaml, as_json):
        assert bundle["pod"]["metadata"]["name"] == stuck_pod
        assert bundle["pod"]["metadata"]["namespace"] == namespace
    assert as_yaml["pod"]["metadata"]["uid"] == as_json["pod"]["metadata"]["uid"]


def test_context_flag_and_the_contexts_namespace(
    namespace: str, stuck_pod: str, two_contexts: Path
) -> None:
    kc = ("--kubeconfig", str(two_contexts), "--context", "good")
    report = yaml.safe_load(unstick("why", stuck_pod, *kc, "-o", "yaml").stdout)
    assert report["pod"] == f"{namespace}/{stuck_pod}"
    assert report["stuck"] is False  # deleted a moment ago: within the slack
    text = unstick("why", stuck_pod, *kc).stdout
    assert text.startswith(f"pod {namespace}/{stuck_pod} (uid {report['uid']})")
    wide = unstick("why", stuck_pod, *kc, "-o", "wide").stdout  # the same lines as text
    assert [line.split(":")[0] for line in wide.splitlines()] == [
        line.split(":")[0] for line in text.splitlines()
    ]
    # without --context the current one (unreachable) is used: a failure, not a traceback
    dead = subprocess.run(
        [str(VENV_BIN / "unstick"), "why", stuck_pod, "--kubeconfig", str(two_contexts)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert dead.returncode == 1 and "cannot reach the API server" in dead.stderr
    assert len(dead.stderr.strip().splitlines()) == 1 + dead.stderr.count("retrying")


def test_status_of_one_namespace_in_every_format(
    control_plane: ControlPlane, namespace: str, stuck_pod: str
) -> None:
    kc = ("--kubeconfig", str(control_plane.kubeconfig))
    as_json = json.loads(unstick("status", "-n", namespace, *kc, "-o", "json").stdout)
    as_yaml = yaml.safe_load(unstick("status", "-n", namespace, *kc, "-o", "yaml").stdout)
    for data in (as_json, as_yaml):
        assert [s["pod"] for s in data["stuckPods"]] == [f"{namespace}/{stuck_pod}"]
        assert data["orphanedPodDirs"] == []
    (pod,) = as_json["stuckPods"]
    text = unstick("status", "-n", namespace, *kc).stdout
    wide = unstick("status", "-n", namespace, *kc, "-o", "wide").stdout
    assert f"{namespace}/{stuck_pod}" in text and f"uid={pod['uid']}" not in text
    assert f"uid={pod['uid']}" in wide
