"""The record of a node incident: in memory, the pods it lists, what was done to each, and
the status it is written as; on the API, its Remediation created (with the Event that
opens it), its pod labels added, and the Event when all its pods are gone.
controller/incidents/registry.py keeps the incidents and batches their writes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from unstick.controller.deciding.decision import Decision, status_summary
from unstick.controller.records import writer as records
from unstick.controller.records.events import EventQueue
from unstick.core.remediation import (
    API_VERSION,
    DRY_RUN,
    INCIDENT,
    INCIDENT_LABEL,
    NODE_LABEL,
    NODE_NAME,
    POD_LABEL_PREFIX,
    Phase,
    rfc3339,
)
from unstick.core.vocabulary import Action, Cause
from unstick.kube.actions import GONE
from unstick.kube.client import JSON, Kube
from unstick.kube.podwatch import TerminatingPod

INCIDENT_CAUSES = frozenset({Cause.NodeGone, Cause.NodeUnreachable})
GATHER_S = 0.05  # an intent waits this long for others to be written with it
FLUSH_S = 1.0  # an incident's record is written at most this often
MAX_PODS = 500  # per record (the status schema's bound); more pods open another record
JOIN_WINDOW_S = 120.0  # pods of the same node join an incident this long after its last one
MAX_MESSAGE = 512
MAX_BACKOFF_S = 60.0
GIVE_UP_AFTER = 6  # failed writes in a row after which a record whose pods are gone is let go
# GONE: an intent settled by looking, the pod was gone when unstick looked — its DELETE's
# answer was lost (kube/actions.py settle) or never recorded (a stopped controller,
# adoption.py).


def takes_incident_path(dec: Decision) -> bool:
    """The pod would be force-deleted because of its node, and nothing else is planned."""
    d = dec.diagnosis
    return (
        d.cause in INCIDENT_CAUSES
        and dec.opted_in
        and not dec.policy.dry_run
        and [s.action for s in dec.steps] == [Action.FORCE_DELETE]
    )


@dataclass
class IncidentPod:
    name: str
    uid: str
    stuck_since: float
    action: str = ""
    result: str = ""
    message: str = ""
    at: float | None = None
    gone_at: float | None = None

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "uid": self.uid}
        if self.action:
            out.update(action=self.action, result=self.result, message=self.message)
        if self.at is not None:
            out["time"] = rfc3339(self.at)
        if self.gone_at is not None:
            out["goneAt"] = rfc3339(self.gone_at)
        return out


@dataclass
class Incident:
    namespace: str
    node: str
    cause: str
    policy: str
    name: str
    summary: dict[str, Any]  # cause, evidence, plan, policy of the first pod's decision
    opened: float
    last_join: float
    pods: dict[str, IncidentPod] = field(default_factory=dict)
    ref: JSON | None = None  # the record once created (for its Events)
    labelled: set[str] = field(default_factory=set)
    waiting: dict[str, str] = field(default_factory=dict)  # uid → what its action waits for
    dirty: bool = True
    written_at: float = 0.0
    announced_resolved: int = -1  # pod count when "all gone" was last announced
    failures: int = 0  # writes failed in a row (each waits longer before the next)
    seq: int = 0  # changes made so far (each bumps it)
    written_seq: int = 0  # changes on record (the last successful write)
    failed_seq: int = 0  # changes whose write failed
    urgent: bool = False  # an intent waits for this record to be written
    urgent_at: float = 0.0  # since when

    def snapshot(self) -> Incident:
        """A copy whose pods and waits later changes do not touch (taken under the lock)."""
        return replace(
            self,
            pods={uid: replace(p) for uid, p in self.pods.items()},
            waiting=dict(self.waiting),
        )

    @property
    def all_gone(self) -> bool:
        return bool(self.pods) and all(p.gone_at is not None for p in self.pods.values())

    def status(self) -> dict[str, Any]:
        pods = list(self.pods.values())
        gone = [p.gone_at for p in pods if p.gone_at is not None]
        resolved = self.all_gone
        return {
            **self.summary,
            "stuckSince": rfc3339(min(p.stuck_since for p in pods)),
            "phase": Phase.Resolved if resolved else Phase.Remediating,
            "resolvedAt": rfc3339(max(gone)) if resolved and gone else None,
            "waitingFor": None if resolved else next(iter(self.waiting.values()), None),
            "podCount": len(pods),
            "podsGone": len(gone),
            "pods": [p.entry() for p in pods],
        }


def summary(record: TerminatingPod, dec: Decision) -> dict[str, Any]:
    """cause, evidence, plan, policy of the first pod's decision, for the whole record."""
    summary = status_summary(record, dec)
    summary.pop("stuckSince", None)
    summary["plan"] = [  # the same step for each pod, whose target is the pod
        {**step, "target": "each pod in status.pods"} for step in summary["plan"]
    ]
    return summary


