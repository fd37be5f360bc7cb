"""RemediationPolicy objects as the controller knows them, and pod/namespace opt-in.

Policies arrive through Kopf (cluster-scoped CRD events) and are validated with the
core's `parse_policy`; an invalid one is kept as an error (status condition Valid=False)
and never used for an action. Opt-in (design.md §4): pod annotation `unstick.dev/remediate`
= "true" (policy `default`) or a policy name; or namespace label
`unstick.dev/remediate=true` (policy `default`). The annotation value "false" opts a pod
out even in an opted-in namespace. A pod annotation naming a policy that does not serve
the pod's namespace (its `namespaceSelector`, `Policy.serves`) is refused: observe only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from unstick.core.policy import mandate
from unstick.core.policy.remediation_policy import PolicyError, parse_policy
from unstick.core.rules.fencing import FencingSettings
from unstick.core.rules.settings import DiagnosisSettings

DEFAULT_POLICY = mandate.DEFAULT_POLICY
OPT_IN_LABEL = mandate.OPT_IN


@dataclass(frozen=True, slots=True)
class Policy:
    """A valid policy: the core's parsed object plus the numbers the controller uses."""

    name: str
    parsed: Any  # unstick.core.policy.remediation_policy.RemediationPolicy, handed to the planner
    dry_run: bool
    slack_s: float
    node_lost_after_s: float
    probe_max_age_s: float
    cluster_per_minute: int
    node_per_minute: int
    lazy_unmount: bool

    @property
    def diagnosis_settings(self) -> DiagnosisSettings:
        return DiagnosisSettings(
            slack_s=self.slack_s,
            node_lost_after_s=self.node_lost_after_s,
            probe_max_age_s=self.probe_max_age_s,
            finalizer_owners=getattr(self.parsed, "finalizer_owners", ()),  # finalizer triage
            fencing=getattr(self.parsed, "fencing", FencingSettings()),  # docs/fencing.md
        )

    def serves(self, namespace: str, namespace_labels: Mapping[str, str]) -> bool:
        """The core's rule (`RemediationPolicy.serves`); the built-in serves nobody."""
        return self.parsed is not None and bool(self.parsed.serves(namespace, namespace_labels))

    def refusal(self, namespace: str) -> str:
        """Why a pod annotation in `namespace` may not use this policy."""
        if getattr(self.parsed, "namespace_selector", None) is None:
            return (
                f"policy {self.name!r} does not serve namespace {namespace!r} "
                "(it has no namespaceSelector)"
            )
        return (
            f"policy {self.name!r} does not serve namespace {namespace!r} "
            "(its namespaceSelector does not match)"
        )


#: Used for timing (slack etc.) when no policy applies; never permits an action.
BUILTIN = Policy("(built-in)", None, True, 60.0, 300.0, 120.0, 30, 5, False)


def load_policy(name: str, obj: Any) -> Policy:
    """Validate a RemediationPolicy object; raises PolicyError(field, message)."""
    # The name it is stored under decides what it serves (`default` serves all), never a
    # name inside the object.
    parsed = replace(parse_policy(obj), name=name)
    return Policy(
        name=name,
        parsed=parsed,
        dry_run=parsed.dry_run,
        slack_s=parsed.slack_seconds,
        node_lost_after_s=parsed.node_lost_after_seconds,
        probe_max_age_s=parsed.probe_max_age_seconds,
        cluster_per_minute=parsed.rate_limits.cluster_per_minute,
        node_per_minute=parsed.rate_limits.node_per_minute,
        lazy_unmount=parsed.lazy_unmount,
    )


@dataclass(frozen=True, slots=True)
class OptIn:
    opted_in: bool
    policy_name: str  # the policy the pod asks for; `default` (timing only) when not opted in
    why: str


def opt_in(annotation: str | None, namespace_labels: Mapping[str, str]) -> OptIn:
    """The core's one opt-in rule (`unstick.core.policy.mandate.opt_in`), in the controller's shape.
    Exact values, as design.md §4 and `unstick diagnose` read them: "TRUE" names a policy
    called "TRUE" (which does not exist: observed only, and the Event says why)."""
    choice = mandate.opt_in(annotation, namespace_labels)
    return OptIn(choice.policy is not None, choice.policy or DEFAULT_POLICY, choice.why)


class PolicyBook:
    """Thread-safe map: policy name → Policy, or the validation error message."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._valid: dict[str, Policy] = {}
        self._invalid: dict[str, str] = {}

    def update(self, name: str, obj: Any) -> str | None:
        """Store a policy; returns the error message when it is invalid."""
        try:
            policy = load_policy(name, obj)
        except PolicyError as exc:
            with self._lock:
                self._valid.pop(name, None)
                self._invalid[name] = str(exc)
            return str(exc)
        with self._lock:
            self._invalid.pop(name, None)
            self._valid[name] = policy
        return None

    def remove(self, name: str) -> None:
        with self._lock:
            self._valid.pop(name, None)
            self._invalid.pop(name, None)

    def lookup(self, name: str) -> tuple[Policy | None, str | None]:
        """(policy, None), or (None, why it cannot be used)."""
        with self._lock:
            if name in self._valid:
                return self._valid[name], None
            if name in self._invalid:
                return None, f"RemediationPolicy {name!r} is invalid: {self._invalid[name]}"
        return None, f"RemediationPolicy {name!r} does not exist"

    def finalizer_owners(self) -> list[Any]:
        """Every valid policy's `spec.finalizerOwners` entries (finalizer triage): whose owners
        the controller reads for a FinalizerBlocked pod (each pod's evidence then uses
        its own policy's entries only)."""
        with self._lock:
            valid = list(self._valid.values())
        return [e for p in valid for e in getattr(p.parsed, "finalizer_owners", ())]

    def timing(self, name: str) -> Policy:
        policy, _ = self.lookup(name)
        return policy or BUILTIN


class NamespaceLabels:
    """Namespace labels, fetched on demand and cached for `ttl_s` seconds."""

    def __init__(self, fetch: Callable[[str], dict[str, str]], ttl_s: float = 30.0) -> None:
        self._fetch = fetch
        self._ttl = ttl_s
        self._cache: dict[str, tuple[float, dict[str, str]]] = {}
        self._lock = threading.Lock()

    def get(self, namespace: str) -> dict[str, str]:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(namespace)
        if hit and now - hit[0] < self._ttl:
            return hit[1]
        labels = self._fetch(namespace)
        with self._lock:
            self._cache[namespace] = (now, labels)
        return labels
