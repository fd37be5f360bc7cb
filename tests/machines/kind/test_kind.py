"""unstick end to end in a real multi-node kind cluster (kind on podman, one control plane
and two workers, the node image built here; tests/kind/support.py): the chart installed
with helm as the README says, the agent on every node, and a worker lost for real — its
container removed and its Node deleted.

Root, podman and the tools only (skipped elsewhere with the reason). One cluster serves
the session. Run with `pytest -m kind tests/kind`; see docs/kind.md.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import Any

import pytest

from devcluster.process import wait_until

from . import csi
from .support import BIN, NAMESPACE, Kind, podman, run, sample

pytestmark = [pytest.mark.kind, pytest.mark.timeout(1200)]

VENV_BIN = BIN.parent / ".venv" / "bin"


def controller_pod(kind: Kind) -> dict[str, Any]:
    """The controller that acts: the leader Lease's holder (two replicas, one per worker)."""
    return kind.leader_pod()


def busybox_pod(kind: Kind, name: str, namespace: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "c",
                    "image": kind.images["busybox"]["ref"],
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }


def test_chart_runs_on_every_node(kind: Kind) -> None:
    nodes = sorted(n["metadata"]["name"] for n in kind.nodes())
    assert len(nodes) == 3

    ds = kind.get("daemonset", "unstick-agent", "-n", NAMESPACE)
    assert ds["status"]["desiredNumberScheduled"] == ds["status"]["numberReady"] == 3
    agents = kind.pods(NAMESPACE, "-l", "app.kubernetes.io/component=agent")
    assert sorted(p["spec"]["nodeName"] for p in agents) == nodes

    controller = controller_pod(kind)
    assert controller["spec"]["nodeName"] in nodes
    # Ready, waited for: its readiness probe (/healthz, 5 s timeout) can miss one answer on
    # a loaded machine, and a pod read at that moment is briefly not Ready (seen once).
    kind.kubectl("wait", "--for=condition=Ready", f"pod/{controller['metadata']['name']}",
                 "-n", NAMESPACE, "--timeout=120s")  # fmt: skip
    # two replicas (the chart's default), one per worker: a leader and a standby
    replicas = kind.pods(NAMESPACE, "-l", "app.kubernetes.io/component=controller")
    assert sorted(p["spec"]["nodeName"] for p in replicas) == sorted(kind.workers())

    # /metrics of every unstick pod, through the API server's proxy: the controller's pod
    # IP is on a worker's bridge, reached from the control plane by the pod network.
    assert "# TYPE unstick_stuck_pods gauge" in kind.scrape(controller["metadata"]["name"], 9100)
    for agent in agents:
        text = kind.scrape(agent["metadata"]["name"], 9101)
        assert "unstick_node_probe_duration_seconds" in text, agent["spec"]["nodeName"]

    # The kubectl plugin, as a user runs it.
    env_path = f"{BIN}:{VENV_BIN}:{os.environ.get('PATH', '')}"
    out = run(
        ["env", f"PATH={env_path}", f"KUBECONFIG={kind.kubeconfig}", "kubectl", "unstick", "status"]
    )
    assert out.startswith("unstick status"), out
    assert "STUCK PODS (0)" in out, out


def test_pod_network_dns_and_services(kind: Kind, namespaces: list[str]) -> None:
    """A pod on the worker without the controller reaches the controller's pod on the
    other worker by its IP, and by its Service's DNS name (CoreDNS, kube-proxy)."""
    controller = controller_pod(kind)
    node = next(w for w in kind.workers() if w != controller["spec"]["nodeName"])
    ns = "kind-net"
    namespaces.append(ns)
    kind.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    kind.apply(busybox_pod(kind, "client", ns, node))
    kind.kubectl("wait", "--for=condition=Ready", "pod/client", "-n", ns, "--timeout=120s")
    # busybox's own resolver (nslookup) and nc: Debian's static busybox crashes in
    # glibc's resolver (wget), which a static binary cannot load.
    service = f"unstick-controller-metrics.{NAMESPACE}.svc.cluster.local"
    answer = kind.kubectl("exec", "-n", ns, "client", "--", "nslookup", service)
    service_ip = answer.strip().splitlines()[-1].split()[-1]
    assert service_ip.startswith("10.96."), answer
    request = "printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' | nc -w 10 %s 9100"
    for ip in (controller["status"]["podIP"], service_ip):
        out = kind.kubectl("exec", "-n", ns, "client", "--", "sh", "-c", request % ip)
        assert "# TYPE unstick_stuck_pods gauge" in out, ip


