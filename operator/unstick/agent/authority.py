"""What the agent re-derives from the API before it probes or acts (DESIGN §3 invariant 7).

A Remediation is a channel, not an authority: whoever wrote it, the agent reads from the
API itself that the pod is the one named, Terminating and overdue on this node (`check_pod`
in the handler), that it opted in, and which RemediationPolicy is in force for it
(`read_mandate`: the pod's annotation, its namespace's labels, the policy object, judged
by the pure `unstick.core.mandate`). `dryRun` and `lazyUnmount` come from that policy,
never from the Remediation; the policy's node rate limit is kept here too
(`NodeBudget`), so requests beyond it are refused even if the controller's budget was
lost or bypassed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unstick.core.mandate import Mandate, PolicyLookup, mandate, policy_name
from unstick.core.policy import PolicyError, parse_policy
from unstick.core.ratelimit import Grant, SlidingWindow
from unstick.core.vocabulary import Refusal

JSON = dict[str, Any]
Getter = Callable[[str], JSON | None]  # name → the object from the API, None if absent


def _api_error(exc: Exception) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    return f"{status} {reason}" if status else f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True, slots=True)
class PolicySources:
    """Where the agent reads a namespace and a RemediationPolicy (GET each, fresh)."""

    namespace: Getter
    policy: Getter


def read_mandate(sources: PolicySources, namespace: str, pod: JSON) -> Mandate:
    """The policy in force for `pod` (from the API), or why nothing may be done."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    annotation = annotations.get("unstick.dev/remediate")
    if annotation is not None and not isinstance(annotation, str):
        annotation = None
    try:
        ns = sources.namespace(namespace)
    except Exception as exc:  # never act on facts that could not be read
        return Mandate(
            None, Refusal.UNSAFE, f"cannot GET namespace {namespace!r}: {_api_error(exc)}"
        )
    labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
    name = policy_name(annotation, labels)
    lookup = None
    if name is not None:
        try:
            obj = sources.policy(name)
        except Exception as exc:
            return Mandate(
                None,
                Refusal.UNSAFE,
                f"cannot GET RemediationPolicy {name!r}: {_api_error(exc)}",
            )
        if obj is None:
            lookup = PolicyLookup(name, None, "it does not exist")
        else:
            try:
                lookup = PolicyLookup(name, parse_policy(obj))
            except PolicyError as exc:
                lookup = PolicyLookup(name, None, f"it is invalid: {exc}")
    return mandate(namespace, annotation, labels, lookup)


class NodeBudget:
    """This node's action budget as the agent keeps it: one batch of node steps is one
    action; granted only while fewer than the strictest limit in force were granted in the
    last 60 s (the requesting policy's `nodePerMinute`, every policy's that took a grant in
    the window, and the agent's own cap). In memory: after an agent restart the controller's
    budget (rebuilt from the Remediations) still holds."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._window = SlidingWindow()
        self._lock = threading.Lock()

    def try_take(self, now: float, limit: int) -> float:
        """0.0 when granted, else the seconds until one more fits."""
        own = min(limit, self.cap)
        with self._lock:
            wait = self._window.wait_s(now, own)
            if wait > 0:
                return wait
            self._window.add(Grant(now, own))
            return 0.0
