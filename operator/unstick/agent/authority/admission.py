"""Is the admission policy that ties a request to the controller in force? (`--admission-policy`)

What the agent cannot re-derive from the API is who asked for node steps: that tie is the
API server's, through the chart's ValidatingAdmissionPolicy (only the controller's
ServiceAccount writes a Remediation's spec; docs/admission.md). Told the policy's name (the
chart passes it when `admission.enabled`), the agent reads the policy and its binding (same
name) at start-up and on every relist and watch cycle, and refuses every request on record
while they are not in force everywhere it listens: the policy missing, not failing closed,
not guarding Remediations, or the binding missing, not denying, or narrowed to some
namespaces or objects. Narrowed means any of what the chart does not render: a selector
(namespaceSelector, objectSelector) or excludeResourceRules in the policy's
matchConstraints or the binding's matchResources; resource rules (the policy's, and the
binding's when it has any) that do not cover CREATE, UPDATE and DELETE of remediations and
remediations/status in every version, at namespace scope, by any name (apiVersions,
resourceNames, scope); matchConditions other than the chart's two — the controller's own
ServiceAccount, and break-glass groups, none of them a group every user or every
ServiceAccount is in. (What the validations say is not judged here: that is the chart's,
tests/chart/test_remediation_boundary.py.) A policy it cannot read counts as not in force
(never act on a fact that could not be read) — except that the agent keeps a verdict "in
force" through read errors for up to `READ_GRACE_S` (an API server restart must not refuse
every request of a node; removing or narrowing the policy is a successful read). Without
the flag (admission disabled) nothing is checked.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from unstick.core.remediation import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Getter = Callable[[str], JSON | None]  # API path -> the object, None when it does not exist

API = "/apis/admissionregistration.k8s.io/v1"
GUARDED = {"CREATE", "UPDATE", "DELETE"}
READ_GRACE_S = 600.0  # a verdict "in force" outlives read errors this long
RECHECK_S = 5.0  # a verdict "not in force" is read again this often when a request needs it


def _obj(value: object) -> JSON:
    return value if isinstance(value, dict) else {}


STATUS = f"{PLURAL}/status"
# the resource names of an admission rule that match remediations / remediations/status
# ('*' is every resource but no subresource, '*/*' every resource and subresource)
MATCHING = {PLURAL: {"*", "*/*", PLURAL}, STATUS: {"*/*", f"{PLURAL}/*", "*/status", STATUS}}
# the chart's two matchConditions (charts/unstick/templates/remediation-admission.yaml)
NOT_THE_CONTROLLER = re.compile(
    r"request\.userInfo\.username != 'system:serviceaccount:[^':]+:[^':]+'"
)
NOT_EXEMPT = re.compile(
    r"!has\(request\.userInfo\.groups\) \|\| "
    r"!request\.userInfo\.groups\.exists\(g, g in \[('[^']*'(?:, ?'[^']*')*)\]\)"
)
# groups no break-glass exemption may name: every user, or every ServiceAccount, is in one
EVERYONE = ("system:authenticated", "system:unauthenticated", "system:serviceaccounts")


def _rules_problem(rules: object, match_policy: object) -> str | None:
    """None when the resource rules guard CREATE, UPDATE and DELETE of remediations and
    remediations/status, in every version, at namespace scope, by any name; else what
    they leave out (and how the rules that name them are narrowed)."""
    covered: dict[str, set[str]] = {PLURAL: set(), STATUS: set()}
    narrowed: list[str] = []
    for raw in rules if isinstance(rules, list) else []:
        rule = _obj(raw)
        groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
        hit = [r for r, names in MATCHING.items() if names & set(resources)]
        if not hit or not ({GROUP, "*"} & set(groups)):
            continue
        versions = rule.get("apiVersions") or []
        if "*" not in versions and not (VERSION in versions and match_policy != "Exact"):
            narrowed.append(f"apiVersions {versions!r}")
        elif rule.get("resourceNames"):
            narrowed.append(f"resourceNames {rule.get('resourceNames')!r}")
        elif rule.get("scope", "*") not in ("*", "Namespaced"):
            narrowed.append(f"scope {rule.get('scope')!r}")
        else:
            ops = {str(op) for op in rule.get("operations") or []}
            for r in hit:
                covered[r] |= GUARDED if "*" in ops else ops & GUARDED
    missing = [
        f"{', '.join(sorted(GUARDED - ops))} of {r}.{GROUP}"
        for r, ops in covered.items()
        if ops != GUARDED
    ]
    if not missing:
        return None
    how = f" (narrowed: {'; '.join(narrowed)})" if narrowed else ""
    return f"does not guard {'; '.join(missing)}{how}"


def _match_problem(match: JSON, where: str) -> str | None:
    """A selector or exclusion in `where` (matchConstraints, matchResources)."""
    for selector in ("namespaceSelector", "objectSelector"):
        if _obj(match.get(selector)):
            return f"is narrowed by {where}.{selector}: not every namespace is guarded"
    if match.get("excludeResourceRules"):
        return f"excludes resources ({where}.excludeResourceRules)"
    return None


def _conditions_problem(conditions: object) -> str | None:
    """None when the matchConditions are the chart's (the controller's ServiceAccount, and
    break-glass groups that are not everyone's); else which are not."""
    strange: list[str] = []
    for raw in conditions if isinstance(conditions, list) else []:
        cond = _obj(raw)
        text = " ".join(str(cond.get("expression", "")).split())
        if NOT_THE_CONTROLLER.fullmatch(text):
            continue
        exempt = NOT_EXEMPT.fullmatch(text)
        if exempt:
            groups = re.findall(r"'([^']*)'", exempt.group(1))
            everyone = [
                g for g in groups if g in EVERYONE or g.startswith("system:serviceaccounts:")
            ]
            if not everyone:
                continue
            strange.append(f"{cond.get('name')!r} exempts groups everyone is in {everyone!r}")
            continue
        strange.append(f"{cond.get('name')!r}: {text[:120]!r}")
    if strange:
        return (
            "has matchConditions the chart does not render, which can exempt any request: "
            + "; ".join(strange)
        )
    return None


