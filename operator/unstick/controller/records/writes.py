"""Writes of the controller: Remediation objects (spec + status) and Events on pods.

One Remediation per stuck pod (docs/contracts.md), except the pods a node incident holds
(controller/incidents/registry.py: one Remediation for the pods of one node). Status is written
with a JSON merge patch on the status subresource touching only the controller's keys;
the agent writes `probe`, `nodeActions` and `nodeStepsDoneAt` the same way. Events on the
pod are creates of Event objects — the pod itself is never written.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.core.remediation import (
    API_VERSION,
    NODE_LABEL,
    POD_LABEL_PREFIX,
    UID_LABEL,
    alternate_name,
    new_remediation,
    pod_label,
    remediation_name,
)
from unstick.kube.client import JSON, Kube, remediation_path
from unstick.kube.events import post_event

# Re-exported: the record writers (controller/incidents/registry.py) take these names from here.
__all__ = [
    "API_VERSION",
    "NODE_LABEL",
    "POD_LABEL_PREFIX",
    "UID_LABEL",
    "EventQueue",
    "alternate_name",
    "create_remediation",
    "get_remediation",
    "patch_spec",
    "patch_status",
    "pod_label",
    "pod_ref",
    "remediation_name",
    "remediation_names",
]

log = logging.getLogger(__name__)


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
    spec: dict[str, Any] | None = None,
) -> JSON:
    """Create the pod's Remediation (or return the object already at that name, which the
    caller must check is the pod's: it may not be). `spec`: more spec keys in the same
    request (a probe request: one write less than a PATCH right after)."""
    name = name or remediation_name(pod_name, uid)
    body = new_remediation(namespace, name, pod_name, uid, node=node, dry_run=dry_run)
    body["spec"] = {**(spec or {}), **body["spec"]}
    try:
        return kube.request("POST", remediation_path(namespace), body=body)
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = get_remediation(kube, namespace, name)
    if existing is None:  # created and deleted in between: try once more
        return kube.request("POST", remediation_path(namespace), body=body)
    return existing


def _body(key: str, value: dict[str, Any], resource_version: str) -> JSON:
    """A merge patch; with a resourceVersion the API server applies it only onto that
    version of the object (409 Conflict otherwise: optimistic concurrency)."""
    body: JSON = {key: value}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    return body


def patch_spec(kube: Kube, rem: JSON, spec: dict[str, Any], *, resource_version: str = "") -> JSON:
    meta = rem["metadata"]
    return kube.request(
        "PATCH",
        remediation_path(meta["namespace"], meta["name"]),
        body=_body("spec", spec, resource_version),
        content_type="application/merge-patch+json",
    )


def patch_status(
    kube: Kube, rem: JSON, status: dict[str, Any], *, resource_version: str = ""
) -> JSON:
    meta = rem["metadata"]
    return kube.request(
        "PATCH",
        remediation_path(meta["namespace"], meta["name"]) + "/status",
        body=_body("status", status, resource_version),
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


class EventQueue:
    """Events posted off the action path, in a few threads of their own.

    `post` returns at once; each call posts one Event, or counts a repeat of the same Event
    on the one already posted (`kube/events.py`). `close` waits for the
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
                involved or pod_ref(pod),
                reason,
                message,
                event_type=event_type,
                stamp=now_rfc3339,
            )
        except RuntimeError:  # shut down: the controller is stopping
            log.warning("not posting Event %s: the controller is stopping", reason)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
