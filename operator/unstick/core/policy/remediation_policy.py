"""RemediationPolicy (docs/contracts.md): which actions are permitted, and the knobs.

`parse_policy` accepts the whole object (apiVersion/kind/metadata/spec) or just its
`spec`, and rejects anything it does not understand with a PolicyError naming the
field, e.g. `spec.rateLimits.nodePerMinute: must be a non-negative integer`.

Which namespaces may use a policy (design.md §4, `RemediationPolicy.serves`): the policy
named `default` serves every namespace; any other policy serves exactly the namespaces
its `namespaceSelector` (a standard LabelSelector) matches — `{}` matches all — and, with
no `namespaceSelector` at all, none: a permissive policy is usable by a pod annotation
only once the administrator has scoped it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from unstick.core import fields as f
from unstick.core.policy.finalizer_fields import finalizer_owners, owner_gone_seconds
from unstick.core.policy.out_of_service import (
    DEFAULT_FENCED_TAINT_MAX_SECONDS,
    DEFAULT_MAX_FENCED_NODES,
    DEFAULT_MAX_NOT_READY_PERCENT,
    OutOfServiceGuards,
)
from unstick.core.remediation import POLICY_KIND
from unstick.core.rules.fencing import DEFAULT_SOURCES, FencingSettings, FencingSource
from unstick.core.rules.finalizer_owners import FinalizerOwner
from unstick.core.rules.settings import DiagnosisSettings
from unstick.core.vocabulary import Action

#: Permitted when a policy has no `actions` key: only observing (safe by default).
DEFAULT_ACTIONS: frozenset[Action] = frozenset({Action.OBSERVE})

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_FINALIZER = re.compile(
    rf"^(?=.{{1,253}}/)({_DNS_LABEL})(\.{_DNS_LABEL})*/([A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?)$"
)

SPEC_KEYS = (
    "dryRun",
    "actions",
    "slackSeconds",
    "nodeLostAfterSeconds",
    "probeMaxAgeSeconds",
    "finalizerAllowlist",
    "rateLimits",
    "lazyUnmount",
    "namespaceSelector",
    "orphanedPodDirs",
    "finalizerOwners",
    "finalizerOwnerGoneSeconds",
    "fencingEvidence",
    "fenceAgentsRemediationNamespaces",
    "maxFencedNodes",
    "maxNotReadyPercent",
    "fencedTaintMaxSeconds",
)
#: What the agent does with a pod directory whose pod is gone from the API (design.md §9).
ORPHANED_POD_DIRS = ("observe", "clean")
RATE_KEYS = ("clusterPerMinute", "nodePerMinute")
SELECTOR_KEYS = ("matchLabels", "matchExpressions")
EXPRESSION_KEYS = ("key", "operator", "values")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
DEFAULT_POLICY = "default"


class PolicyError(f.FieldError):
    """The policy cannot be used; `field` is e.g. `spec.actions[2]`."""


@dataclass(frozen=True, slots=True)
class RateLimits:
    cluster_per_minute: int = 30
    node_per_minute: int = 5


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    """One `matchExpressions` entry: In/NotIn need values, Exists/DoesNotExist none."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values  # NotIn


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes LabelSelector; all terms must hold (the empty selector matches all)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            e.matches(labels) for e in self.match_expressions
        )


@dataclass(frozen=True, slots=True)
class RemediationPolicy:
    name: str = "default"
    dry_run: bool = True
    actions: frozenset[Action] = DEFAULT_ACTIONS
    slack_seconds: float = 60.0
    node_lost_after_seconds: float = 300.0
    probe_max_age_seconds: float = 120.0
    finalizer_allowlist: tuple[str, ...] = ()
    rate_limits: RateLimits = field(default_factory=RateLimits)
    lazy_unmount: bool = False
    #: Namespaces a pod annotation may use this policy from; None: none (see `serves`).
    namespace_selector: LabelSelector | None = None
    #: `observe` (count and report) or `clean` (the safe node steps; docs/aftermath.md).
    orphaned_pod_dirs: str = "observe"
    #: finalizer prefix → the Lease/Deployment serving it (core/policy/finalizer_fields.py)
    finalizer_owners: tuple[FinalizerOwner, ...] = ()
    #: None: the allowlist alone decides; else also the owner gone for longer than this
    finalizer_owner_gone_seconds: float | None = None
    #: which sources prove a NotReady node is off (docs/fencing.md)
    fencing: FencingSettings = field(default_factory=FencingSettings)
    #: the guards of taint-out-of-service / untaint-out-of-service (docs/fencing.md)
    out_of_service: OutOfServiceGuards = field(default_factory=OutOfServiceGuards)
    #: metadata.resourceVersion as read (a mandate names the version it was decided on)
    resource_version: str = ""

    def serves(self, namespace: str, namespace_labels: Mapping[str, str]) -> bool:
        """May a pod in `namespace` (with these labels) use this policy? `default` serves
        every namespace; any other policy only those its namespaceSelector matches, and
        none without a namespaceSelector. Kubernetes labels every namespace with
        `kubernetes.io/metadata.name`; it is added here, so a selector on it works even
        with labels read from an older cache."""
        if self.name == DEFAULT_POLICY:
            return True
        if self.namespace_selector is None:
            return False
        labels = {**namespace_labels, "kubernetes.io/metadata.name": namespace}
        return self.namespace_selector.matches(labels)

    def permits(self, action: Action) -> bool:
        """Observing is always permitted; every other action only when listed."""
        return action is Action.OBSERVE or action in self.actions

    @property
    def settings(self) -> DiagnosisSettings:
        return DiagnosisSettings(
            slack_s=self.slack_seconds,
            node_lost_after_s=self.node_lost_after_seconds,
            probe_max_age_s=self.probe_max_age_seconds,
            finalizer_owners=self.finalizer_owners,
            fencing=self.fencing,
        )