def _policy_problem(policy: JSON | None) -> str | None:
    if policy is None:
        return "does not exist"
    spec = _obj(policy.get("spec"))
    if spec.get("failurePolicy", "Fail") != "Fail":
        return f"has failurePolicy {spec.get('failurePolicy')!r}, not 'Fail'"
    match = _obj(spec.get("matchConstraints"))
    problem = _rules_problem(match.get("resourceRules"), match.get("matchPolicy"))
    if problem:
        return f"{problem} (matchConstraints.resourceRules)"
    return _match_problem(match, "matchConstraints") or _conditions_problem(
        spec.get("matchConditions")
    )


def _binding_problem(binding: JSON | None, name: str) -> str | None:
    if binding is None:
        return "does not exist"
    spec = _obj(binding.get("spec"))
    if spec.get("policyName") != name:
        return f"binds policy {spec.get('policyName')!r}, not {name!r}"
    if "Deny" not in (spec.get("validationActions") or []):
        return f"has validationActions {spec.get('validationActions')!r}, without Deny"
    match = _obj(spec.get("matchResources"))
    problem = _match_problem(match, "matchResources")
    if problem:
        return problem
    if match.get("resourceRules"):  # the chart renders none: the policy's rules hold
        problem = _rules_problem(match.get("resourceRules"), match.get("matchPolicy"))
        if problem:
            return f"is narrowed by matchResources.resourceRules: {problem}"
    return None


class Unreadable(Exception):
    """The policy or its binding could not be read; the message says why."""


def admission_problem(name: str, get: Getter) -> str | None:
    """Why the policy `name` and its binding are not in force everywhere (None: they are);
    one that cannot be read is not in force."""
    try:
        return judge(name, get)
    except Unreadable as exc:
        return str(exc)


def judge(name: str, get: Getter) -> str | None:
    """As `admission_problem`, but `Unreadable` when they cannot be read (the caller may
    keep an earlier verdict through a passing API error)."""
    path = quote(name, safe="")
    try:
        policy = get(f"{API}/validatingadmissionpolicies/{path}")
        binding = get(f"{API}/validatingadmissionpolicybindings/{path}")
    except Exception as exc:
        status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
        why = f"{status} {reason}" if status else f"{type(exc).__name__}: {exc}"
        raise Unreadable(
            f"cannot read ValidatingAdmissionPolicy {name!r} or its binding: {why}"
        ) from None
    problem = _policy_problem(policy)
    if problem:
        return f"ValidatingAdmissionPolicy {name!r} {problem}"
    problem = _binding_problem(binding, name)
    if problem:
        return f"ValidatingAdmissionPolicyBinding {name!r} {problem}"
    return None


def refusal_message(problem: str) -> str:
    return (
        f"{problem}: without it a request cannot be told from one the controller made, so "
        "the agent runs none (--admission-policy; docs/admission.md)"
    )


class AdmissionGate:
    """The agent's verdict on `--admission-policy`: `problem` is why every request is
    refused now (None: in force, or no policy to check). Checked at start-up, on every
    relist and every watch cycle (agent/loop.py)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.problem: str | None = None
        self.verified: float | None = None  # monotonic time of the last "in force"
        self.checked = -float("inf")  # monotonic time of the last check

    def check(self, get: Getter, now: float | None = None) -> None:
        if not self.name:
            return
        now = time.monotonic() if now is None else now
        self.checked = now
        try:
            problem = judge(self.name, get)
        except Unreadable as exc:
            age = now - (self.verified if self.verified is not None else -float("inf"))
            if self.problem is None and age < READ_GRACE_S:
                log.warning("%s; in force when last read %.0fs ago", exc, age)
                return
            problem = str(exc)
        if problem is None:
            self.verified = now
        if problem != self.problem:
            if problem:
                log.error("refusing every request: %s", problem)
            else:
                log.info("admission policy %s in force", self.name)
        self.problem = problem

    def problem_now(self, get: Getter, now: float | None = None) -> str | None:
        """The verdict for a request arriving now. A refusing verdict older than RECHECK_S
        is read again first: the policy may have come after the agent started (`helm
        install` creates the DaemonSet before the ValidatingAdmissionPolicy; found on kind,
        where an agent refused every request until its next watch cycle). An "in force"
        verdict is not re-read per request; it is read at every relist and watch cycle."""
        now = time.monotonic() if now is None else now
        if self.problem is not None and now - self.checked >= RECHECK_S:
            self.check(get, now)
        return self.problem
