"""The agent's probe of a real pod lists what the real kubelet and containerd made, and
nothing of other pods; an unmount forged for that pod is refused by the executor's re-check.

Which pod to probe. The agent probes only a pod that is Terminating and past its
deletionTimestamp (docs/agent.md, rule 2), and by then the kubelet has killed its
containers (SIGKILL at the end of the grace period: a container cannot outlive it, however
it traps SIGTERM) and unmounts its volumes — the projected token tmpfs first, so a pod
that is merely MountBusy on its emptyDir has no token mount left to see. A finalizer keeps
the pod object but not its mounts. So the honest way to probe a pod with all its volumes
still mounted is a real MountBusy on every volume: a process on the node, started while the
pod runs (before the delete), holds a file open in the memory-backed emptyDir *and* one in
the projected service-account token volume. The kubelet's unmount of both fails (`target is
busy`), the pod stays Terminating with both tmpfs mounts, and the agent, asked by the
controller, probes it. Its containers are whatever the runtime still lists then (the exited
container until the kubelet removes it): the probe reports them from the CRI socket when
present, and must say the runtime answered. A bystander pod runs beside it. The pod opted
in (so a forged unmount meets every rule and reaches the executor); MountBusy plans nothing
but `observe`.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.node import RealNode, children
from devcluster.node_cluster import ClusterControllers
from devcluster.node_images import NodeImages
from devcluster.process import wait_until

from .support import (
    REMEDIATE,
    Release,
    agent_metrics,
    busybox_pod,
    counter,
    delete_pods_and_wait,
    pod_mounts,
    remediation_for,
    wait_gone,
    wait_running,
)

pytestmark = pytest.mark.node


@dataclass
class HeldPod:
    namespace: str
    uid: str
    pod: Any  # the pod as it ran (V1Pod)
    bystander_uid: str
    data: Path  # the emptyDir's mount point
    token: Path  # the projected token volume's mount point
    holder_pid: int  # on the node
    remediation: dict[str, Any]  # the controller's, with the agent's probe


def _token_volume(pod: Any) -> str:
    (name,) = [v.name for v in pod.spec.volumes if v.name.startswith("kube-api-access-")]
    return str(name)


def _probed(cp: ControlPlane, ns: str, uid: str, data: Path, token: Path) -> Any:
    """The pod's Remediation once its probe shows both held mounts."""
    rem = remediation_for(cp, ns, uid)
    probe = ((rem or {}).get("status") or {}).get("probe") or {}
    text = probe.get("mountinfo") or ""
    return rem if f" {data} " in text and f" {token} " in text else None


@pytest.fixture(scope="module")
def held_pod(
    node_cluster: ClusterControllers,
    real_node: RealNode,
    unstick_release: Release,
    node_images: NodeImages,
) -> Iterator[HeldPod]:
    from kubernetes import client

    cp = node_cluster.control_plane
    api_client = cp.api_client()
    core = client.CoreV1Api(api_client)
    ns, image, node = f"p-{uuid.uuid4().hex[:8]}", node_images.busybox.ref, real_node.settings.name
    core.create_namespace({"metadata": {"name": ns}})
    node_cluster.wait_namespace(ns)
    holder: subprocess.Popen[bytes] | None = None
    uid = ""
    try:
        bystander = core.create_namespaced_pod(ns, busybox_pod("bystander", image, node))
        manifest = busybox_pod(
            "held", image, node, command="echo x > /data/f; sleep 3600", annotations=REMEDIATE
        )
        uid = core.create_namespaced_pod(ns, manifest).metadata.uid
        pod = wait_running(core, ns, "held")
        wait_running(core, ns, "bystander")
        volumes = real_node.kubelet_root / "pods" / uid / "volumes"
        data = volumes / "kubernetes.io~empty-dir" / "data"
        token = volumes / "kubernetes.io~projected" / _token_volume(pod)
        holder = real_node.run(
            ["sh", "-c", f"exec 3<{data}/f; exec 4<{token}/token; exec sleep 600"]
        )
        host_pid = wait_until(
            lambda: next(iter(children(holder.pid)), 0), timeout=10, what="the holder"
        )
        # Both files open before the pod is deleted.
        wait_until(
            lambda: len(list(Path(f"/proc/{host_pid}/fd").iterdir())) >= 5,
            timeout=10,
            what="the holder's files open",
        )
        core.delete_namespaced_pod("held", ns)
        rem = wait_until(
            lambda: _probed(cp, ns, uid, data, token),
            timeout=90,
            what="the agent's probe of the held pod, with both mounts",
        )
        yield HeldPod(ns, uid, pod, bystander.metadata.uid, data, token,
                      real_node.node_pid(host_pid), rem)  # fmt: skip
    finally:
        if holder is not None:
            real_node.kill(holder)
        try:
            if uid:
                # The kubelet's next retry (exponential back-off) unmounts both volumes.
                wait_gone(core, ns, "held", uid, timeout=150)
            delete_pods_and_wait(core, ns)
        finally:
            core.delete_namespace(ns)
            api_client.close()


