"""The one writer of the controller's Remediations (docs/controller.md, "Records").

Every write of a Remediation by the controller goes through this module, and every read
but one (the start-up's LIST, acting/budget_rebuild.py); its two collaborators are below
it and call nothing back: `copies.py` (the newest copy of each pod's record) and the API
client.

- The requests (module functions): a GET, the POST of a record (a pod's, or a node
  incident's as it is), merge patches of spec, of status and of the labels. Status is
  written with a JSON merge patch on the status subresource touching only the
  controller's keys; the agent writes `probe`, `nodeActions` and `nodeStepsDoneAt` the
  same way. Used as they are for the records no pass keeps a copy of: a node
  incident's (controller/incidents/registry.py: one Remediation for the pods of one
  node), the waiters on a holder's record (controller/aftermath/watcher.py), the
  start-up's marks (pod_record.resolve_left_behind, incidents/adoption.py) and the check
  of stray records (stray_records.py).
- `RecordWriter`: a pod's own record, as the passes keep it. The reconciler and its
  collaborators (agent_channel/node_steps.py, acting/pod_actions.py, pod_record.py) read,
  create and write it only here: its status keys (a merge patch of only the keys that
  changed), its `status.actions` (each counted once in `unstick_remediations_total`) and
  the requests to the agent in its spec. It remembers which Remediation this process
  keeps for each pod (`known`), so resolving a pod needs no read, and keeps the newest
  copy of each record (`copies`: the Remediation watch offers them too), so a pass needs no GET
  either.

A write made from a copy carries the copy's resourceVersion (`guarded`): when the record
changed meanwhile the API server answers 409 and nothing is written; the copy is dropped
and `Stale` raised, so the pass decides again from a fresh read. A 404 (the record was
deleted) drops the copy and raises `Stale` too. The server's answer becomes the copy.

The record stays lean (design.md §11; docs/controller.md "A lean record"): a status write
sends only the keys whose value changed, where an absent list is an empty one and an
evidence message that differs only in an age ("... 5s ago" → "... 35s ago") is the same
message — a write whose only news is that time passed is not made. A write the caller
marks `defer` (progress the next write of the record carries anyway: waiting for the
agent's answer or for the kubelet's own finish) is not sent: its keys are kept here
(`unsent`), seen by this process's passes as if written (`read`), and sent with the next
write of the record that is not deferred (the Resolved one, an intent, a verdict). Never
deferred: an intent (record before act), a request to the agent, a final phase."""

from __future__ import annotations

import re
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller import metrics
from unstick.controller.deciding.decision import Pass
from unstick.controller.records.conditions import conditions as derive_conditions
from unstick.controller.records.copies import RemediationCopies, version
from unstick.core.remediation import (
    Phase,
    alternate_name,
    new_remediation,
    remediation_name,
    rfc3339,
)
from unstick.kube.client import JSON, Kube, remediation_path


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


def post_remediation(kube: Kube, namespace: str, body: JSON) -> JSON:
    """POST a Remediation as it is (a node incident's record: controller/incidents/record.py)."""
    return kube.request("POST", remediation_path(namespace), body=body)


def patch_labels(kube: Kube, namespace: str, name: str, labels: dict[str, str]) -> JSON:
    """Add `labels` to the record (a merge patch of its metadata.labels)."""
    return kube.request(
        "PATCH",
        remediation_path(namespace, name),
        body={"metadata": {"labels": labels}},
        content_type="application/merge-patch+json",
    )


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
    kube: Kube,
    rem: JSON,
    status: dict[str, Any],
    *,
    resource_version: str = "",
    seen: JSON | None = None,
) -> JSON:
    """Every status write of the controller. `status.conditions` (records/conditions.py) go
    with it when the record's would change — never a write of their own — derived from the
    status after this write: exact when the write is guarded (`rem` is that version), and
    otherwise only when the write sets the phase itself (an unguarded write onto a copy
    that may be old must not restate an old phase in the conditions). `seen`: the record as
    last seen, when `rem` is a stub without its conditions and generation (a pod's record
    resolved from its name alone): their transition times and generation come from it."""
    meta = rem["metadata"]
    current = rem.get("status") or {}
    if resource_version or "phase" in status:
        context = seen if seen is not None else rem
        after = {k: v for k, v in {**current, **status}.items() if v is not None}
        after["conditions"] = (context.get("status") or {}).get("conditions")
        generation = (context.get("metadata") or {}).get("generation")
        wanted = derive_conditions(after, generation, time.time())
        if wanted is not None and wanted != current.get("conditions"):
            status = {**status, "conditions": wanted}
    return kube.request(
        "PATCH",
        remediation_path(meta["namespace"], meta["name"]) + "/status",
        body=_body("status", status, resource_version),
        content_type="application/merge-patch+json",
    )


