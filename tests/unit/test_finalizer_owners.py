"""Issue #25, finalizer triage: a FinalizerBlocked pod's evidence says who removes each
finalizer and whether that controller seems alive (its leader lease); removal stays the
allowlist's."""

from __future__ import annotations

import pytest

from unstick.core.diagnosis import diagnose
from unstick.core.planner import plan
from unstick.core.policy import parse_policy
from unstick.core.snapshot import BundleError, parse_bundle
from unstick.core.vocabulary import Action, Cause

from .bundles import bundle, pod

JOB = "batch.kubernetes.io/job-tracking"


def kcm_lease(renewed: str, holder: str = "cp-1_8f2c") -> dict:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"namespace": "kube-system", "name": "kube-controller-manager"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed},
    }


def _diagnosed(finalizers: list[str], leases: list[dict], policy: dict | None = None) -> tuple:
    b = bundle(the_pod=pod(node=None, grace=0, finalizers=finalizers))  # captured 10:00:00Z
    b["leases"] = leases
    d = diagnose(parse_bundle(b))
    p = plan(d, parse_policy(policy) if policy else None)
    return d, p, [e.message for e in d.evidence if e.kind == "finalizer"]


def test_job_tracking_with_a_live_job_controller_says_wait() -> None:
    d, p, words = _diagnosed([JOB], [kcm_lease("2026-11-20T09:59:55.000000Z")])
    assert d.cause is Cause.FinalizerBlocked
    assert (
        f"finalizer {JOB} is removed by the Job controller of kube-controller-manager; its "
        "leader lease kube-system/kube-controller-manager was renewed 5s ago by cp-1_8f2c: "
        "it is alive — wait for it" in words[-1]
    )
    assert p.actions == (Action.OBSERVE,)  # no allowlist, no removal


def test_a_lease_not_renewed_for_long_says_the_controller_seems_gone() -> None:
    _, _, words = _diagnosed([JOB], [kcm_lease("2026-11-20T07:00:00Z")])
    assert "was last renewed 3h0m0s ago by cp-1_8f2c: the Job controller" in words[-1]
    assert "seems gone — nothing removes the finalizer until it is back" in words[-1]


def test_no_lease_in_the_bundle_is_unknown_and_custom_finalizers_name_their_domain() -> None:
    _, _, words = _diagnosed([JOB, "example.com/protect"], [])
    assert (
        "kube-system/kube-controller-manager was not read: whether it runs is not known"
        in words[-2]
    )
    assert (
        "finalizer example.com/protect is not a built-in one: the controller that added it "
        "(example.com) removes it" in words[-1]
    )


def test_removal_stays_the_allowlists_even_with_the_owner_gone() -> None:
    stale = [kcm_lease("2026-11-20T07:00:00Z")]
    _, p, _ = _diagnosed([JOB], stale, {"actions": ["observe", "remove-finalizer"]})
    assert p.actions == (Action.OBSERVE,)
    allowed = {"actions": ["observe", "remove-finalizer"], "finalizerAllowlist": [JOB]}
    _, p, _ = _diagnosed([JOB], stale, allowed)
    assert [(s.action, s.target) for s in p.steps] == [(Action.REMOVE_FINALIZER, JOB)]


def test_a_malformed_lease_is_a_clear_error_naming_the_field() -> None:
    b = bundle(the_pod=pod(node=None, grace=0, finalizers=[JOB]))
    b["leases"] = [kcm_lease("soon")]
    with pytest.raises(BundleError, match=r"leases\[0\]\.spec\.renewTime"):
        parse_bundle(b)
