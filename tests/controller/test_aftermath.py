"""design.md §9 on the controller, against a real kube-apiserver + etcd, the controller as a
subprocess: a replacement pod's Multi-Attach linked to the stuck pod (Event, waiters,
metric, the VolumeAttachment untouched), a namespace deletion blocked by a stuck pod, and a
finalizer patch the API server rejects (422) recorded once, not retried."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.audit_log import WRITES, requests
from tests.support.controller import (
    Controller,
    Objects,
    policy_spec,
    refuse_pod_requests,
)
from tests.support.pods import claim_body

pytestmark = pytest.mark.envtest

POLICIES = {
    "default": policy_spec(),
    "t-aftermath-fin": policy_spec(finalizerAllowlist=["example.com/keep"]),
}
VAP = "unstick-reject-finalizer-removal"


CONTROLLER_ARGS = ("--recheck-seconds", "5")  # the rejected fix is looked at again soon


def _volume(objects: Objects, namespace: str) -> tuple[str, str]:
    pv = f"pv-{uuid.uuid4().hex[:8]}"
    objects.core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "ebs.csi.example.com", "volumeHandle": f"vol-{pv}"},
                "claimRef": {"namespace": namespace, "name": "data"},
            },
        }
    )
    objects.core.create_namespaced_persistent_volume_claim(namespace, claim_body("data", pv))
    return pv, "data"


def _events(objects: Objects, namespace: str, reason: str) -> list[Any]:
    return list(
        objects.core.list_namespaced_event(namespace, field_selector=f"reason={reason}").items
    )


def _controller_writes(cp: ControlPlane, resource: str) -> list[dict[str, Any]]:
    return requests(cp, by="unstick-controller", verbs=WRITES, resource=resource)


class Held(NamedTuple):
    """A claim's CSI volume attached to a node with no kubelet, where its pod db-0 (the
    holder) is stuck Terminating, and another node for its replacement."""

    storage: Any  # a StorageV1Api
    old_node: str
    new_node: str
    pv: str
    claim: str
    attachment: str
    holder: dict[str, Any]


@pytest.fixture
def stuck_holder(
    objects: Objects, namespace: str, make_node: Any
) -> Iterator[Callable[[str], Held]]:
    """`stuck_holder(attacher)`: a Held, the volume attached by `attacher`; at the end its
    VolumeAttachment (unless the test detached it) and its PersistentVolume are deleted."""
    storage = client.StorageV1Api(objects.api_client)
    made: list[Held] = []

    def make(attacher: str) -> Held:
        old_node, new_node = make_node(kubelet=False), make_node(kubelet=False)
        pv, claim = _volume(objects, namespace)
        va = _attachment(storage, pv, old_node, attacher)
        held = Held(storage, old_node, new_node, pv, claim, va, {})
        made.append(held)  # removed at the end from here on
        held.holder.update(objects.pod(namespace, old_node, name="db-0", claim=claim))
        objects.core.delete_namespaced_pod("db-0", namespace)  # stuck: no kubelet there
        return held

    yield make
    for held in made:
        try:
            storage.delete_volume_attachment(held.attachment)
        except ApiException as exc:
            if exc.status != 404:  # detached by the test
                raise
        objects.core.delete_persistent_volume(held.pv)


def test_multi_attach_of_a_replacement_is_linked_to_the_stuck_pod(
    controller: Controller, objects: Objects, namespace: str, stuck_holder: Any
) -> None:
    cp = controller.cp
    storage, old_node, new_node, pv, claim, va_name, holder = stuck_holder("ebs.csi.example.com")
    objects.remediation_when(
        namespace, holder, timeout=60, what="the holder diagnosed", cause="NodeUnreachable"
    )
    va_before = storage.read_volume_attachment(va_name).metadata.resource_version
    waiter = objects.pod(namespace, new_node, name="db-0-new", claim=claim)
    _failed_attach_event(
        objects, namespace, waiter, pv, source={"component": "attachdetach-controller"}
    )
    (event,) = wait_until(
        lambda: _events(objects, namespace, "BlockedReplacement"),
        timeout=60,
        what="the waiter's Event",
    )
    assert event.involved_object.name == "db-0-new"
    assert event.message == (
        f"volume pvc/data is held by {namespace}/db-0, stuck Terminating on {old_node} "
        f"(NodeUnreachable, not fenced): it is freed when {old_node} is fenced "
        "(node.kubernetes.io/out-of-service) or by the attach/detach controller's "
        "force-detach after 6 min"
    )
    waiters = wait_until(
        lambda: objects.status(namespace, holder).get("waiters"),
        timeout=30,
        what="waiters on record",
    )
    assert [(w["pod"], w["uid"], w["claim"]) for w in waiters] == [
        (f"{namespace}/db-0-new", waiter["uid"], "data")
    ]
    assert waiters[0]["reasons"] == ["Multi-Attach"] and waiters[0]["waitedSeconds"] >= 0
    assert controller.sample("unstick_blocked_replacements", namespace=namespace) == 1
    # Nothing touched the VolumeAttachment; nothing was detached or deleted.
    assert storage.read_volume_attachment(va_name).metadata.resource_version == va_before
    assert _controller_writes(cp, "volumeattachments") == []
    # The holder goes, the VolumeAttachment stays: still blocked, now by the attachment.
    objects.core.delete_namespaced_pod("db-0", namespace, grace_period_seconds=0)
    ended = wait_until(
        lambda: [w for w in objects.status(namespace, holder).get("waiters") or [] if "until" in w],
        timeout=60,
        what="the wait on the holder ended on record",
    )
    assert ended[0]["uid"] == waiter["uid"]
    wait_until(
        lambda: any(
            "still attached" in e.message for e in _events(objects, namespace, "BlockedReplacement")
        ),
        timeout=60,
        what="the Event naming the attachment",
    )
    assert controller.sample("unstick_blocked_replacements", namespace=namespace) == 1
    # The attach/detach controller (played by the test) detaches: nobody waits any more.
    storage.delete_volume_attachment(va_name)
    wait_until(
        lambda: controller.sample("unstick_blocked_replacements", namespace=namespace) == 0,
        timeout=60,
        what="the gauge back to 0",
    )
    assert _controller_writes(cp, "volumeattachments") == []


def test_a_namespace_deletion_blocked_by_a_stuck_pod_is_reported(
    controller: Controller, objects: Objects, make_node: Any
) -> None:
    name = f"t-ns-{uuid.uuid4().hex[:8]}"
    objects.core.create_namespace({"metadata": {"name": name}})
    node = make_node(kubelet=False)
    pod = objects.pod(name, node, name="web-0")
    objects.core.delete_node(node)
    objects.core.delete_namespaced_pod("web-0", name)
    try:
        objects.remediation_when(name, pod, timeout=60, what="stuck", cause="NodeGone")
        objects.core.delete_namespace(name)  # stays Terminating: no namespace controller here
        events = wait_until(
            lambda: [
                e
                for e in _events(objects, "default", "NamespaceBlockedByStuckPods")
                if e.involved_object.name == name
            ],
            timeout=60,
            what="the namespace's Event",
        )
        assert events[0].involved_object.kind == "Namespace"
        assert "1 stuck pod(s): web-0 (NodeGone)" in events[0].message
        assert controller.sample("unstick_blocked_namespaces") >= 1
    finally:
        objects.core.delete_namespaced_pod("web-0", name, grace_period_seconds=0)


def test_a_finalizer_patch_the_server_rejects_is_recorded_once(
    controller: Controller, objects: Objects, namespace: str
) -> None:
    admission = client.AdmissionregistrationV1Api(objects.api_client)
    _reject_finalizer_removal(admission, namespace)
    try:
        _await_policy_in_force(objects, namespace)
        pod = objects.pod(
            namespace, None, remediate="t-aftermath-fin", finalizers=["example.com/keep"]
        )
        objects.core.delete_namespaced_pod(pod["name"], namespace)
        status = objects.remediation_when(
            namespace, pod, timeout=60, what="Remediation Failed", phase="Failed"
        )["status"]
        (entry,) = [a for a in status["actions"] if a["action"] == "remove-finalizer"]
        assert entry["result"] == "failed"
        assert "Pod QoS is immutable" in entry["message"], entry
        patches = lambda: requests(  # noqa: E731
            controller.cp,
            by="unstick-controller",
            verbs={"patch"},
            resource="pods",
            name=pod["name"],
        )
        assert len(patches()) == 1
        # The controller looks at the pod again (a fresh GET on each slow re-check) and
        # does not patch again while the pod is unchanged.
        gets = lambda: requests(  # noqa: E731
            controller.cp, by="unstick-controller", verbs={"get"}, resource="pods", name=pod["name"]
        )
        seen = len(gets())
        wait_until(
            lambda: len(gets()) >= seen + 2, timeout=60, what="two more re-checks of the pod"
        )
        assert len(patches()) == 1
        # Only a change of the pod makes it try again (once).
        objects.core.patch_namespaced_pod(
            pod["name"], namespace, {"metadata": {"labels": {"touched": "1"}}}
        )
        wait_until(lambda: len(patches()) == 2, timeout=60, what="one retry after the pod changed")
        assert objects.read_pod(namespace, pod["name"]) is not None
    finally:
        admission.delete_validating_admission_policy_binding(VAP)
        admission.delete_validating_admission_policy(VAP)
        wait_until(
            lambda: _strip_finalizers(objects, namespace),
            timeout=30,
            what="the admission policy gone",
        )


def _strip_finalizers(objects: Objects, namespace: str) -> bool:
    """Remove the test pods' finalizers (True once the admission policy lets it happen)."""
    from kubernetes.client.exceptions import ApiException

    try:
        for pod in objects.core.list_namespaced_pod(namespace).items:
            if pod.metadata.finalizers:
                objects.core.patch_namespaced_pod(
                    pod.metadata.name, namespace, {"metadata": {"finalizers": None}}
                )
    except ApiException as exc:
        if exc.status != 422:
            raise
        return False
    return True