def create_record(
    kube: Kube, events: EventQueue, inc: Incident, labels: dict[str, str], now: float
) -> None:
    """Create the incident's Remediation (named `inc.name`; a name taken by a record that
    is not this one's: another name, and RuntimeError to write it again) and post its
    Event."""
    body = {
        "apiVersion": API_VERSION,
        "kind": "Remediation",
        "metadata": {
            "name": inc.name,
            "namespace": inc.namespace,
            "labels": {
                NODE_LABEL: inc.node or "none",
                INCIDENT_LABEL: inc.cause.lower(),
                **labels,
            },
        },
        "spec": {NODE_NAME: inc.node, INCIDENT: inc.cause, DRY_RUN: False},
    }
    try:
        created = records.post_remediation(kube, inc.namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        created = records.get_remediation(kube, inc.namespace, inc.name) or {}
        if (created.get("spec") or {}) != body["spec"]:  # not ours: another name
            inc.name = f"{inc.name}-{uuid.uuid4().hex[:4]}"
            raise RuntimeError("the record's name was taken; trying another") from exc
    meta = created.get("metadata") or {}
    inc.ref = {
        "apiVersion": API_VERSION,
        "kind": "Remediation",
        "namespace": inc.namespace,
        "name": inc.name,
        "uid": meta.get("uid"),
    }
    evidence = "; ".join(e["message"] for e in inc.summary.get("evidence", [])[:2])
    events.post(
        {},
        f"Stuck{inc.cause}",
        f"pods of node {inc.node} stuck in Terminating: {inc.cause}. {evidence}. "
        f"Plan: force-delete — remediating. This record lists each pod and what was "
        "done to it; find one with -l " + POD_LABEL_PREFIX + "<pod name>.",
        rfc3339(now),
        involved=inc.ref,
    )


def announce_resolved(
    events: EventQueue, inc: Incident, status: dict[str, Any], now: float
) -> None:
    """The IncidentResolved Event, once per pod count, when the record says Resolved."""
    if status["phase"] != Phase.Resolved or inc.announced_resolved == status["podCount"]:
        return
    inc.announced_resolved = status["podCount"]
    results = [p.get("result") for p in status["pods"] if p.get("action") == "force-delete"]
    done, unanswered = results.count("succeeded"), results.count(GONE)
    also = (
        f" ({unanswered} more went after a force-delete whose answer was lost or not "
        "recorded by a stopped controller)"
        if unanswered
        else ""
    )
    events.post(
        {},
        "IncidentResolved",
        f"all {status['podCount']} pods of node {inc.node} ({inc.cause}) are gone; "
        f"unstick force-deleted {done} of them{also}.",
        rfc3339(now),
        involved=inc.ref,
        event_type="Normal",
    )


def patch_labels(kube: Kube, inc: Incident, labels: dict[str, str]) -> None:
    """Add the `pod.unstick.dev/<pod>` labels of pods that joined the incident."""
    records.patch_labels(kube, inc.namespace, inc.name, labels)
