"""Writes of the controller: Remediation objects (spec + status) and Events on pods.

One Remediation per stuck pod (docs/contracts.md), except the pods a node incident holds
(controller/incidents.py: one Remediation for the pods of one node). Status is written
with a JSON merge patch on the status subresource touching only the controller's keys;
the agent writes `probe`, `nodeActions` and `nodeStepsDoneAt` the same way. Events on the
pod are creates of Event objects — the pod itself is never written.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.kube.client import JSON, Kube, remediation_path

log = logging.getLogger(__name__)

API_VERSION = "unstick.dev/v1alpha1"
NODE_LABEL = "unstick.dev/node"
UID_LABEL = "unstick.dev/pod-uid"
COMPONENT = "unstick-controller"


POD_LABEL_PREFIX = "pod.unstick.dev/"


def pod_label(pod_name: str) -> str:
    """`pod.unstick.dev/<pod name>` on the pod's Remediation (or its node incident's):
    `kubectl get remediations -A -l pod.unstick.dev/<pod>` finds a pod's story by its name.
    A name longer than a label name (63) is cut and ends in 8 hex digits of its hash."""
    if len(pod_name) <= 63:
        return POD_LABEL_PREFIX + pod_name
    digest = hashlib.sha256(pod_name.encode()).hexdigest()[:8]
    return f"{POD_LABEL_PREFIX}{pod_name[:54].rstrip('.-_')}-{digest}"


def remediation_name(pod_name: str, uid: str) -> str:
    """`<pod name, cut to 53>-<uid[:8]>`; a cut that ends in `.` or `-` would not be a valid
    object name (it must end alphanumeric), so those are trimmed too."""
    return f"{pod_name[:53].rstrip('.-')}-{uid[:8]}"


def alternate_name(pod_name: str, uid: str) -> str:
    """Where the pod's Remediation goes when its usual name is taken by a record that is not
    the pod's (forged, or left from elsewhere): `<pod name, cut to 200>-<full uid>`."""
    return f"{pod_name[:200].rstrip('.-')}-{uid}"


def remediation_names(pod_name: str, uid: str) -> tuple[str, str]:
    """The names the pod's Remediation may have, in the order they are tried."""
    return remediation_name(pod_name, uid), alternate_name(pod_name, uid)


def get_remediation(kube: Kube, namespace: str, name: str) -> JSON | None:
    return kube.get(remediation_path(namespace, name))


def create_remediation(
    kube: Kube,
    namespace: str,
    pod_name: str,
    uid: str,
    *,
    node: str,
    dry_run: bool,
    name: str | None = None,
) -> JSON:
    """Create the pod's Remediation (or return the object already at that name, which the
    caller must check is the pod's: it may not be)."""
    name = name or remediation_name(pod_name, uid)
    body = {
        "apiVersion": API_VERSION,
        "kind": "Remediation",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {NODE_LABEL: node or "none", UID_LABEL: uid, pod_label(pod_name): ""},
        },
        "spec": {"podName": pod_name, "podUID": uid, "nodeName": node, "dryRun": dry_run},
    }
    try:
        return kube.request("POST", remediation_path(namespace), body=body)
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = get_remediation(kube, namespace, name)
    if existing is None:  # created and deleted in between: try once more
        return kube.request("POST", remediation_path(namespace), body=body)
    return existing


def patch_spec(kube: Kube, rem: JSON, spec: dict[str, Any]) -> JSON:
    meta = rem["metadata"]
    return kube.request(
        "PATCH",
        remediation_path(meta["namespace"], meta["name"]),
        body={"spec": spec},
        content_type="application/merge-patch+json",
    )


def patch_status(kube: Kube, rem: JSON, status: dict[str, Any]) -> JSON:
    meta = rem["metadata"]
    return kube.request(
        "PATCH",
        remediation_path(meta["namespace"], meta["name"]) + "/status",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


def pod_ref(pod: JSON) -> JSON:
    """The involvedObject of an Event about `pod`."""
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": meta.get("namespace") or "default",
        "name": meta.get("name"),
        "uid": meta.get("uid"),
    }


def post_event(
    kube: Kube,
    pod: JSON,
    reason: str,
    message: str,
    *,
    event_type: str = "Warning",
    now_rfc3339: str = "",
    involved: JSON | None = None,
) -> None:
    """A core/v1 Event about the pod, or about `involved` (an object reference) when given
    (best effort: a failure is logged, not raised)."""
    ref = involved or pod_ref(pod)
    namespace = ref.get("namespace") or "default"
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.get('name') or 'object'}.{uuid.uuid4().hex[:12]}"},
        "involvedObject": ref,
        "reason": reason,
        "message": message[:1000],
        "type": event_type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now_rfc3339 or None,
        "lastTimestamp": now_rfc3339 or None,
        "count": 1,
    }
    try:
        kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
    except Exception as exc:  # an Event is informative only
        log.warning("could not post Event %s on %s/%s: %s", reason, namespace, ref.get("name"), exc)


class EventQueue:
    """Events posted off the action path, in a few threads of their own.

    `post` returns at once; each call still posts exactly one Event. `close` waits for the
    ones queued (bounded by the client's timeout and retries)."""

    def __init__(self, kube: Kube, threads: int = 2) -> None:
        self.kube = kube
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="events")

    def post(
        self,
        pod: JSON,
        reason: str,
        message: str,
        now_rfc3339: str,
        *,
        involved: JSON | None = None,
        event_type: str = "Warning",
    ) -> None:
        try:
            self._pool.submit(
                post_event,
                self.kube,
                pod,
                reason,
                message,
                now_rfc3339=now_rfc3339,
                involved=involved,
                event_type=event_type,
            )
        except RuntimeError:  # shut down: the controller is stopping
            log.warning("not posting Event %s: the controller is stopping", reason)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
