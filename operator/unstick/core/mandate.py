"""May anything be done to this pod, and under which policy? DESIGN §3 invariants 5 and 7,
§4 — decided from what the API says now, never from a Remediation.

Pure: the caller (the node agent, before every probe and node step) reads the pod, its
namespace's labels and the RemediationPolicy the pod names from the API and passes them
in. Opt-in reads exactly as the controller and `unstick diagnose` read it:
- pod annotation `unstick.dev/remediate`: "true" → policy `default`; "false" → opted out
  (even in an opted-in namespace); any other value names a policy;
- else namespace label `unstick.dev/remediate=true` → policy `default`;
- else not opted in.
A policy is in force only if it exists, is valid and serves the pod's namespace
(`RemediationPolicy.serves`: its namespaceSelector; `default` serves all).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from unstick.core.policy import RemediationPolicy
from unstick.core.vocabulary import Action, Refusal

OPT_IN = "unstick.dev/remediate"
DEFAULT_POLICY = "default"


def policy_name(annotation: str | None, namespace_labels: Mapping[str, str]) -> str | None:
    """The policy the pod asks for, or None when it has not opted in."""
    if annotation == "true":
        return DEFAULT_POLICY
    if annotation == "false":
        return None
    if annotation:
        return annotation
    if namespace_labels.get(OPT_IN) == "true":
        return DEFAULT_POLICY
    return None


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