def test_node_partitioned(kind: Kind, quick_policy: None, namespaces: list[str]) -> None:
    """A worker cut off (its container paused: the kubelet and the pods frozen, still
    there): NotReady, not fenced -> nothing done; the `node.kubernetes.io/out-of-service`
    taint (fenced) -> force-deleted; the worker back -> its kubelet cleans up the pods
    it still had. A StatefulSet's pod there with a ReadWriteOnce volume of the upstream
    CSI driver (tests/kind/csi.py), force-deleted by an admin while the worker is not
    fenced: its replacement on the other worker is refused the attach (Multi-Attach) while
    the volume stays attached to the cut-off worker -> BlockedReplacement naming that
    node and what frees it; fenced -> detached."""
    controller = controller_pod(kind)
    node = next(w for w in kind.workers() if w != controller["spec"]["nodeName"])
    other = controller["spec"]["nodeName"]
    ns, sts_ns = "kind-partition", "kind-sts"
    namespaces += [ns, sts_ns]
    # (without the upstream CSI driver's images the rest runs, then the test says so)
    no_csi = csi.unavailable(kind)
    db_uid, pv = ("", "") if no_csi else csi.start_db(kind, sts_ns, node, other)
    opt_in = {"unstick.dev/remediate": "true"}
    kind.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": opt_in}}
    )
    kind.apply(*(busybox_pod(kind, f"p{i}", ns, node) for i in (1, 2)))
    kind.kubectl("wait", "--for=condition=Ready", "pod", "--all", "-n", ns, "--timeout=120s")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kind.pods(ns)}

    def node_ready() -> bool:
        return kind.ready(kind.get("node", node))

    podman("pause", node)
    try:
        wait_until(lambda: not node_ready(), timeout=180, what=f"{node} NotReady")
        kind.kubectl("delete", "pods", "--all", "-n", ns, "--wait=false")
        if db_uid:
            kind.kubectl("delete", "pod", "db-0", "-n", sts_ns, "--wait=false")

        def observed() -> list[dict[str, Any]] | None:
            # (ContainersStillRunning first, from the pods' last status, until the node
            # has been NotReady for the policy's nodeLostAfterSeconds)
            rems = kind.remediations(ns)
            causes = [r.get("status", {}).get("cause") for r in rems]
            return rems if causes == ["NodeUnreachable"] * 2 else None

        records = wait_until(observed, timeout=120, what="the unreachable pods observed")
        for rem in records:
            assert rem["status"]["cause"] == "NodeUnreachable", rem["status"]
            assert [p["action"] for p in rem["status"]["plan"]] == ["observe"]
        # Not fenced: the pods may still run there; nothing is done to them. The
        # StatefulSet makes no replacement while its db-0 is there.
        assert sorted(p["metadata"]["name"] for p in kind.pods(ns)) == ["p1", "p2"]
        if db_uid:
            assert [p["metadata"]["uid"] for p in kind.pods(sts_ns)] == [db_uid]
            csi.statefulset_replacement_blocked(kind, sts_ns, db_uid, pv, node, other, controller)

        taint = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
        kind.kubectl("taint", "node", node, taint)
        wait_until(lambda: not kind.pods(ns), timeout=120, what="the fenced pods force-deleted")
        done = {
            r["spec"]["podName"]: r["status"]
            for r in kind.remediations(ns)
            if r["spec"].get("podName")
        }
        assert sorted(done) == ["p1", "p2"], done
        for name, status in done.items():
            actions = {(a["action"], a["result"]) for a in status.get("actions", [])}
            assert ("force-delete", "succeeded") in actions, (name, status)
            fenced = "fenced: taint node.kubernetes.io/out-of-service is present"
            assert any(fenced in e["message"] for e in status["evidence"]), status

        # Fenced, the attach/detach controller force-detaches the volume from the node.
        wait_until(  # (no VolumeAttachment at all without the driver)
            lambda: node not in [va["spec"]["nodeName"] for va in csi.attachments(kind, pv)],
            timeout=120,
            what=f"{pv} detached from the fenced {node}",
        )
        kind.kubectl("taint", "node", node, f"{taint}-")
    finally:
        podman("unpause", node, check=False)
    wait_until(node_ready, timeout=180, what=f"{node} Ready again")

    # Back, its kubelet finds the pods gone from the API and removes what it had of them.
    def cleaned() -> bool:
        left = podman("exec", node, "ls", "/var/lib/kubelet/pods").split()
        return not {*uids.values(), db_uid} & set(left)

    try:
        wait_until(cleaned, timeout=180, what=f"{node}'s kubelet to clean up the deleted pods")
    finally:
        kind.kubectl("delete", "namespace", sts_ns, "--wait=false", "--ignore-not-found")
        csi.uninstall(kind)
    if no_csi:
        pytest.skip(f"partition checked; its StatefulSet part not run: {no_csi}")


