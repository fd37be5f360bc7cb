"""The silent node on the real node (DESIGN §2 rule 3, §3): the real kubelet stops while
containerd and every container of the node keep running (a node that lost its kubelet or
its network). The real node-lifecycle controller marks the Node NotReady; a pod of an
opted-in namespace, deleted meanwhile, stays Terminating. After the policy's
nodeLostAfter unstick diagnoses `NodeUnreachable`, not fenced: it observes and does
nothing (the API server's audit log shows no write of unstick's to the pod, and the pod's
container is still running in containerd). Once the Node carries the
`node.kubernetes.io/out-of-service` taint unstick force-deletes the pod. The taint
removed and the kubelet back, the kubelet kills what is left of the pod on the node.

No other part of the cluster may finish the pod here: kube-controller-manager runs
neither podgc (which force-deletes the pods of an out-of-service node itself) nor
taint-eviction (which would evict the unreachable node's pods, unstick's own among them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.node import RealNode
from devcluster.node_cluster import CONTROLLERS, NODE_MONITOR_GRACE_S, ClusterControllers
from devcluster.node_containerd import ctr
from devcluster.node_images import NodeImages
from devcluster.process import wait_until

from .support import (
    Release,
    busybox_pod,
    component_pod,
    eventually,
    pod_exists,
    remediation_for,
    scrape,
    wait_running,
)

pytestmark = pytest.mark.node

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
NODE_LOST_AFTER_S = 8
POLICIES = "/apis/unstick.dev/v1alpha1/remediationpolicies"
WRITES = ("create", "update", "patch", "delete", "deletecollection")


# -- the node, its runtime, the audit log, the metrics -------------------------------------


def ready_status(cp: ControlPlane, node: str) -> str | None:
    obj = cp.request("GET", f"/api/v1/nodes/{node}")
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == "Ready":
            return str(cond["status"])
    return None


def tasks(node: RealNode) -> dict[str, str]:
    """containerd's tasks on the node: container id → status (RUNNING, STOPPED, ...)."""
    lines = ctr(node.containerd_settings, "task", "ls", timeout=30).splitlines()[1:]
    return {f[0]: f[2] for f in (line.split() for line in lines) if len(f) >= 3}


def container_ids(pod: dict[str, Any]) -> list[str]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return [s["containerID"].rpartition("://")[2] for s in statuses if s.get("containerID")]


def audit_mark(cp: ControlPlane) -> int:
    return sum(1 for _ in cp.audit_events())


def unstick_writes(cp: ControlPlane, namespace: str, name: str, since: int) -> list[Any]:
    """Audited writes to the pod (any subresource) by one of unstick's parts (user agents
    unstick-controller/, unstick-agent/, ...) since the mark."""
    out = []
    for i, event in enumerate(cp.audit_events()):
        ref = event.get("objectRef") or {}
        if (
            i >= since
            and str(event.get("userAgent", "")).startswith("unstick-")
            and ref.get("resource") == "pods"
            and ref.get("namespace") == namespace
            and ref.get("name") == name
            and event.get("verb") in WRITES
        ):
            out.append(event)
    return out


