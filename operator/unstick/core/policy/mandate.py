"""May anything be done to this pod, and under which policy? design.md §3 invariants 5 and 7,
§4 — decided from what the API says now, never from a Remediation.

Pure: the caller (the node agent, before every probe and node step) reads the pod, its
namespace's labels and the RemediationPolicy the pod names from the API and passes them
in. `opt_in` is THE opt-in rule (design.md §4); the controller (`controller.policies`),
`unstick diagnose` (`opted_in`, below) and the agent all call it:
- pod annotation `unstick.dev/remediate`: "true" → policy `default`; "false" → opted out
  (even in an opted-in namespace: the pod's own explicit opt-out wins); any other
  non-empty value names a policy (exact: "TRUE" names a policy called "TRUE");
- else (no annotation, or an empty one) namespace label `unstick.dev/remediate=true`
  (exact) → policy `default`;
- else not opted in.
A policy is in force only if it exists, is valid and serves the pod's namespace
(`RemediationPolicy.serves`: its namespaceSelector; `default` serves all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from unstick.core.policy.planner import Step
from unstick.core.policy.remediation_policy import RemediationPolicy
from unstick.core.remediation import MANDATE, REMEDIATE, NodeMandate
from unstick.core.verdict import SAFE, Verdict, refuse
from unstick.core.vocabulary import NODE_ACTIONS, Action, Refusal

OPT_IN = REMEDIATE  # the pod annotation and namespace label
DEFAULT_POLICY = "default"


@dataclass(frozen=True, slots=True)
class OptIn:
    """The pod's opt-in: the policy it asks for (None: not opted in) and why, in words."""

    policy: str | None
    why: str
    names_policy: bool = False  # the pod's annotation names the policy (not "true")

    def __bool__(self) -> bool:
        return self.policy is not None


def opt_in(annotation: str | None, namespace_labels: Mapping[str, str] | None) -> OptIn:
    """The one opt-in rule (see the module docstring). `namespace_labels` None: unknown
    (as offline), read as no label."""
    if annotation == "true":
        return OptIn(DEFAULT_POLICY, f"pod annotation {OPT_IN}=true")
    if annotation == "false":
        return OptIn(None, f"pod annotation {OPT_IN}=false")
    if annotation:
        return OptIn(annotation, f"pod annotation names policy {annotation!r}", names_policy=True)
    if (namespace_labels or {}).get(OPT_IN) == "true":
        return OptIn(DEFAULT_POLICY, f"namespace label {OPT_IN}=true")
    return OptIn(None, "not opted in")


def policy_name(annotation: str | None, namespace_labels: Mapping[str, str] | None) -> str | None:
    """The policy the pod asks for, or None when it has not opted in (`opt_in`)."""
    return opt_in(annotation, namespace_labels).policy


# design.md §3 invariant 5: nothing happens to a pod that has not opted in.
def opted_in(
    annotations: Mapping[str, str],
    namespace_labels: Mapping[str, str] | None,
    policy_name: str,
) -> Verdict:
    """The pod opted in (`opt_in`, the one rule: an explicit annotation "false" opts out
    even in a labelled namespace) and, when its annotation names a policy, names this one
    (None labels: unknown, as offline)."""
    choice = opt_in(annotations.get(OPT_IN), namespace_labels)
    if choice.policy is None:
        return refuse(f"pod has not opted in ({choice.why})")
    if choice.names_policy and choice.policy != policy_name:
        return refuse(
            f"pod has not opted in: annotation {OPT_IN}={choice.policy!r} names neither "
            f"'true' nor policy {policy_name!r}"
        )
    return SAFE


@dataclass(frozen=True, slots=True)
class PolicyLookup:
    """The policy named by the pod as read from the API: the parsed policy, or why there
    is none usable (does not exist, invalid)."""

    name: str
    policy: RemediationPolicy | None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class Mandate:
    """The answer: the policy in force, or the refusal (its reason word and message)."""

    policy: RemediationPolicy | None
    refusal: Refusal | None = None
    message: str = ""

    def __bool__(self) -> bool:
        return self.policy is not None and self.refusal is None


def mandate(
    namespace: str,
    annotation: str | None,
    namespace_labels: Mapping[str, str],
    lookup: PolicyLookup | None,
) -> Mandate:
    """The policy in force for a pod of `namespace` with this opt-in annotation.

    `lookup` is the API's answer for `policy_name(annotation, namespace_labels)` (None
    when the pod has not opted in and nothing was looked up)."""
    name = policy_name(annotation, namespace_labels)
    if name is None:
        why = (
            f"annotation {OPT_IN}=false"
            if annotation == "false"
            else f"no annotation {OPT_IN} on the pod and no label {OPT_IN}=true on "
            f"namespace {namespace}"
        )
        return Mandate(None, Refusal.NOT_OPTED_IN, f"the pod has not opted in ({why})")
    if lookup is None or lookup.name != name:
        return Mandate(None, Refusal.POLICY_FORBIDS, f"RemediationPolicy {name!r} was not read")
    if lookup.policy is None:
        return Mandate(
            None,
            Refusal.POLICY_FORBIDS,
            f"RemediationPolicy {name!r} cannot be used: {lookup.problem}",
        )
    if not lookup.policy.serves(namespace, namespace_labels):
        return Mandate(
            None,
            Refusal.POLICY_FORBIDS,
            f"RemediationPolicy {name!r} does not serve namespace {namespace!r} (its "
            "namespaceSelector does not match)",
        )
    return Mandate(lookup.policy)