def test_mount_busy_on_a_worker(kind: Kind, quick_policy: None, namespaces: list[str]) -> None:
    """A process on a kind worker holds a file open in a pod's memory emptyDir; the pod is
    deleted. The worker's kubelet cannot unmount it, unstick diagnoses MountBusy naming
    the holder and does nothing; once the holder exits the kubelet finishes the pod."""
    node = kind.workers()[0]
    ns = "kind-busy"
    namespaces.append(ns)
    kind.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    pod = busybox_pod(kind, "busy", ns, node)
    pod["metadata"]["annotations"] = {"unstick.dev/remediate": "true"}
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", "echo x > /data/f; exec sleep 3600"]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {"medium": "Memory"}}]
    kind.apply(pod)
    kind.kubectl("wait", "--for=condition=Ready", "pod/busy", "-n", ns, "--timeout=120s")
    uid = kind.get("pod", "busy", "-n", ns)["metadata"]["uid"]
    data = f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/data"
    holder = "sleep 601"  # a command line of its own, to find and end it by
    podman("exec", "--detach", node, "sh", "-c", f"exec 3<{data}/f; exec {holder}")
    try:
        pid = int(
            wait_until(
                lambda: podman("exec", node, "pgrep", "-f", holder, check=False).strip(),
                timeout=30,
                what="the holder",
            )
        )
        kind.kubectl("delete", "pod", "busy", "-n", ns, "--wait=false")

        def diagnosed() -> dict[str, Any] | None:
            rems = kind.remediations(ns)
            rem = rems[0] if rems else {}
            return rem if rem.get("status", {}).get("cause") == "MountBusy" else None

        try:
            status = wait_until(diagnosed, timeout=240, what="cause MountBusy")["status"]
        except TimeoutError:
            pytest.fail(f"no MountBusy; the record: {json.dumps(kind.remediations(ns), indent=1)}")
        kubelet_log = podman("exec", node, "journalctl", "-u", "kubelet", "--no-pager")
        assert "target is busy" in kubelet_log
        probe = status["probe"]
        assert probe["podDirExists"] is True
        assert {(h["pid"], h["mountPoint"]) for h in probe["holders"]} == {(pid, data)}
        holders = [e["message"] for e in status["evidence"] if e["kind"] == "holder"]
        assert any(f"pid {pid} (sleep)" in m for m in holders), status["evidence"]
        assert [a["action"] for a in status.get("actions", [])] == ["observe"]
        assert {"unmount", "force-delete"} <= {r["action"] for r in status.get("refused", [])}
        assert [p["metadata"]["uid"] for p in kind.pods(ns)] == [uid]
    finally:
        podman("exec", node, "pkill", "-f", holder, check=False)
    # The kubelet's next retry (exponential back-off) unmounts the emptyDir; the pod goes.
    wait_until(lambda: not kind.pods(ns), timeout=180, what="the pod gone once the holder exited")


