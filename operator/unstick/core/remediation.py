"""The Remediation — the channel between the controller and the agents — in one place.

Its group, version, plural and kind, its labels and annotations, the names of its spec and
status fields, the one time format both sides write and read, and typed readers/writers of
the spec pieces that travel between the two processes (docs/design.md §5; the full shape
is in docs/contracts.md). No other module spells these strings.

The opt-in rule itself (which value of `unstick.dev/remediate` means what) is
`unstick.core.policy.mandate`'s; only the annotation's name is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from hashlib import sha256
from typing import Any

from unstick.core.vocabulary import NODE_ACTIONS, Action

# --- the resources ------------------------------------------------------------------------

GROUP = "unstick.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Remediation"
PLURAL = "remediations"
POLICY_KIND = "RemediationPolicy"
POLICY_PLURAL = "remediationpolicies"
SNAPSHOT_KIND = "Snapshot"  # the bundle of docs/design.md §6 (not a resource)

#: The API path of the group (`/apis/unstick.dev/v1alpha1`).
API_ROOT = f"/apis/{API_VERSION}"
#: Remediations of every namespace (list/watch).
ALL_REMEDIATIONS = f"{API_ROOT}/{PLURAL}"
#: RemediationPolicies (cluster-scoped).
POLICIES = f"{API_ROOT}/{POLICY_PLURAL}"

# --- labels and annotations ---------------------------------------------------------------

#: Label: the pod's node (the agent's label selector; "none" for a pod on no node).
NODE_LABEL = "unstick.dev/node"
#: Label: the pod's UID (`unstick snapshot` finds the pod's record by it).
UID_LABEL = "unstick.dev/pod-uid"
#: Label on a node incident's record: its cause, lower case (docs/incidents.md).
INCIDENT_LABEL = "unstick.dev/incident"
#: spec.incident of the record of unstick's out-of-service taint on a node (docs/fencing.md).
OUT_OF_SERVICE_INCIDENT = "NodeOutOfService"
#: Label name prefix: `pod.unstick.dev/<pod name>` finds a pod's story by its name.
POD_LABEL_PREFIX = "pod.unstick.dev/"
#: Pod annotation and namespace label by which pods opt in (docs/design.md §4; the rule:
#: `unstick.core.policy.mandate`).
REMEDIATE = "unstick.dev/remediate"
#: Annotation of the agent's OrphanedPodDirs Event about its Node: the report as JSON
#: (docs/aftermath.md).
ORPHANED_POD_DIRS_ANNOTATION = "unstick.dev/orphaned-pod-dirs"

# --- spec and status field names ------------------------------------------------------------

POD_NAME = "podName"
POD_UID = "podUID"
NODE_NAME = "nodeName"
INCIDENT = "incident"
DRY_RUN = "dryRun"
LAZY_UNMOUNT = "lazyUnmount"
PROBE_REQUESTED_AT = "probeRequestedAt"
NODE_STEPS = "nodeSteps"
NODE_STEPS_REQUESTED_AT = "nodeStepsRequestedAt"
#: The controller's mandate: what the agent may do for this pod in one round trip
#: (design.md §11; `NodeMandate`). Its request time is `nodeStepsRequestedAt`.
MANDATE = "mandate"
# status, written by the agent (the controller writes the rest of status)
PROBE = "probe"
#: The probe's own stamp: `probedAt`, and `podUID`/`nodeName` (the spec's names).
PROBED_AT = "probedAt"
NODE_ACTIONS_FIELD = "nodeActions"
NODE_STEPS_DONE_AT = "nodeStepsDoneAt"
#: The agent's own plan under a mandate, on record before it acts (`NodePlan`).
NODE_PLAN = "nodePlan"
#: The agent's refusals of a request as a whole (a probe, or a batch of node steps).
NODE_REFUSALS = "nodeRefusals"
#: In a `nodeRefusals` entry: the request was refused by a limit (the agent's node budget)
#: that has room again after this many seconds — nothing ran, it may be asked again.
RETRY_AFTER = "retryAfterSeconds"

# Results of an API action on record before it is sent (record before act, design.md §3
# invariant 10): `status.actions` of a per-pod record, `status.pods` of a node incident.
DELETING = "deleting"  # a force-delete: the DELETE may have been sent, its answer not yet
REMOVING = "removing"  # a finalizer removal, likewise
INTENTS = (DELETING, REMOVING)


# --- the lifecycle: `status.phase` ----------------------------------------------------------


class Phase(StrEnum):
    """`status.phase` of a Remediation: where its pod (or a node incident's pods) stands.

    The words are the CRD's enum (operator/unstick/crds/remediations.yaml) and what
    `kubectl get remediations` shows: never rename them. The controller writes every phase
    (the agent writes none); which may follow which is `TRANSITIONS`."""

    #: In the schema for a record with no verdict yet. Written by no controller: a new
    #: record has no phase at all until its first pass writes one.
    Diagnosing = "Diagnosing"
    #: Only observed: not opted in, only `observe` planned, or no fresh probe in time.
    Observing = "Observing"
    #: The policy is in dry run: the plan is on record, nothing was changed.
    DryRun = "DryRun"
    #: A probe of the pod's node was asked for; the diagnosis waits for it.
    WaitingForAgent = "WaitingForAgent"
    #: Acting: a step requested of the agent, carried out, or waiting (the action budget,
    #: the agent's answer, the kubelet's own finish). A node incident until its pods are gone.
    Remediating = "Remediating"
    #: The plan did not help (the same node steps again after they ran) or the API server
    #: rejected the act as it is: not tried again in a loop.
    Failed = "Failed"
    #: The pod is gone (a node incident: every pod it lists): kept as the audit trail.
    Resolved = "Resolved"
    #: Not a stuck pod's own record (forged, replayed, left from an earlier pod, a second
    #: record of a pod): marked so, with the reason in `status.refusals`, and not used.
    Refused = "Refused"


#: The phases a pass writes while its pod is stuck. Each pass decides again from the pod,
#: its node and the record as they are now (a policy turned to dry run, the probe
#: answered, the budget free again), so any of them may follow any other.
PASS_PHASES: frozenset[Phase] = frozenset(
    {Phase.WaitingForAgent, Phase.Observing, Phase.DryRun, Phase.Remediating, Phase.Failed}
)
#: The phases that close a record: its pod(s) gone, or not a stuck pod's record. A closed
#: record is not checked for a stuck pod behind it, not resolved again at start-up, and
#: `unstick status` counts it as done.
FINAL_PHASES: frozenset[Phase] = frozenset({Phase.Resolved, Phase.Refused})

#: Which phases the controller may write over which (None: a record with no phase yet, as
#: every record is right after its creation). A closed record is reopened only as written
#: here: a node incident whose pods were all gone takes a pod of the same node again
#: (`Remediating`, within its join window: docs/incidents.md); a record refused while its
#: pod was not stuck yet names that pod exactly (its identity is immutable), so it is the
#: pod's record once the pod is stuck, and its pass writes on it (its refusals stay on
#: record); and a record found at a pod's name that is not the pod's is `Refused`,
#: whatever it said.
TRANSITIONS: Mapping[Phase | None, frozenset[Phase]] = {
    None: PASS_PHASES | FINAL_PHASES,
    Phase.Diagnosing: PASS_PHASES | FINAL_PHASES,
    **{phase: PASS_PHASES | FINAL_PHASES for phase in PASS_PHASES},
    Phase.Resolved: frozenset({Phase.Remediating, Phase.Refused}),
    Phase.Refused: PASS_PHASES | {Phase.Resolved},
}


def may_follow(before: object, after: Phase) -> bool:
    """Whether the controller may write phase `after` over `before`, a record's
    `status.phase` as read (None, or a word that is no phase, counts as no phase yet). The
    same phase written again (a new refusal, a pod of an incident gone) is no transition."""
    current = next((phase for phase in Phase if phase == before), None)
    return after == current or after in TRANSITIONS[current]


class RemediationError(ValueError):
    """A Remediation field that cannot be used; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


# --- the one time format ------------------------------------------------------------------


def rfc3339(when: float | datetime) -> str:
    """Epoch seconds or an aware datetime → `2026-11-25T08:00:00.123456Z` (UTC, with
    microseconds): the format of every time unstick writes."""
    moment = when if isinstance(when, datetime) else datetime.fromtimestamp(when, UTC)
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no timezone")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_datetime(value: str) -> datetime:
    """An RFC 3339 time (`Z` or an offset, fractions optional) → an aware datetime. A time
    without a timezone is taken as UTC (what the API server means). ValueError if bad."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_time(value: str) -> float:
    """An RFC 3339 time → epoch seconds (ValueError if it is not one)."""
    return parse_datetime(value).timestamp()


def time_or_none(value: object) -> datetime | None:
    """`value` as a time where a bad one simply means "no time" (a probe without a usable
    `probedAt` is not fresh): None when absent, empty, not a string or not RFC 3339."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_datetime(value)
    except ValueError:
        return None


def field_time(obj: Mapping[str, Any], key: str, field: str) -> datetime | None:
    """`obj[key]` as a time, None when absent or empty; RemediationError naming `field`
    (e.g. `spec.nodeStepsRequestedAt`) when it is not a time."""
    value = obj.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RemediationError(field, "expected an RFC3339 time string")
    try:
        return parse_datetime(value)
    except ValueError:
        raise RemediationError(field, f"{value!r} is not an RFC3339 time") from None


# --- names ----------------------------------------------------------------------


def pod_label(pod_name: str) -> str:
    """`pod.unstick.dev/<pod name>` on the pod's Remediation (or its node incident's):
    `kubectl get remediations -A -l pod.unstick.dev/<pod>` finds a pod's story by its name.
    A name longer than a label name (63) is cut and ends in 8 hex digits of its hash."""
    if len(pod_name) <= 63:
        return POD_LABEL_PREFIX + pod_name
    digest = sha256(pod_name.encode()).hexdigest()[:8]
    return f"{POD_LABEL_PREFIX}{pod_name[:54].rstrip('.-_')}-{digest}"


def remediation_name(pod_name: str, uid: str) -> str:
    """`<pod name, cut to 53>-<uid[:8]>`; a cut that ends in `.` or `-` would not be a valid
    object name (it must end alphanumeric), so those are trimmed too."""
    return f"{pod_name[:53].rstrip('.-')}-{uid[:8]}"


def alternate_name(pod_name: str, uid: str) -> str:
    """Where the pod's Remediation goes when its usual name is taken by a record that is not
    the pod's (forged, or left from elsewhere): `<pod name, cut to 200>-<full uid>`."""
    return f"{pod_name[:200].rstrip('.-')}-{uid}"


def pod_labels(pod_name: str, uid: str, node: str) -> dict[str, str]:
    """The labels of a pod's own Remediation."""
    return {NODE_LABEL: node or "none", UID_LABEL: uid, pod_label(pod_name): ""}


def new_remediation(
    namespace: str, name: str, pod_name: str, uid: str, *, node: str, dry_run: bool
) -> dict[str, Any]:
    """The body that creates a pod's Remediation (its identity is immutable after this)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": pod_labels(pod_name, uid, node),
        },
        "spec": {POD_NAME: pod_name, POD_UID: uid, NODE_NAME: node, DRY_RUN: dry_run},
    }


# --- the node-steps request (controller → agent) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeStep:
    """One step of `spec.nodeSteps`: a node action and its target (a path the agent
    re-derives itself from the pod UID before it acts, never takes from here)."""

    action: Action
    target: str = ""
    reason: str = ""

    def to_json(self) -> dict[str, str]:
        return {"action": str(self.action), "target": self.target, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class NodeStepsRequest:
    """`spec.nodeSteps` + `spec.nodeStepsRequestedAt` (+ `dryRun`, `lazyUnmount`)."""

    steps: tuple[NodeStep, ...]
    requested_at: datetime
    dry_run: bool = False
    lazy_unmount: bool = False

    def to_spec(self) -> dict[str, Any]:
        """The merge patch of spec that hands these steps to the agent."""
        return {
            NODE_STEPS: [s.to_json() for s in self.steps],
            NODE_STEPS_REQUESTED_AT: rfc3339(self.requested_at),
            DRY_RUN: self.dry_run,
            LAZY_UNMOUNT: self.lazy_unmount,
        }


def _step(value: object, field: str) -> NodeStep:
    if not isinstance(value, Mapping):
        raise RemediationError(field, "expected an object")
    action, target, reason = value.get("action"), value.get("target"), value.get("reason")
    if not isinstance(action, str) or action not in {str(a) for a in NODE_ACTIONS}:
        raise RemediationError(f"{field}.action", f"{action!r} is not a node action")
    if target is not None and not isinstance(target, str):
        raise RemediationError(f"{field}.target", "expected a string")
    if reason is not None and not isinstance(reason, str):
        raise RemediationError(f"{field}.reason", "expected a string")
    return NodeStep(Action(action), target or "", reason or "")


def parse_steps(spec: Mapping[str, Any]) -> tuple[NodeStep, ...]:
    """The steps of `spec.nodeSteps` (none when absent). RemediationError naming the field
    (e.g. `spec.nodeSteps[0].action`) when one is malformed."""
    raw = spec.get(NODE_STEPS)
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise RemediationError(f"spec.{NODE_STEPS}", "expected a list")
    return tuple(_step(item, f"spec.{NODE_STEPS}[{i}]") for i, item in enumerate(raw))


def parse_node_steps(spec: Mapping[str, Any]) -> NodeStepsRequest | None:
    """The node-steps request in a Remediation's spec, None when there is none (no
    `nodeStepsRequestedAt`). RemediationError naming the field when it is malformed."""
    requested = field_time(spec, NODE_STEPS_REQUESTED_AT, f"spec.{NODE_STEPS_REQUESTED_AT}")
    if requested is None:
        return None
    steps = parse_steps(spec)
    flags = {}
    for key in (DRY_RUN, LAZY_UNMOUNT):
        value = spec.get(key)
        if value is not None and not isinstance(value, bool):
            raise RemediationError(f"spec.{key}", "expected true or false")
        flags[key] = bool(value)
    return NodeStepsRequest(steps, requested, flags[DRY_RUN], flags[LAZY_UNMOUNT])


def steps_answered(spec: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether the agent has finished the latest node-steps request: `status.nodeStepsDoneAt`
    is at or after `spec.nodeStepsRequestedAt` (False when either is absent or malformed)."""
    try:
        requested = field_time(spec, NODE_STEPS_REQUESTED_AT, "spec")
        done = field_time(status, NODE_STEPS_DONE_AT, "status")
    except RemediationError:
        return False
    return requested is not None and done is not None and done >= requested


