"""Is the admission policy that ties a request to the controller in force? (`--admission-policy`)

What the agent cannot re-derive from the API is who asked for node steps: that tie is the
API server's, through the chart's ValidatingAdmissionPolicy (only the controller's
ServiceAccount writes a Remediation's spec; docs/admission.md). Told the policy's name (the
chart passes it when `admission.enabled`), the agent reads the policy and its binding (same
name) at start-up and on every relist and watch cycle, and refuses every request on record
while they are not in force everywhere it listens: the policy missing, not failing closed,
not guarding Remediations, or the binding missing, not denying, or narrowed to some
namespaces or objects. A policy it cannot read counts as not in force (never act on a fact
that could not be read) — except that the agent keeps a verdict "in force" through read
errors for up to `READ_GRACE_S` (an API server restart must not refuse every request of a
node; removing or narrowing the policy is a successful read). Without the flag (admission
disabled) nothing is checked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from unstick.core.remediation import GROUP, PLURAL

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Getter = Callable[[str], JSON | None]  # API path -> the object, None when it does not exist

API = "/apis/admissionregistration.k8s.io/v1"
GUARDED = {"CREATE", "UPDATE", "DELETE"}
READ_GRACE_S = 600.0  # a verdict "in force" outlives read errors this long
RECHECK_S = 5.0  # a verdict "not in force" is read again this often when a request needs it


def _obj(value: object) -> JSON:
    return value if isinstance(value, dict) else {}


def _policy_problem(policy: JSON | None) -> str | None:
    if policy is None:
        return "does not exist"
    spec = _obj(policy.get("spec"))
    if spec.get("failurePolicy", "Fail") != "Fail":
        return f"has failurePolicy {spec.get('failurePolicy')!r}, not 'Fail'"
    rules = _obj(spec.get("matchConstraints")).get("resourceRules") or []
    covered: set[str] = set()
    for raw in rules if isinstance(rules, list) else []:
        rule = _obj(raw)
        if GROUP in (rule.get("apiGroups") or []) and PLURAL in (rule.get("resources") or []):
            covered |= {str(op) for op in rule.get("operations") or []}
    if "*" not in covered and not covered >= GUARDED:
        missing = ", ".join(sorted(GUARDED - covered))
        return f"does not guard {missing} of {PLURAL}.{GROUP}"
    return None


def _binding_problem(binding: JSON | None, name: str) -> str | None:
    if binding is None:
        return "does not exist"
    spec = _obj(binding.get("spec"))
    if spec.get("policyName") != name:
        return f"binds policy {spec.get('policyName')!r}, not {name!r}"
    if "Deny" not in (spec.get("validationActions") or []):
        return f"has validationActions {spec.get('validationActions')!r}, without Deny"
    match = _obj(spec.get("matchResources"))
    for selector in ("namespaceSelector", "objectSelector"):
        if _obj(match.get(selector)):
            return f"is narrowed by matchResources.{selector}: not every namespace is guarded"
    if match.get("excludeResourceRules"):
        return "excludes resources (matchResources.excludeResourceRules)"
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