def test_orphaned_mount_on_a_worker(kind: Kind, quick_policy: None, namespaces: list[str]) -> None:
    """A mount nobody holds is left inside a pod's emptyDir on a kind worker (as a
    volume plugin that forgot it would leave it); the pod is deleted. The worker's
    kubelet cannot remove the volume; unstick diagnoses OrphanedMount, its agent on the
    worker unmounts it and removes the empty directories, and the kubelet finishes."""
    node = kind.workers()[-1]
    ns = "kind-orphan"
    namespaces.append(ns)
    kind.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    pod = busybox_pod(kind, "orphan", ns, node)
    pod["metadata"]["annotations"] = {"unstick.dev/remediate": "true"}
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    kind.apply(pod)
    kind.kubectl("wait", "--for=condition=Ready", "pod/orphan", "-n", ns, "--timeout=120s")
    uid = kind.get("pod", "orphan", "-n", ns)["metadata"]["uid"]
    leftover = f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/data/left"
    podman("exec", node, "sh", "-c", f"mkdir {leftover} && mount -t tmpfs unstick-seed {leftover}")
    try:
        kind.kubectl("delete", "pod", "orphan", "-n", ns, "--wait=false")
        try:
            wait_until(lambda: not kind.pods(ns), timeout=300, what="the pod gone")
        except TimeoutError:
            pytest.fail(
                f"the pod stayed; its record: {json.dumps(kind.remediations(ns), indent=1)}"
            )
    finally:
        podman("exec", node, "umount", leftover, check=False)
    (rem,) = kind.remediations(ns)
    status = rem["status"]
    # OrphanedMount first (the Event); the record's cause is the last diagnosis: once
    # unmounted, the volume directories left (StaleVolumeDirs), removed in turn; then
    # nothing of the pod is left (KubeletNotProgressing) while the kubelet is given its
    # --kubelet-finish-seconds to finish the pod itself (it usually does at once).
    causes = ("OrphanedMount", "StaleVolumeDirs", "KubeletNotProgressing")
    assert status["cause"] in causes, json.dumps(status)
    assert "StuckOrphanedMount" in {e["reason"] for e in kind.events(ns)}
    unmounted = [
        a["target"]
        for a in status.get("actions", [])
        if (a["action"], a.get("result")) == ("unmount", "succeeded")
    ]
    assert leftover in unmounted, json.dumps(status)
    assert podman("exec", node, "grep", "-c", uid, "/proc/1/mountinfo", check=False).strip() == "0"


