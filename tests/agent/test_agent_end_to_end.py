"""The agent loop against a real kube-apiserver: it sees only Remediations labelled for its
node, answers a probe request, GETs the pod before node steps (refused while the pod is
not terminating), runs node steps (rmdir-stale on a real stale dir) once the pod is an
overdue Terminating pod and reports them in status, and serves /metrics and /healthz. No
mounts: the mount table is a text file here (the mount work is covered by test_mountns.py)."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster.process import free_port, wait_until
from tests.agent.policy_sources import default_policy
from tests.support.agent import agent_running, node_under, watching
from tests.support.remediations import remediation
from unstick.kube.client import Kube, remediation_path

pytestmark = pytest.mark.envtest

CRDS = Path(__file__).parents[2] / "operator" / "unstick" / "crds"
POLICIES = "/apis/unstick.dev/v1alpha1/remediationpolicies"
ORPHAN = "eeeeeeee-5555-4555-8555-eeeeeeeeeeee"


HOLD = "unstick.dev/test-hold"  # keeps the test's pod Terminating (no kubelet here)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _deleted_at(kube: Kube, path: str) -> str | None:
    pod = kube.get(path) or {}
    return (pod.get("metadata") or {}).get("deletionTimestamp")  # type: ignore[no-any-return]


def held_pod(kube: Kube, ns: str, node: str) -> str:
    """The pod web-0 a Remediation names: bound to `node`, held by a finalizer so that it
    stays Terminating once deleted (no kubelet here); its uid, from the API server."""
    body = {
        "metadata": {"name": "web-0", "finalizers": [HOLD]},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app:1"}]},
    }
    uid: str = kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)["metadata"]["uid"]
    return uid


def status_of(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    """The status of Remediation `name` (empty while it has none)."""
    found: dict[str, Any] = (kube.get(remediation_path(ns, name)) or {}).get("status") or {}
    return found


def node_steps_done(kube: Kube, ns: str, name: str, steps: list[dict[str, str]]) -> dict[str, Any]:
    """Ask, as the controller does, for these node steps on Remediation `name`; its status
    once the agent has answered them (`nodeStepsDoneAt` at or after the request)."""
    requested = now()
    kube.request(
        "PATCH",
        remediation_path(ns, name),
        body={"spec": {"nodeSteps": steps, "nodeStepsRequestedAt": requested, "dryRun": False}},
        content_type="application/merge-patch+json",
    )
    done: dict[str, Any] = wait_until(
        lambda: (
            (s := status_of(kube, ns, name)) and (s.get("nodeStepsDoneAt") or "") >= requested and s
        ),
        timeout=60,
        what="the node steps",
    )
    return done


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_agent_probes_and_runs_node_steps_for_its_node_only(
    control_plane: Any, kube: Kube, tmp_path: Path
) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    ns = f"agent-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    pod_uid = held_pod(kube, ns, node)
    pod_path = f"/api/v1/namespaces/{ns}/pods/web-0"
    root = tmp_path / "kubelet"
    stale = root / "pods" / pod_uid / "volumes" / "kubernetes.io~empty-dir" / "cache"
    stale.mkdir(parents=True)
    orphan = f"{root}/pods/{ORPHAN}/volumes/kubernetes.io~projected/tok"
    # the real /proc: the container check before rmdir-stale needs a complete cgroup scan
    # (no process of the pod's UID runs here); an empty one would be blind
    settings = node_under(tmp_path, node, mountinfo=f"60 22 0:50 / {orphan} rw - tmpfs tmpfs rw\n")
    port = free_port()
    loop = watching(control_plane.kubeconfig, port, summary_interval_s=0.5)
    try:
        with agent_running(settings, loop):
            for name, for_node, uid in (("web-0", node, pod_uid), ("other", "elsewhere", ORPHAN)):
                body = remediation(name, uid, for_node, probeRequestedAt=now())
                kube.request("POST", remediation_path(ns), body=body)

            def status(name: str) -> dict[str, Any]:
                return status_of(kube, ns, name)

            # a probe of a pod that is not Terminating is refused (the same pod check as for
            # node steps): on record, and no probe is written
            refusal = wait_until(
                lambda: status("web-0").get("nodeRefusals"), timeout=60, what="the probe refusal"
            )
            assert refusal[0]["action"] == "probe" and "is not terminating" in refusal[0]["message"]
            assert "probe" not in status("web-0")

            step = {"action": "rmdir-stale", "target": "", "reason": "test"}

            def request_steps() -> dict[str, Any]:
                return node_steps_done(kube, ns, "web-0", [step])

            # the pod is running (not terminating): the agent GETs it and refuses
            (refused,) = request_steps()["nodeActions"]
            assert refused["result"] == "refused", refused
            assert "is not terminating" in refused["message"], refused
            assert stale.is_dir()
            kube.request("DELETE", pod_path, body={"gracePeriodSeconds": 0})
            wait_until(
                lambda: _deleted_at(kube, pod_path), timeout=60, what="the pod's deletionTimestamp"
            )
            kube.request(
                "PATCH",
                remediation_path(ns, "web-0"),
                body={"spec": {"probeRequestedAt": now()}},
                content_type="application/merge-patch+json",
            )
            probe = wait_until(lambda: status("web-0").get("probe"), timeout=60, what="the probe")
            assert probe["nodeName"] == node
            assert {"path": str(stale), "empty": True} in probe["volumeDirs"]
            assert probe["mountinfo"] == ""
            # Terminating and overdue, but neither the pod nor its namespace opted in: refused,
            # whatever the record says (dryRun: false)
            (refused,) = request_steps()["nodeActions"]
            assert refused["result"] == "refused" and "has not opted in" in refused["message"]
            assert stale.is_dir()
            # the namespace opts in and the admin's default policy permits rmdir-stale: runs
            kube.request(
                "PATCH",
                f"/api/v1/namespaces/{ns}",
                body={"metadata": {"labels": {"unstick.dev/remediate": "true"}}},
                content_type="application/merge-patch+json",
            )
            with default_policy(kube, ["rmdir-stale"]):
                done = request_steps()
            (action,) = done["nodeActions"]
            assert action["action"] == "rmdir-stale" and action["result"] == "succeeded", action
            assert not stale.exists() and (root / "pods" / pod_uid / "volumes").is_dir()
            assert done["probe"]["volumeDirs"] == []

            def orphan_gauge() -> bool:
                code, text = _get(f"http://127.0.0.1:{port}/metrics")
                return code == 200 and f'unstick_node_orphaned_mounts{{node="{node}"}} 1.0' in text

            wait_until(orphan_gauge, timeout=60, what="the orphaned-mount gauge")
            _, text = _get(f"http://127.0.0.1:{port}/metrics")
            assert "unstick_node_probe_duration_seconds_count" in text
            assert 'unstick_refusals_total{reason="not_opted_in"} 1.0' in text
            assert 'unstick_refusals_total{reason="forged"} 2.0' in text  # probe + steps, running
            assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
            assert "probe" not in status("other"), "a Remediation of another node was touched"
    finally:
        try:
            kube.request("PATCH", pod_path, body={"metadata": {"finalizers": None}},
                         content_type="application/merge-patch+json")  # fmt: skip
        except ApiException:
            pass
        try:
            kube.request("DELETE", f"/api/v1/namespaces/{ns}")
        except ApiException:
            pass