def sample(metrics: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition, whatever the order of its labels."""
    for line in metrics.splitlines():
        series, _, value = line.rpartition(" ")
        metric, _, rest = series.partition("{")
        pairs = dict(p.split("=", 1) for p in rest.rstrip("}").split(",") if "=" in p)
        if metric == name and {k: v.strip('"') for k, v in pairs.items()} == labels:
            return float(value)
    return 0.0


def controller_metrics(release: Release) -> str:
    ip = component_pod(release, "controller")["status"]["podIP"]
    text: str = eventually(lambda: scrape(f"http://{ip}:9100/metrics"), 30, "controller /metrics")
    return text


def taint_out_of_service(cp: ControlPlane, node: str, on: bool) -> None:
    """`kubectl taint`, as the Kubernetes docs fence a node that is known to be down."""
    spec = f"{OUT_OF_SERVICE}=nodeshutdown:NoExecute" if on else f"{OUT_OF_SERVICE}-"
    proc = cp.kubectl("taint", "node", node, spec, check=False)
    if proc.returncode != 0 and (on or "not found" not in proc.stderr):
        raise AssertionError(f"kubectl taint {spec}: {proc.stderr}")


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture
def short_node_lost(node_control_plane: ControlPlane, unstick_release: Release) -> Iterator[int]:
    """The chart's `default` RemediationPolicy with a short nodeLostAfter; restored after."""
    cp = node_control_plane
    old = cp.request("GET", f"{POLICIES}/default")["spec"]["nodeLostAfterSeconds"]

    def set_node_lost_after(seconds: int) -> None:
        patch = json.dumps({"spec": {"nodeLostAfterSeconds": seconds}})
        cp.kubectl("patch", "remediationpolicy", "default", "--type=merge", "-p", patch)

    set_node_lost_after(NODE_LOST_AFTER_S)
    try:
        yield NODE_LOST_AFTER_S
    finally:
        set_node_lost_after(old)


@pytest.fixture
def silent_node(
    real_node: RealNode, node_control_plane: ControlPlane, node_namespace: str
) -> Iterator[RealNode]:
    """Stops nothing itself; afterwards (also on failure) the taint is removed, the kubelet
    started again if it was stopped, and the node waited Ready for the tests after (and
    for the namespace's teardown, which needs the kubelet to finish its pods)."""
    try:
        yield real_node
    finally:
        try:
            taint_out_of_service(node_control_plane, real_node.settings.name, on=False)
        finally:
            if real_node.kubelet is None:
                real_node.start_kubelet()
            real_node.wait_ready()


# -- the test -------------------------------------------------------------------------------


def test_silent_node_is_observed_until_fenced_then_force_deleted(
    silent_node: RealNode,
    unstick_release: Release,
    node_cluster: ClusterControllers,
    node_images: NodeImages,
    core: Any,
    node_namespace: str,
    short_node_lost: int,
) -> None:
    # Only unstick may finish the pod here (see the module's docstring).
    assert "pod-garbage-collector-controller" not in CONTROLLERS
    assert "taint-eviction-controller" not in CONTROLLERS
    node, cp, ns = silent_node, node_cluster.control_plane, node_namespace
    name = node.settings.name
    started = time.monotonic()
    core.patch_namespace(ns, {"metadata": {"labels": {"unstick.dev/remediate": "true"}}})
    uid = core.create_namespaced_pod(
        ns, busybox_pod("app", node_images.busybox.ref, name)
    ).metadata.uid
    wait_running(core, ns, "app")
    pod = cp.request("GET", f"/api/v1/namespaces/{ns}/pods/app")
    (app,) = container_ids(pod)
    unstick_pods = {p["metadata"]["uid"]: container_ids(p) for p in unstick_release.pods()}
    assert tasks(node)[app] == "RUNNING"
    mark = audit_mark(cp)

    node.stop_kubelet()
    silenced = time.monotonic()
    core.delete_namespaced_pod("app", ns)
    wait_until(lambda: ready_status(cp, name) != "True", timeout=90, what=f"node {name} NotReady")
    not_ready_after = time.monotonic() - silenced

    # nodeLostAfter later: NodeUnreachable, not fenced → observe, and nothing is done.
    last: dict[str, Any] = {}

    def unreachable() -> dict[str, Any] | None:
        last["status"] = ((remediation_for(cp, ns, uid) or {}).get("status")) or {}
        ok = last["status"].get("cause") == "NodeUnreachable"
        return last["status"] if ok and last["status"].get("phase") == "Observing" else None

    try:
        status = wait_until(unreachable, timeout=short_node_lost + 90, what="NodeUnreachable")
    except TimeoutError as e:
        raise AssertionError(f"{e}: the Remediation's status is {last.get('status')}") from None
    diagnosed_after = time.monotonic() - silenced
    assert "NOT fenced" in str(status.get("evidence")), status.get("evidence")
    assert "force-delete" in [r["action"] for r in status.get("refused") or []], status
    assert not [a for a in status.get("actions") or [] if a["action"] != "observe"], status
    assert not [s for s in status.get("plan") or [] if s["action"] != "observe"], status

    # Events are posted off the action path (records.EventQueue): after the status, not with it
    def reasons() -> list[str]:
        events = core.list_namespaced_event(ns, field_selector=f"involvedObject.uid={uid}").items
        return [e.reason for e in events]

    try:
        wait_until(lambda: "StuckNodeUnreachable" in reasons(), timeout=30, what="the Event")
    except TimeoutError as e:
        raise AssertionError(f"{e}: {reasons()}") from None
    metrics = controller_metrics(unstick_release)
    assert sample(metrics, "unstick_stuck_pods", namespace=ns, cause="NodeUnreachable") == 1
    forced = {"action": "force-delete", "cause": "NodeUnreachable", "result": "succeeded"}
    forced_before = sample(metrics, "unstick_remediations_total", **forced)
    # The silent node runs on: the pod's container and unstick's own pods, none evicted.
    running = tasks(node)
    assert running.get(app) == "RUNNING", running
    for pod_uid, ids in unstick_pods.items():
        assert all(running.get(i) == "RUNNING" for i in ids), (pod_uid, running)
    assert {p["metadata"]["uid"] for p in unstick_release.pods()} == set(unstick_pods)
    assert not any(p["metadata"].get("deletionTimestamp") for p in unstick_release.pods())
    assert pod_exists(core, ns, "app", uid)
    assert unstick_writes(cp, ns, "app", mark) == [], "unstick wrote to an unfenced node's pod"
    fenced_mark = audit_mark(cp)

    # Fenced: force-deleted.
    taint_out_of_service(cp, name, on=True)
    fenced = time.monotonic()
    wait_until(
        lambda: not pod_exists(core, ns, "app", uid), timeout=30, what="the pod force-deleted"
    )
    deleted_after = time.monotonic() - fenced
    writes = unstick_writes(cp, ns, "app", fenced_mark)
    assert writes and all(w["verb"] == "delete" for w in writes), writes
    assert all(w["userAgent"].startswith("unstick-controller/") for w in writes), writes
    assert any(w["responseStatus"]["code"] == 200 for w in writes), writes

    def recorded() -> dict[str, Any] | None:
        """The record once the force-delete's result is on it: the intent ('deleting',
        written before the act) is replaced by the result after it."""
        st = ((remediation_for(cp, ns, uid) or {}).get("status")) or {}
        done = [
            a
            for a in st.get("actions") or []
            if a["action"] == "force-delete" and a.get("result") != "deleting"
        ]
        return st if done else None

    final = wait_until(recorded, timeout=30, what="the force-delete's result in the Remediation")
    (done,) = [a for a in final["actions"] if a["action"] == "force-delete"]
    assert done["result"] == "succeeded" and "gracePeriodSeconds=0" in done["message"], done
    assert final["cause"] == "NodeUnreachable", final
    metrics = controller_metrics(unstick_release)
    assert sample(metrics, "unstick_remediations_total", **forced) == forced_before + 1
    # The split brain fencing vouches against: the container still runs, the kubelet is down.
    assert tasks(node).get(app) == "RUNNING"

    # The kubelet back: the pod is gone from the API, so it kills its container.
    taint_out_of_service(cp, name, on=False)
    log_start = len(node.log_text("kubelet"))
    node.start_kubelet()
    node.wait_ready()
    wait_until(lambda: app not in tasks(node), timeout=60, what="the pod's container gone")
    unstick_release.wait_ready(node)
    log = node.log_text("kubelet")[log_start:]
    print(
        f"\nsilent node: NotReady after {not_ready_after:.1f} s (node-monitor-grace-period"
        f" {NODE_MONITOR_GRACE_S} s), NodeUnreachable observed after {diagnosed_after:.1f} s"
        f" (nodeLostAfter {short_node_lost} s), force-deleted {deleted_after:.1f} s after"
        f" the taint, test {time.monotonic() - started:.1f} s"
    )
    # Its own words: a pod it has no API object for, its container killed.
    lines = log.splitlines()
    assert any("Clean up containers for orphaned pod" in ln and uid in ln for ln in lines), log
    assert any("Killing container" in ln and app in ln for ln in lines), log
