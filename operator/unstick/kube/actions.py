"""The two API actions of design.md §3, each guarded on the server side as well.

- `force-delete`: DELETE with gracePeriodSeconds=0 and `preconditions.uid`, so a new pod
  that reused the name is never hit.
- `remove-finalizer`: a JSON patch whose first op `test`s the whole finalizer list as it
  was read, so a list changed by someone else in between makes the API server refuse it
  (422) instead of removing the wrong entry.

The caller has re-read the pod and re-decided right before calling (see reconciler); a
refusal by the server (404, 409, 422) is reported as `Outcome.conflict` so the caller
re-reads and re-decides instead of counting a failure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from kubernetes.client.exceptions import ApiException

from unstick.kube.client import Kube, pod_path

Result = Literal["succeeded", "failed", "refused", "conflict", "rejected"]


@dataclass(frozen=True, slots=True)
class Outcome:
    result: Result
    message: str


# How the API server words a failed JSON-patch `test` op (the finalizer list changed).
_TEST_FAILED = re.compile(r"testing value|test failed|test operation", re.IGNORECASE)


def server_message(exc: ApiException) -> str:
    """The API server's own words (Status.message), else the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or "")


def _refused(exc: ApiException, *, patch: bool = False) -> Outcome:
    if patch and exc.status == 422 and not _TEST_FAILED.search(server_message(exc)):
        # Not our `test` op failing (the list changed) but the server refusing the object
        # itself (validation, admission: e.g. "Pod QoS is immutable" on an old pod spec,
        # design.md §9 "rejected fix"): not retried until the pod changes.
        return Outcome("rejected", f"API server rejected the patch (422): {server_message(exc)}")
    if exc.status in (404, 409, 422):
        return Outcome(
            "conflict", f"API server refused ({exc.status}): the pod changed; re-reading"
        )
    return Outcome("failed", f"API error {exc.status}: {exc.reason}")


def force_delete(
    kube: Kube, namespace: str, name: str, uid: str, resource_version: str = ""
) -> Outcome:
    """DELETE with gracePeriodSeconds=0 and a UID precondition; with `resource_version`
    also that one: the API server refuses (409) if the pod changed since it was read."""
    preconditions = {"uid": uid}
    if resource_version:
        preconditions["resourceVersion"] = resource_version
    body = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "preconditions": preconditions,
    }
    try:
        kube.request("DELETE", pod_path(namespace, name), body=body)
    except ApiException as exc:
        return _refused(exc)
    return Outcome("succeeded", f"deleted {namespace}/{name} (uid {uid}) with gracePeriodSeconds=0")


def remove_finalizer(
    kube: Kube, namespace: str, name: str, current: tuple[str, ...], finalizer: str
) -> Outcome:
    if finalizer not in current:
        return Outcome("conflict", f"finalizer {finalizer} is no longer on the pod")
    index = current.index(finalizer)
    patch = [
        {"op": "test", "path": "/metadata/finalizers", "value": list(current)},
        {"op": "remove", "path": f"/metadata/finalizers/{index}"},
    ]
    try:
        kube.request(
            "PATCH",
            pod_path(namespace, name),
            body=patch,
            content_type="application/json-patch+json",
        )
    except ApiException as exc:
        return _refused(exc, patch=True)
    return Outcome("succeeded", f"removed finalizer {finalizer} from {namespace}/{name}")