def _reject_finalizer_removal(admission: Any, namespace: str) -> None:
    refuse_pod_requests(
        admission,
        VAP,
        namespace,
        "UPDATE",
        {
            "expression": "!has(oldObject.metadata.finalizers) || "
            "(has(object.metadata.finalizers) && "
            "size(object.metadata.finalizers) == size(oldObject.metadata.finalizers))",
            "message": "Pod QoS is immutable",
            "reason": "Invalid",
        },
    )


def _await_policy_in_force(objects: Objects, namespace: str) -> None:
    """The admission policy takes a moment to load: wait until it rejects a patch."""
    from kubernetes.client.exceptions import ApiException

    probe = objects.pod(namespace, None, name="vap-probe", finalizers=["example.com/x"])

    def rejected() -> bool:
        try:
            objects.core.patch_namespaced_pod(
                probe["name"], namespace, [{"op": "remove", "path": "/metadata/finalizers/0"}]
            )
        except ApiException as exc:
            return exc.status == 422
        objects.core.patch_namespaced_pod(
            probe["name"], namespace, {"metadata": {"finalizers": ["example.com/x"]}}
        )
        return False

    wait_until(rejected, timeout=30, what="the admission policy in force")


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


READER = "unstick-status-reader"


def _read_only_kubeconfig(cp: ControlPlane, path: Path) -> Path:
    """A kubeconfig of a ServiceAccount that may only get/list (RBAC applied here)."""
    from tests.support.integrity import apply_objects, token_for

    rules = [
        {
            "apiGroups": [""],
            "resources": ["pods", "namespaces", "events"],
            "verbs": ["get", "list"],
        },
        {"apiGroups": ["unstick.dev"], "resources": ["remediations"], "verbs": ["get", "list"]},
    ]
    apply_objects(
        cp,
        [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": READER, "namespace": "default"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": READER}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": READER},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": READER},
             "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": "default"}]},
        ],
    )  # fmt: skip
    token = token_for(cp, "default", READER).token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "t",
                "cluster": {"server": cp.url, "certificate-authority": str(cp.certs.ca_cert)},
            }
        ],
        "users": [{"name": READER, "user": {"token": token}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": READER}}],
        "current-context": "t",
    }
    path.write_text(json.dumps(config))
    return path


def test_status_shows_stuck_blocked_and_orphaned_with_read_only_rbac(
    controller: Controller, objects: Objects, namespace: str, stuck_holder: Any, tmp_path: Path
) -> None:
    from unstick.agent.orphans.events import event_body
    from unstick.core.rules.aftermath import OrphanDir

    cp = controller.cp
    _storage, old_node, new_node, pv, claim, _va, holder = stuck_holder("x")
    wait_until(
        lambda: objects.status(namespace, holder).get("cause"),
        timeout=60,
        what="holder diagnosed",
    )
    waiter = objects.pod(namespace, new_node, name="db-0-new", claim=claim)
    _failed_attach_event(objects, namespace, waiter, pv)
    wait_until(lambda: objects.status(namespace, holder).get("waiters"), timeout=60, what="waiters")
    uid = str(uuid.uuid4())
    orphan = OrphanDir(uid, f"/var/lib/kubelet/pods/{uid}", 900.0, data=(("f", 7),), data_bytes=7)
    objects.core.create_namespaced_event(
        "default", event_body(old_node, [orphan], "observe", _now())
    )
    kubeconfig = _read_only_kubeconfig(cp, tmp_path / "reader.kubeconfig")
    out = _status(kubeconfig, "json")
    data = json.loads(out)
    assert data["notes"] == []
    (stuck,) = [s for s in data["stuckPods"] if s["pod"] == f"{namespace}/db-0"]
    assert stuck["cause"] == "NodeUnreachable" and stuck["node"] == old_node
    assert "observe only (not opted in)" in stuck["did"]
    (blocked,) = [w for w in data["blockedReplacements"] if w["heldBy"] == f"{namespace}/db-0"]
    assert blocked["pod"] == f"{namespace}/db-0-new" and blocked["claim"] == "data"
    (orphans,) = [o for o in data["orphanedPodDirs"] if o["node"] == old_node]
    assert orphans["count"] == 1 and orphans["dirs"][0]["files"] == [{"path": "f", "bytes": 7}]
    text = _status(kubeconfig, "text")
    assert f"{namespace}/db-0-new waits" in text and f"/var/lib/kubelet/pods/{uid}" in text
    # The bundle carries the aftermath and diagnose reads it offline.
    holder_report = _snapshot_diagnosis(cp, f"{namespace}/db-0", tmp_path)
    assert holder_report["aftermath"]["waiters"][0]["pod"] == f"{namespace}/db-0-new"
    assert holder_report["aftermath"]["orphanedPodDirs"][0]["path"] == orphan.path
    waiter_report = _snapshot_diagnosis(cp, f"{namespace}/db-0-new", tmp_path)
    assert waiter_report["aftermath"]["attachedElsewhere"] == [
        {"persistentVolume": pv, "node": old_node}
    ]


def _attachment(storage: Any, pv: str, node: str, attacher: str) -> str:
    """A VolumeAttachment of `pv` to `node` by `attacher`; its name."""
    name = f"csi-{uuid.uuid4().hex}"
    storage.create_volume_attachment(
        {"metadata": {"name": name},
         "spec": {"attacher": attacher, "nodeName": node, "source": {"persistentVolumeName": pv}}}
    )  # fmt: skip
    return name


def _failed_attach_event(
    objects: Objects, namespace: str, waiter: dict[str, Any], pv: str, **fields: Any
) -> None:
    """The attach/detach controller's Multi-Attach Event for `waiter` (with `fields` added)."""
    objects.core.create_namespaced_event(
        namespace,
        {
            "metadata": {"name": f"{waiter['name']}.{uuid.uuid4().hex[:8]}"},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": waiter["name"],
                               "uid": waiter["uid"]},
            "reason": "FailedAttachVolume",
            "message": f'Multi-Attach error for volume "{pv}" Volume is already exclusively '
            "attached to one node and can't be attached to another",
            "type": "Warning",
            "firstTimestamp": _now(),
            "lastTimestamp": _now(),
            "count": 1,
            **fields,
        },
    )  # fmt: skip


def _snapshot_diagnosis(cp: ControlPlane, pod: str, tmp_path: Path) -> dict[str, Any]:
    bundle = tmp_path / f"{pod.replace('/', '_')}.json"
    snap = _cli("snapshot", pod, "--kubeconfig", str(cp.kubeconfig))
    bundle.write_text(snap)
    return dict(json.loads(_cli("diagnose", "--snapshot", str(bundle), "--output", "json")))


def _cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "unstick", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _status(kubeconfig: Path, output: str) -> str:
    return _cli("status", "--kubeconfig", str(kubeconfig), "-o", output)