def permit(m: Mandate, action: Action) -> Mandate:
    """`m` narrowed to one action: refused unless the policy permits it and is not dry-run."""
    if not m or m.policy is None:
        return m
    if not m.policy.permits(action):
        return Mandate(
            None,
            Refusal.POLICY_FORBIDS,
            f"RemediationPolicy {m.policy.name!r} does not permit {action}",
        )
    if m.policy.dry_run:
        return Mandate(None, Refusal.DRY_RUN, f"RemediationPolicy {m.policy.name!r} is in dry-run")
    return m


# --- the controller's mandate (design.md §11), judged against the policy in force ---------


def within(granted: NodeMandate, m: Mandate, *, pod_uid: str, node: str) -> Mandate:
    """`m` (the policy in force, re-derived from the API) narrowed by the controller's
    `granted` mandate; refused when the mandate cannot be the controller's for this pod
    under this policy: bound to another pod or node (forged), naming another policy than
    the one in force (stale: asked again), naming an action that this very version of the
    policy does not permit, or more slots than its node budget holds (forged). A policy
    changed since (another resourceVersion) is not a refusal: what it permits now is
    intersected with the mandate (`mandated_steps`)."""
    field = f"spec.{MANDATE}"
    if granted.pod_uid != pod_uid:
        return Mandate(
            None,
            Refusal.FORGED,
            f"{field}.podUID: {granted.pod_uid!r} is not this pod ({pod_uid!r})",
        )
    if granted.node != node:
        return Mandate(
            None, Refusal.FORGED, f"{field}.nodeName: {granted.node!r} is not this node ({node!r})"
        )
    if not m or m.policy is None:
        return m
    policy = m.policy
    if granted.policy != policy.name:
        return Mandate(
            None,
            Refusal.STALE,
            f"{field}.policy: {granted.policy!r} is not the policy in force for the pod "
            f"({policy.name!r}); the controller asks again if it still wants the steps",
        )
    if granted.policy_version == policy.resource_version:
        for action in granted.actions:
            if not policy.permits(action):
                return Mandate(
                    None,
                    Refusal.FORGED,
                    f"{field}.actions: RemediationPolicy {policy.name!r} (resourceVersion "
                    f"{policy.resource_version}) does not permit {action}: not a mandate "
                    "the controller writes",
                )
    limit = policy.rate_limits.node_per_minute
    if granted.slots > limit:
        return Mandate(
            None,
            Refusal.FORGED,
            f"{field}.slots: {granted.slots} is more than RemediationPolicy "
            f"{policy.name!r} grants a node per minute ({limit})",
        )
    return m


@dataclass(frozen=True, slots=True)
class Mandated:
    """The agent's plan cut to its mandate: the node steps it may carry out, and each
    node step of its plan it may not, with the refusal's reason word and message."""

    steps: tuple[Step, ...]
    refused: tuple[tuple[Step, Refusal, str], ...]
    dry_run: bool  # the policy in force or the mandate is in dry-run: nothing is carried out


def mandated_steps(planned: Sequence[Step], granted: NodeMandate, m: Mandate) -> Mandated:
    """The node steps of `planned` (the core planner's plan of the agent's own diagnosis)
    that are in the mandate AND that the policy in force (`m`, already judged by `within`)
    permits. Steps of actions that change nothing on the node (observe) and of the
    controller's actions (force-delete, remove-finalizer) are not the agent's: left out."""
    node_steps = [s for s in planned if s.action in NODE_ACTIONS]
    if not m or m.policy is None:
        assert m.refusal is not None
        return Mandated((), tuple((s, m.refusal, m.message) for s in node_steps), False)
    kept: list[Step] = []
    refused: list[tuple[Step, Refusal, str]] = []
    for s in node_steps:
        if s.action not in granted.actions:
            refused.append(
                (s, Refusal.POLICY_FORBIDS, f"spec.{MANDATE}.actions does not grant {s.action}")
            )
        elif not m.policy.permits(s.action):
            why = f"RemediationPolicy {m.policy.name!r} does not permit {s.action}"
            refused.append((s, Refusal.POLICY_FORBIDS, why))
        else:
            kept.append(s)
    return Mandated(tuple(kept), tuple(refused), m.policy.dry_run or granted.dry_run)