def test_the_probe_lists_what_the_real_kubelet_and_containerd_made(
    real_node: RealNode, unstick_release: Release, held_pod: HeldPod
) -> None:
    probe = held_pod.remediation["status"]["probe"]
    root, uid = real_node.kubelet_root, held_pod.uid
    # Bound to this pod and node, and proof that the agent could see (invariant 8).
    assert probe["podUID"] == uid
    assert probe["nodeName"] == real_node.settings.name
    assert probe["kubeletRoot"] == str(root)
    assert probe["kubeletHealthy"] is True
    assert probe["podDirExists"] is True
    # The kubelet root holds this pod's dir, the bystander's, the controller's, the agent's.
    assert probe["podDirsSeen"] >= 4, probe
    assert "cri" in probe["runtime"].split("+"), probe
    assert probe["holderScan"] == "complete", probe

    # The mounts: exactly the node's own mount table lines for this pod (the agent reads
    # them from inside its container, through hostPID), the emptyDir and the token tmpfs.
    lines = [line for line in probe["mountinfo"].splitlines() if line]
    assert sorted(lines) == sorted(pod_mounts(real_node, uid)), probe["mountinfo"]
    points = {line.split()[4]: line for line in lines}
    assert set(points) == {str(held_pod.data), str(held_pod.token)}, points
    assert all(" - tmpfs " in line for line in lines), lines
    holders = {(h["pid"], h["mountPoint"]) for h in probe["holders"]}
    assert holders == {(held_pod.holder_pid, str(held_pod.data)),
                       (held_pod.holder_pid, str(held_pod.token))}, probe["holders"]  # fmt: skip
    dirs = {d["path"]: d for d in probe["volumeDirs"]}
    assert str(held_pod.data) in dirs and dirs[str(held_pod.data)]["empty"] is False, dirs
    assert all(p.startswith(f"{root}/pods/{uid}/") for p in dirs), dirs

    # Its containers, when the runtime still lists them: this pod's, with the id the kubelet
    # reported to the API server.
    main_id = held_pod.pod.status.container_statuses[0].container_id.partition("://")[2]
    for c in probe.get("containers") or []:
        assert c["podUID"] == uid, probe["containers"]
        if c["name"] == "main":
            assert c["id"] == main_id, probe["containers"]

    # Nothing of another pod.
    text = json.dumps(probe)
    others = [held_pod.bystander_uid] + [p["metadata"]["uid"] for p in unstick_release.pods()]
    for other in others:
        assert other not in text, f"probe mentions pod {other}: {text}"
    assert probe["mountinfo"].count(f"{root}/pods/") == len(lines)