def test_node_deleted(kind: Kind, quick_policy: None, namespaces: list[str]) -> None:
    """The worker of the **leading** controller killed (`podman kill`), its container
    removed and its Node deleted: the standby on the other worker takes the leader Lease
    and force-deletes the dead worker's opted-in pods in one node incident, before the pod
    GC would (40 s after the Node went); the pods of a namespace that did not opt in only
    observed. The failover time is printed (a report, not an assertion)."""
    leader = controller_pod(kind)
    node = leader["spec"]["nodeName"]
    standby = next(
        p
        for p in kind.pods(NAMESPACE, "-l", "app.kubernetes.io/component=controller")
        if p["spec"]["nodeName"] != node
    )
    opted, observed = "kind-gone", "kind-gone-observed"
    namespaces += [opted, observed]
    opt_in = {"unstick.dev/remediate": "true"}
    kind.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": opted, "labels": opt_in}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": observed}},
    )
    kind.apply(*(busybox_pod(kind, f"p{i}", ns, node) for ns in (opted, observed) for i in (1, 2)))
    for ns in (opted, observed):
        kind.kubectl("wait", "--for=condition=Ready", "pod", "--all", "-n", ns, "--timeout=120s")
    before = sample(
        kind.scrape(standby["metadata"]["name"], 9100),
        "unstick_remediations_total",
        action="force-delete", cause="NodeGone", result="succeeded",
    )  # fmt: skip
    assert sample(kind.scrape(standby["metadata"]["name"], 9100), "unstick_controller_leader") == 0

    # The machine is gone (with the leading controller), then its pods are deleted (nothing
    # can finalise them) and the Node object is removed, as a cloud's node controller or an
    # admin does.
    podman("kill", node)
    killed = time.time()
    kind.remove_node_container(node)
    for ns in (opted, observed):
        kind.kubectl("delete", "pods", "--all", "-n", ns, "--wait=false")
    kind.kubectl("delete", "node", node)

    def resolved() -> dict[str, Any] | None:
        rems = kind.remediations(opted)
        done = [r for r in rems if r.get("status", {}).get("phase") == "Resolved"]
        return done[0] if done and not kind.pods(opted) else None

    incident = wait_until(resolved, timeout=120, what=f"the NodeGone incident of {node} resolved")
    controller = controller_pod(kind)
    assert controller["metadata"]["name"] == standby["metadata"]["name"]  # it took over
    lease = kind.get("lease", "unstick-controller", "-n", NAMESPACE)["spec"]
    taken = datetime.fromisoformat(lease["acquireTime"].replace("Z", "+00:00")).timestamp()
    acted = min(
        datetime.fromisoformat(p["time"].replace("Z", "+00:00")).timestamp()
        for p in incident["status"]["pods"]
    )
    print(
        f"FAILOVER kind: Lease taken {taken - killed:.1f} s, first force-delete on record "
        f"{acted - killed:.1f} s after podman kill of {node}"
    )
    assert [r["metadata"]["name"] for r in kind.remediations(opted)] == [
        incident["metadata"]["name"]
    ]
    assert incident["spec"]["incident"] == "NodeGone"
    assert incident["spec"]["nodeName"] == node
    status = incident["status"]
    assert status["cause"] == "NodeGone"
    assert [p["action"] for p in status["plan"]] == ["force-delete"]
    assert status["podCount"] == status["podsGone"] == 2
    assert sorted(p["name"] for p in status["pods"]) == ["p1", "p2"]
    for pod in status["pods"]:
        assert (pod["action"], pod["result"]) == ("force-delete", "succeeded"), pod
        assert "gracePeriodSeconds=0" in pod["message"]
        assert pod["time"] <= pod["goneAt"]  # the decision on record before the pod went

    reasons = {
        e["reason"]: e for e in kind.events(opted) if e["involvedObject"]["kind"] == "Remediation"
    }
    assert reasons["StuckNodeGone"]["type"] == "Warning"
    assert "force-deleted 2" in reasons["IncidentResolved"]["message"]

    # Not opted in: observed, each with its own record; nothing done by unstick (the pod
    # GC of kube-controller-manager removes them later).
    def observed_records() -> list[dict[str, Any]] | None:
        rems = [r for r in kind.remediations(observed) if "status" in r]
        return rems if len(rems) == 2 else None

    records = wait_until(observed_records, timeout=60, what="the observed pods' records")
    for rem in records:
        assert rem["status"]["cause"] == "NodeGone"
        assert [p["action"] for p in rem["status"]["plan"]] == ["observe"]
        assert rem["status"]["optedIn"] is False
        done = rem["status"].get("actions") or []
        assert all(a.get("action") == "observe" for a in done), done
    observed_events = {e["reason"] for e in kind.events(observed)}
    assert "StuckNodeGone" in observed_events

    after = sample(
        kind.scrape(controller["metadata"]["name"], 9100),
        "unstick_remediations_total",
        action="force-delete", cause="NodeGone", result="succeeded",
    )  # fmt: skip
    assert after - before == 2