def is_qualified_finalizer(name: str) -> bool:
    """`domain/name`, as Kubernetes validates a qualified finalizer name."""
    return bool(_FINALIZER.match(name))


def _seconds(spec: Mapping[str, object], key: str, default: float, minimum: float = 0) -> float:
    value = spec.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < minimum
    ):
        what = "a non-negative number" if minimum == 0 else f"a number >= {minimum:g}"
        raise f.FieldError(f"spec.{key}", f"must be {what} of seconds (finite)")
    return float(value)


def _count(obj: Mapping[str, object], key: str, where: str, default: int) -> int:
    """A rate limit: a whole number >= 1 (as the CRD requires; 0 would stop everything)."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise f.FieldError(f"{where}.{key}", "must be a positive integer (actions per minute)")
    return value


def _flag(spec: Mapping[str, object], key: str, default: bool) -> bool:
    value = spec.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise f.FieldError(f"spec.{key}", "must be true or false")
    return value


def _choice(spec: Mapping[str, object], key: str, choices: tuple[str, ...]) -> str:
    value = spec.get(key)
    if value is None:
        return choices[0]
    if value not in choices:
        raise f.FieldError(f"spec.{key}", f"must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _unknown_keys(obj: Mapping[str, object], known: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in known:
            raise f.FieldError(f"{where}.{key}", f"unknown field (known: {', '.join(known)})")


def _actions(spec: Mapping[str, object]) -> frozenset[Action]:
    if spec.get("actions") is None:
        return DEFAULT_ACTIONS
    known = [a.value for a in Action]
    out = set()
    for i, raw in enumerate(f.as_list(spec["actions"], "spec.actions")):
        if raw not in known:
            raise f.FieldError(
                f"spec.actions[{i}]", f"unknown action {raw!r} (known: {', '.join(known)})"
            )
        out.add(Action(raw))
    return frozenset(out)


def _allowlist(spec: Mapping[str, object]) -> tuple[str, ...]:
    names = f.string_list(spec, "finalizerAllowlist", "spec")
    for i, name in enumerate(names):
        if not is_qualified_finalizer(name):
            raise f.FieldError(
                f"spec.finalizerAllowlist[{i}]",
                f"{name!r} is not a qualified finalizer name "
                "(domain/name, e.g. example.com/cleanup)",
            )
    return names


def _fencing(spec: Mapping[str, object]) -> FencingSettings:
    """`fencingEvidence` (default: outOfServiceTaint only; [] trusts nothing) and
    `fenceAgentsRemediationNamespaces` (default: none, FARs are not read)."""
    known = [s.value for s in FencingSource]
    sources = DEFAULT_SOURCES
    if spec.get("fencingEvidence") is not None:
        chosen = set()
        for i, raw in enumerate(f.as_list(spec["fencingEvidence"], "spec.fencingEvidence")):
            if raw not in known:
                raise f.FieldError(
                    f"spec.fencingEvidence[{i}]",
                    f"unknown fencing evidence {raw!r} (known: {', '.join(known)})",
                )
            chosen.add(FencingSource(raw))
        sources = frozenset(chosen)
    key = "fenceAgentsRemediationNamespaces"
    namespaces = f.string_list(spec, key, "spec")
    for i, name in enumerate(namespaces):
        if not re.fullmatch(_DNS_LABEL, name) or len(name) > 63:
            raise f.FieldError(f"spec.{key}[{i}]", f"{name!r} is not a namespace name")
    if FencingSource.FENCE_AGENTS_REMEDIATION in sources and not namespaces:
        raise f.FieldError(
            f"spec.{key}",
            "must name the namespaces FenceAgentsRemediations are read from when "
            "fencingEvidence lists fenceAgentsRemediation",
        )
    return FencingSettings(sources, tuple(dict.fromkeys(namespaces)))


def _whole(spec: Mapping[str, object], key: str, default: int, maximum: int | None = None) -> int:
    value = spec.get(key)
    if value is None:
        return default
    top = "" if maximum is None else f" <= {maximum}"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise f.FieldError(f"spec.{key}", f"must be a whole number >= 0{top}")
    if maximum is not None and value > maximum:
        raise f.FieldError(f"spec.{key}", f"must be a whole number >= 0{top}")
    return value


def _out_of_service(spec: Mapping[str, object]) -> OutOfServiceGuards:
    """`maxFencedNodes` (default 1; 0: unstick never taints), `maxNotReadyPercent` (default
    49), `fencedTaintMaxSeconds` (default 3600)."""
    return OutOfServiceGuards(
        max_fenced_nodes=_whole(spec, "maxFencedNodes", DEFAULT_MAX_FENCED_NODES),
        max_not_ready_percent=_whole(
            spec, "maxNotReadyPercent", DEFAULT_MAX_NOT_READY_PERCENT, maximum=100
        ),
        fenced_taint_max_seconds=_seconds(
            spec, "fencedTaintMaxSeconds", DEFAULT_FENCED_TAINT_MAX_SECONDS, minimum=1
        ),
    )


def _requirement(raw: object, where: str) -> SelectorRequirement:
    obj = f.as_object(raw, where)
    _unknown_keys(obj, EXPRESSION_KEYS, where)
    key = f.string(obj, "key", where)
    operator = f.string(obj, "operator", where)
    if operator not in OPERATORS:
        raise f.FieldError(
            f"{where}.operator", f"unknown operator {operator!r} (known: {', '.join(OPERATORS)})"
        )
    values = f.string_list(obj, "values", where)
    if operator in ("In", "NotIn") and not values:
        raise f.FieldError(f"{where}.values", f"must not be empty for operator {operator}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise f.FieldError(f"{where}.values", f"must be empty for operator {operator}")
    return SelectorRequirement(key, operator, frozenset(values))


def _selector(spec: Mapping[str, object]) -> LabelSelector | None:
    if spec.get("namespaceSelector") is None:
        return None
    where = "spec.namespaceSelector"
    obj = f.as_object(spec["namespaceSelector"], where)
    _unknown_keys(obj, SELECTOR_KEYS, where)
    labels = f.opt_object(obj, "matchLabels", where)
    pairs = []
    for key, value in labels.items():
        if not isinstance(value, str):
            raise f.FieldError(f"{where}.matchLabels.{key}", "must be a string")
        pairs.append((key, value))
    expressions = f.opt_list(obj, "matchExpressions", where)
    return LabelSelector(
        match_labels=tuple(sorted(pairs)),
        match_expressions=tuple(
            _requirement(raw, f"{where}.matchExpressions[{i}]") for i, raw in enumerate(expressions)
        ),
    )


def _parse(obj: object) -> RemediationPolicy:
    top = f.as_object(obj, "policy")
    name, version = DEFAULT_POLICY, ""
    if "spec" in top or "kind" in top or "apiVersion" in top:
        kind = top.get("kind")
        if kind is not None and kind != POLICY_KIND:
            raise f.FieldError("kind", f"must be {POLICY_KIND}, got {kind!r}")
        meta = f.opt_object(top, "metadata", "")
        name = f.opt_string(meta, "name", "metadata") or name
        version = f.opt_string(meta, "resourceVersion", "metadata") or ""
        spec = f.opt_object(top, "spec", "")
    else:
        spec = top
    _unknown_keys(spec, SPEC_KEYS, "spec")
    rates = f.opt_object(spec, "rateLimits", "spec")
    _unknown_keys(rates, RATE_KEYS, "spec.rateLimits")
    return RemediationPolicy(
        name=name,
        dry_run=_flag(spec, "dryRun", True),
        actions=_actions(spec),
        slack_seconds=_seconds(spec, "slackSeconds", 60.0),
        node_lost_after_seconds=_seconds(spec, "nodeLostAfterSeconds", 300.0, minimum=1),
        probe_max_age_seconds=_seconds(spec, "probeMaxAgeSeconds", 120.0, minimum=1),
        finalizer_allowlist=_allowlist(spec),
        rate_limits=RateLimits(
            cluster_per_minute=_count(rates, "clusterPerMinute", "spec.rateLimits", 30),
            node_per_minute=_count(rates, "nodePerMinute", "spec.rateLimits", 5),
        ),
        lazy_unmount=_flag(spec, "lazyUnmount", False),
        namespace_selector=_selector(spec),
        orphaned_pod_dirs=_choice(spec, "orphanedPodDirs", ORPHANED_POD_DIRS),
        finalizer_owners=finalizer_owners(spec),
        finalizer_owner_gone_seconds=owner_gone_seconds(spec),
        fencing=_fencing(spec),
        out_of_service=_out_of_service(spec),
        resource_version=version,
    )


def parse_policy(obj: object) -> RemediationPolicy:
    """Read a RemediationPolicy object (or just its spec); raises PolicyError naming the field."""
    try:
        return _parse(obj)
    except f.FieldError as err:
        raise PolicyError(err.field, err.message) from None
