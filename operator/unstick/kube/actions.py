"""The two API actions of design.md §3, each guarded on the server side as well.

- `force-delete`: DELETE with gracePeriodSeconds=0 and `preconditions.uid`, so a new pod
  that reused the name is never hit.
- `remove-finalizer`: a JSON patch whose first op `test`s the whole finalizer list as it
  was read, so a list changed by someone else in between makes the API server refuse it
  (422) instead of removing the wrong entry.

The caller has re-read the pod and re-decided right before calling (see reconciler); a
refusal by the server (404, 409, 422) is reported as `Outcome.conflict` so the caller
re-reads and re-decides instead of counting a failure.

Each act is sent ONCE, without the client's retries: when its answer is lost (a read
timeout, a reset, a 5xx — the API server may have carried it out), a retry would be
answered 404, 409 or 422 (the pod already gone, the finalizer list already changed) and
taken for "nothing done". Such an act's outcome is `unknown`: the caller keeps its intent
and its budget slot, and `settle` looks at the pod (a GET by UID) to tell what happened —
never retracts it. A request that could not even connect was not sent: `failed`.
`carry_out` is both in one: the act sent once, a lost answer settled by looking.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

import urllib3
from kubernetes.client.exceptions import ApiException

from unstick.kube.client import JSON, Kube, pod_path

Result = Literal["succeeded", "failed", "refused", "conflict", "rejected", "unknown", "gone"]
#: An act sent whose answer was lost: it may have been carried out (settled by `settle`).
UNKNOWN: Literal["unknown"] = "unknown"
#: An act settled by looking: the pod was gone (the act most likely removed it).
GONE: Literal["gone"] = "gone"


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
    if exc.status is not None and exc.status >= 500:  # it may have been carried out
        return Outcome(UNKNOWN, f"sent once, answered {exc.status} ({exc.reason})")
    return Outcome("failed", f"API error {exc.status}: {exc.reason}")


def _lost(exc: Exception) -> Outcome:
    """A transport error: not sent when it could not connect, else its answer was lost."""
    if isinstance(
        exc, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError
    ):
        return Outcome("failed", f"not sent: cannot connect to the API server ({exc})")
    return Outcome(UNKNOWN, f"sent once, its answer lost ({type(exc).__name__}: {exc})")


_TRANSPORT = (urllib3.exceptions.HTTPError, OSError)  # ProtocolError, ReadTimeoutError, resets


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
        kube.request("DELETE", pod_path(namespace, name), body=body, retry=False)
    except ApiException as exc:
        return _refused(exc)
    except _TRANSPORT as exc:
        return _lost(exc)
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
            retry=False,
        )
    except ApiException as exc:
        return _refused(exc, patch=True)
    except _TRANSPORT as exc:
        return _lost(exc)
    return Outcome("succeeded", f"removed finalizer {finalizer} from {namespace}/{name}")


def carry_out(
    kube: Kube,
    namespace: str,
    name: str,
    uid: str,
    *,
    action: str,
    target: str,
    version: str,
    finalizers: tuple[str, ...] = (),
) -> Outcome:
    """The act, sent once — `force-delete` of the pod with the UID `uid` and the
    resourceVersion `version` as preconditions, or `remove-finalizer` of `target` from
    `finalizers` (the list as read) — and, when its answer is lost, settled by looking at
    the pod (`settle`). Still `unknown` when not even the look told: the caller keeps the
    act's intent on record and its budget slot (it may have been carried out), and a later
    pass or the pod watch settles it; never retracted."""
    if action == "force-delete":
        sent = force_delete(kube, namespace, name, uid, version)
    elif action == "remove-finalizer":
        sent = remove_finalizer(kube, namespace, name, finalizers, target)
    else:
        raise ValueError(f"action: {action!r} is neither force-delete nor remove-finalizer")
    if sent.result != UNKNOWN:
        return sent
    return settle(
        kube, namespace, name, uid, action=action, target=target, version=version, sent=sent
    )


def settle(
    kube: Kube,
    namespace: str,
    name: str,
    uid: str,
    *,
    action: str,
    target: str,
    version: str,
    sent: Outcome,
) -> Outcome:
    """What became of an act whose outcome is unknown (`sent`, sent to the pod's
    resourceVersion `version`), by looking at the pod: gone (404 or another UID) → `gone`;
    a force-delete that took effect (the pod, held by its finalizers, changed to
    deletionGracePeriodSeconds 0) or a finalizer no longer on the pod → `succeeded`; the
    pod there without it → `failed` (not carried out, decided again by a later pass).
    `unknown` still when the pod cannot be read."""
    try:
        pod = kube.get(pod_path(namespace, name))
    except (ApiException, *_TRANSPORT) as exc:
        return Outcome(UNKNOWN, f"{sent.message}; the pod could not be read to settle it ({exc})")
    return settled(pod, uid, action=action, target=target, version=version, sent=sent)


def settled(
    pod: JSON | None, uid: str, *, action: str, target: str, version: str, sent: Outcome
) -> Outcome:
    """`settle`'s verdict on the pod as read (None: not found)."""
    meta = (pod or {}).get("metadata") or {}
    if pod is None or meta.get("uid") != uid:
        return Outcome(
            GONE,
            f"{sent.message}; the pod was gone when unstick looked: the act most likely removed it",
        )
    if action == "force-delete":
        changed = not version or str(meta.get("resourceVersion") or "") != version
        done = changed and meta.get("deletionGracePeriodSeconds") == 0
        seen = "its deletionGracePeriodSeconds is 0" if done else "it is there, not deleted"
    else:
        done = target not in (meta.get("finalizers") or ())
        seen = f"{target} is no longer on it" if done else f"{target} is still on it"
    if done:
        return Outcome("succeeded", f"{sent.message}; settled by looking at the pod: {seen}")
    return Outcome(
        "failed", f"{sent.message}; settled by looking at the pod: {seen} (not carried out)"
    )