MAX_RECORDED_ACTIONS = 100  # status.actions keeps the newest entries

#: An age in an evidence message (core/durations.human: "4s", "13m32s", "2h1m40s"), ago
#: or to come: masked when two versions of the evidence are compared (`same_value`).
_AGE = re.compile(r"\b(?:\d+h)?(?:\d+m)?\d+s ago\b|\bin (?:\d+h)?(?:\d+m)?\d+s\b")


def _aged(value: Any) -> Any:
    """`value` with every age in its strings masked."""
    if isinstance(value, str):
        return _AGE.sub("<age>", value)
    if isinstance(value, list):
        return [_aged(v) for v in value]
    if isinstance(value, dict):
        return {k: _aged(v) for k, v in value.items()}
    return value


def action_entry(
    action: str, target: str, result: str, *, message: str, when: str, by: str
) -> dict[str, Any]:
    """An entry of status.actions. The agent's success is said by its own entry in
    status.nodeActions: copied here without its message (a failure or refusal keeps its
    words — the agent's next answer replaces status.nodeActions)."""
    entry = {"action": action, "target": target, "result": result}
    if not (by == "agent" and result == "succeeded"):
        entry["message"] = message
    return {**entry, "time": when, "by": by}


def same_value(key: str, current: Any, desired: Any) -> bool:
    """Whether writing `desired` over `current` in status key `key` would tell nothing
    new: equal, both empty (absent or []), or evidence that differs only in ages."""
    if current == desired or (current in (None, []) and desired == []):
        return True
    return key == "evidence" and _aged(current) == _aged(desired)