#: In a `status.nodeActions` entry of a mandate's answer: the index of the step of
#: `status.nodePlan.steps` it is the result of, in place of its target (the target is on
#: record once, in the plan: issue 34, a lean record).
STEP = "step"


def node_results(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`status.nodeActions` as results with their target: an entry that refers to a step of
    `status.nodePlan` (`step`: its index) gets that step's action and target; an entry
    that does not resolve (no plan, an index out of range, not an object) keeps what it
    says (its target then empty). Entries that are not objects are left out."""
    plan = status.get(NODE_PLAN)
    steps = plan.get("steps") if isinstance(plan, Mapping) else None
    steps = steps if isinstance(steps, list) else []
    out = []
    for item in status.get(NODE_ACTIONS_FIELD) or []:
        if not isinstance(item, Mapping):
            continue
        entry = dict(item)
        i = entry.get(STEP)
        if isinstance(i, int) and not isinstance(i, bool) and "target" not in entry:
            step = steps[i] if 0 <= i < len(steps) and isinstance(steps[i], Mapping) else {}
            entry["target"] = str(step.get("target", ""))
            entry.setdefault("action", step.get("action"))
        out.append(entry)
    return out


# --- the probe (agent → controller, `status.probe`) ---------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeStamp:
    """Whose a probe is and when it was taken: `status.probe.podUID`, `.nodeName` and
    `.probedAt` (each None when absent or not of its type). The controller uses a probe
    only when this binds it to the pod, its node and its own request (docs/design.md §3
    invariant 7); the probe's facts themselves are read by `unstick.core.model.snapshot`."""

    pod_uid: str | None
    node_name: str | None
    probed_at: datetime | None


def probe_stamp(probe: Mapping[str, Any]) -> ProbeStamp:
    """The stamp of a probe object (never raises: a malformed field is None)."""
    uid, node = probe.get(POD_UID), probe.get(NODE_NAME)
    return ProbeStamp(
        uid if isinstance(uid, str) else None,
        node if isinstance(node, str) else None,
        time_or_none(probe.get(PROBED_AT)),
    )


# --- the round trip (design.md §11): the mandate (controller → agent) and the plan back ---


@dataclass(frozen=True, slots=True)
class NodeMandate:
    """`spec.mandate`: the node actions the policy in force permits for this pod, that
    policy's name and resourceVersion, dry-run, and the node-budget slots the controller
    granted (and counted in its own budget). Bound to the pod's UID and node. Its request
    time is `spec.nodeStepsRequestedAt`. A permission, never a fact: the agent plans from
    its own probe and re-derives the pod and the policy from the API before acting."""

    pod_uid: str
    node: str
    actions: tuple[Action, ...]
    policy: str
    policy_version: str
    dry_run: bool
    slots: int

    def to_json(self) -> dict[str, Any]:
        return {
            POD_UID: self.pod_uid,
            NODE_NAME: self.node,
            "actions": [str(a) for a in self.actions],
            "policy": self.policy,
            "policyResourceVersion": self.policy_version,
            DRY_RUN: self.dry_run,
            "slots": self.slots,
        }

    def request(self, requested_at: datetime) -> dict[str, Any]:
        """The merge patch of spec that makes this mandate the current request (no list of
        steps: the agent plans them; an older request's `nodeSteps` is cleared)."""
        return {
            MANDATE: self.to_json(),
            NODE_STEPS_REQUESTED_AT: rfc3339(requested_at),
            NODE_STEPS: None,
        }


def _string(obj: Mapping[str, Any], key: str, field: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise RemediationError(f"{field}.{key}", "expected a string")
    return value


def parse_mandate(spec: Mapping[str, Any]) -> NodeMandate | None:
    """`spec.mandate`, None when absent. RemediationError naming the field (e.g.
    `spec.mandate.actions[1]`) when it is malformed."""
    raw = spec.get(MANDATE)
    if raw is None:
        return None
    field = f"spec.{MANDATE}"
    if not isinstance(raw, Mapping):
        raise RemediationError(field, "expected an object")
    actions = raw.get("actions")
    if not isinstance(actions, list):
        raise RemediationError(f"{field}.actions", "expected a list of node actions")
    names = {str(a) for a in NODE_ACTIONS}
    for i, action in enumerate(actions):
        if not isinstance(action, str) or action not in names:
            raise RemediationError(f"{field}.actions[{i}]", f"{action!r} is not a node action")
    dry_run, slots = raw.get(DRY_RUN), raw.get("slots")
    if not isinstance(dry_run, bool):
        raise RemediationError(f"{field}.{DRY_RUN}", "expected true or false")
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 0:
        raise RemediationError(f"{field}.slots", "expected a count (0 or more)")
    return NodeMandate(
        pod_uid=_string(raw, POD_UID, field),
        node=_string(raw, NODE_NAME, field),
        actions=tuple(Action(a) for a in dict.fromkeys(actions)),
        policy=_string(raw, "policy", field),
        policy_version=_string(raw, "policyResourceVersion", field),
        dry_run=dry_run,
        slots=slots,
    )


@dataclass(frozen=True, slots=True)
class NodePlan:
    """`status.nodePlan`: the agent's answer to a mandate before it acts (record before
    act) — the request it answers (`for`, its `nodeStepsRequestedAt`), the cause its own
    diagnosis found on its fresh probe, the steps it will carry out (the plan of that
    diagnosis within the mandate and the policy in force), and the budget slots they take
    (the controller gives back the rest of those it granted)."""

    requested_at: datetime
    cause: str
    steps: tuple[NodeStep, ...]
    slots_used: int

    def to_json(self) -> dict[str, Any]:
        return {
            "for": rfc3339(self.requested_at),
            "cause": self.cause,
            "steps": [s.to_json() for s in self.steps],
            "slotsUsed": self.slots_used,
        }


def parse_node_plan(status: Mapping[str, Any]) -> NodePlan | None:
    """`status.nodePlan`, None when absent. RemediationError naming the field when bad."""
    raw = status.get(NODE_PLAN)
    if raw is None:
        return None
    field = f"status.{NODE_PLAN}"
    if not isinstance(raw, Mapping):
        raise RemediationError(field, "expected an object")
    at = field_time(raw, "for", f"{field}.for")
    if at is None:
        raise RemediationError(f"{field}.for", "missing")
    steps = raw.get("steps")
    if not isinstance(steps, list):
        raise RemediationError(f"{field}.steps", "expected a list")
    used = raw.get("slotsUsed")
    if not isinstance(used, int) or isinstance(used, bool) or used < 0:
        raise RemediationError(f"{field}.slotsUsed", "expected a count (0 or more)")
    return NodePlan(
        at,
        _string(raw, "cause", field),
        tuple(_step(item, f"{field}.steps[{i}]") for i, item in enumerate(steps)),
        used,
    )