def test_a_forged_unmount_of_the_held_pod_is_refused_by_the_executor(
    real_node: RealNode,
    unstick_release: Release,
    node_control_plane: ControlPlane,
    held_pod: HeldPod,
) -> None:
    """An admin's Remediation (exempt from the admission policy) asks to unmount the held
    pod's volumes now, not in dry-run. Every rule before node steps passes — the pod is
    really Terminating, overdue, on this node, opted in, and the policy permits `unmount` —
    so it is the executor's re-check right before the unmount (DESIGN §3 invariants 2, 9)
    that refuses: the real holder, a process of the node in another mount namespace, found
    through hostPID. Nothing is unmounted; the kubelet is the same process."""
    cp, ns, uid, node = node_control_plane, held_pod.namespace, held_pod.uid, real_node.settings
    assert real_node.kubelet is not None
    kubelet_pid = real_node.kubelet.host_pid
    mounts_before = pod_mounts(real_node, uid)
    before = counter(agent_metrics(unstick_release), "unstick_refusals_total", reason="unsafe")
    name = f"forged-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "Remediation",
        "metadata": {"name": name,
                     "labels": {"unstick.dev/node": node.name, "unstick.dev/pod-uid": uid}},
        "spec": {"podName": "held", "podUID": uid, "nodeName": node.name,
                 "nodeSteps": [{"action": "unmount"}],
                 "nodeStepsRequestedAt": datetime.now(UTC).isoformat(timespec="seconds"),
                 "dryRun": False},
    }  # fmt: skip
    path = f"/apis/unstick.dev/v1alpha1/namespaces/{ns}/remediations"
    cp.request("POST", path, body)  # left for the namespace's deletion to remove

    def answered() -> list[dict[str, Any]] | None:
        status = cp.request("GET", f"{path}/{name}").get("status") or {}
        actions: list[dict[str, Any]] | None = status.get("nodeActions")
        return actions

    actions = wait_until(answered, timeout=60, what="the agent's answer")
    (action,) = actions
    assert action["action"] == "unmount" and action["result"] == "refused", actions
    assert f"is held: pid {held_pod.holder_pid} (sleep)" in action["message"], actions
    after = counter(agent_metrics(unstick_release), "unstick_refusals_total", reason="unsafe")
    assert after >= before + 1
    assert real_node.kubelet is not None and real_node.kubelet.host_pid == kubelet_pid
    assert pod_mounts(real_node, uid) == mounts_before


def _kubelet_metrics(cp: ControlPlane, node: RealNode) -> str:
    """The real kubelet's /metrics, read as the API server reads it: the admin's client
    certificate, the kubelet's serving certificate verified against the cluster CA."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(cp.certs.ca_cert))
    ctx.load_cert_chain(str(cp.certs.admin_cert), str(cp.certs.admin_key))
    url = f"https://{node.settings.network.gateway}:{node.settings.kubelet_port}/metrics"
    with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
        body: bytes = resp.read()
    return body.decode()


def test_the_probe_says_what_the_real_kubelet_reports_of_its_pod_workers(
    real_node: RealNode,
    node_control_plane: ControlPlane,
    held_pod: HeldPod,
    tmp_path: Path,
) -> None:
    """The agent read its node's kubelet /metrics over HTTPS with its ServiceAccount token:
    the kubelet's webhook authentication took the token, its webhook authorization the
    chart's nodes/metrics rule. The kubelet's own counts are in the probe: the held pod's
    worker is past sync (its containers are dead, its volumes busy), the bystander and
    unstick's pods sync. The same /metrics, read by the harness, parses to the same
    families (its text is kept in tmp_path: tests/core/data/ holds one such capture)."""
    from unstick.core.model.kubelet_pods import parse_kubelet_pods

    pods = held_pod.remediation["status"]["probe"]["kubeletPods"]
    assert pods["unread"] == "", pods
    working = pods["working"]
    assert working["terminating"] + working["terminated"] >= 1, pods
    assert working["sync"] >= 3, pods  # the bystander, the controller, the agent
    assert pods["desired"] >= 4 and pods["active"] >= 3, pods
    assert pods["orphanedRuntimeTotal"] is not None and pods["restartedTotal"] is not None

    text = _kubelet_metrics(node_control_plane, real_node)
    (tmp_path / "kubelet-metrics.txt").write_text(text)
    seen = parse_kubelet_pods(text)
    assert seen.unread == "" and seen.working is not None, seen
    assert seen.working.sync >= 3, seen