class Stale(ApiException):
    """A write from a copy of the record met a newer version (409) or no record (404):
    nothing was written; decide again from a fresh read. An ApiException with the
    server's status, so code that handles a 404 still does."""

    def __init__(self, rem: JSON, status: int) -> None:
        meta = rem.get("metadata") or {}
        super().__init__(status=status, reason="the record changed or went since its copy")
        self.record = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class RecordWriter:
    """A pod's own record: read from its copy, created, written by the passes, forgotten
    when the pod is gone."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        # Remediations this process read or wrote, by pod uid: (namespace, name, phase).
        # Lets `resolve` write without reading it again.
        self.known: dict[str, tuple[str, str, str]] = {}
        self.copies = RemediationCopies()  # the newest version of each record seen here
        # (namespace, name) → status keys of deferred writes, sent with the next write
        self.unsent: dict[tuple[str, str], dict[str, Any]] = {}

    # -- reading and creating -----------------------------------------------------------

    def read(self, namespace: str, name: str) -> JSON | None:
        """The record from its copy (copies.py: the watch's or our own write's answer),
        else a GET. A copy may be older than the server's version: every write from it is
        guarded by its resourceVersion, so deciding from it is safe."""
        rem = self.copies.get(namespace, name)
        if rem is None:
            rem = get_remediation(self.kube, namespace, name)
            if rem is not None:
                self.copies.offer(rem)
        unsent = self.unsent.get((namespace, name))
        if rem is not None and unsent:  # as this process will write it
            rem["status"] = {**(rem.get("status") or {}), **unsent}
        return rem

    def get(self, namespace: str, name: str) -> JSON | None:
        """The record as the API server has it now (a GET; the copy is left as it is)."""
        return get_remediation(self.kube, namespace, name)

    def create(
        self,
        namespace: str,
        pod_name: str,
        uid: str,
        *,
        node: str,
        dry_run: bool,
        name: str,
        spec: dict[str, Any],
    ) -> JSON:
        """`create_remediation`, its answer kept as the record's copy."""
        rem = create_remediation(
            self.kube, namespace, pod_name, uid, node=node, dry_run=dry_run, name=name, spec=spec
        )
        self.copies.offer(rem)
        return rem

    # -- the watch and the pod's going ----------------------------------------------------

    def offer(self, rem: JSON) -> None:
        """A version of a record from the Remediation watch (records/watch.py; kept if newer)."""
        self.copies.offer(rem)

    def drop(self, namespace: str, name: str) -> None:
        """The record was deleted: its copy (and anything not sent of it) goes."""
        self.copies.drop(namespace, name)
        self.unsent.pop((namespace, name), None)

    def forget(self, uid: str) -> None:
        """The pod is gone: which record is its, and that record's copy, are not needed."""
        known = self.known.pop(uid, None)
        if known is not None:
            self.copies.drop(known[0], known[1])
            self.unsent.pop((known[0], known[1]), None)

    # -- writing ----------------------------------------------------------------------------

    def patch_status(self, rem: JSON, status: dict[str, Any]) -> None:
        """A status merge patch of `status` as it is, onto whatever version the record has,
        its answer not kept (the agent's late answer on a pod gone: no pass reads it)."""
        patch_status(self.kube, rem, status)

    def count_once(
        self,
        p: Pass,
        action: Any,
        target: str,
        result: str,
        message: str,
        *,
        by: str = "controller",
        force: bool = False,
        cause: str | None = None,
    ) -> None:
        """Append to status.actions and count the metric, once per (action, target, result)."""
        entry = {"action": str(action), "target": target, "result": result}
        if not force and any(all(a.get(k) == v for k, v in entry.items()) for a in p.done):
            return
        p.done.append(
            action_entry(str(action), target, result, message=message, when=rfc3339(p.now), by=by)
        )
        del p.done[:-MAX_RECORDED_ACTIONS]
        cause = cause or str(p.dec.diagnosis.cause)
        metrics.REMEDIATIONS.labels(str(action), cause, result).inc()

    def write(
        self, p: Pass, phase: Phase, *, guarded: bool = True, defer: bool = False, **extra: Any
    ) -> None:
        """The pass's status: its summary, `phase`, status.actions and `extra` keys.
        `guarded=False` only for the answer of an act already carried out (acting/pod_actions.py:
        it records what happened, it decides nothing). `defer`: progress only, carried by
        the record's next write (the module's doc); never for an intent or a final phase."""
        # a copy: p.done changes after this write (an intent replaced by its answer)
        desired = {**p.summary, "phase": phase, "actions": list(p.done), **extra}
        self.patch(p.rem, desired, guarded=guarded, defer=defer)
        meta = p.rem.get("metadata") or {}
        self.known[p.record.uid] = (p.record.namespace, meta.get("name") or "", phase)

    def patch(
        self,
        rem: JSON,
        desired: dict[str, Any],
        *,
        guarded: bool = True,
        defer: bool = False,
        nulls: bool = False,
    ) -> None:
        """Status merge patch of only the keys whose value differs (`same_value`), with the
        keys of deferred writes not sent yet; with `guarded` (and a version known) only
        onto the version `rem` is a copy of. `defer`: kept, not sent (the module's doc).
        `nulls`: a key set to None is sent (removed) even where `rem` does not show it
        (a stub, or a status blanked to write every key)."""
        current = rem.get("status") or {}
        changed = {
            k: v
            for k, v in desired.items()
            if not same_value(k, current.get(k), v) or (nulls and v is None)
        }
        meta = rem.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if defer:
            if changed:
                self.unsent.setdefault(key, {}).update(changed)
                rem["status"] = {**current, **changed}
            return
        changed = {**self.unsent.get(key, {}), **changed}
        if not changed:
            return
        seen = (  # a stub or a blanked status: the conditions as the copy has them
            self.copies.get(str(meta.get("namespace")), str(meta.get("name")))
            if "conditions" not in current
            else None
        )
        answer = self._send(
            rem,
            lambda v: patch_status(self.kube, rem, changed, resource_version=v, seen=seen),
            guarded=guarded,
        )
        self.unsent.pop(key, None)  # sent (a failed write raised above: kept for the next)
        rem["status"] = {k: v for k, v in {**current, **changed}.items() if v is not None}
        self._took(rem, answer)

    def patch_spec(self, rem: JSON, spec: dict[str, Any]) -> None:
        """Spec merge patch (a request to the agent), guarded like `patch`."""
        answer = self._send(
            rem,
            lambda v: patch_spec(self.kube, rem, spec, resource_version=v),
            guarded=True,
        )
        rem["spec"] = {**(rem.get("spec") or {}), **spec}
        self._took(rem, answer)

    def _send(self, rem: JSON, send: Any, *, guarded: bool) -> Any:
        try:
            return send(version(rem) if guarded else "")
        except ApiException as exc:
            if exc.status in (404, 409):
                meta = rem.get("metadata") or {}
                self.copies.drop(str(meta.get("namespace")), str(meta.get("name")))
                if guarded and version(rem):
                    raise Stale(rem, exc.status) from exc
            raise

    def _took(self, rem: JSON, answer: Any) -> None:
        """The server's answer is the record's newest version: the pass goes on from it
        (all of it: after an unguarded write it may hold others' changes too, and its
        version must never stand for a view that lacks them)."""
        if isinstance(answer, dict) and version(answer):
            rem.clear()
            rem.update(answer)
            self.copies.offer(answer)
