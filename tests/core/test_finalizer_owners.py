"""Issue #25, finalizer triage: a FinalizerBlocked pod's evidence says who removes each
finalizer and whether that controller seems alive (its leader lease); removal stays the
allowlist's."""

from __future__ import annotations

import pytest

from tests.support.bundles import NOW, bundle, pod
from unstick.core.model.snapshot import BundleError, parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Action, Cause

JOB = "batch.kubernetes.io/job-tracking"


def kcm_lease(renewed: str, holder: str = "cp-1_8f2c") -> dict:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"namespace": "kube-system", "name": "kube-controller-manager"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renewed},
    }


def observed(unchanged_since: str, changed: bool = True, **ref: str) -> dict:
    """The reader's memory of a Lease (`leasesObserved`): unchanged since, on its clock."""
    key = ref or {"namespace": "kube-system", "name": "kube-controller-manager"}
    return key | {"unchangedSince": unchanged_since, "changeSeen": changed}


def _diagnosed(
    finalizers: list[str],
    leases: list[dict],
    policy: dict | None = None,
    seen: list[dict] | None = None,
) -> tuple:
    b = bundle(the_pod=pod(node=None, grace=0, finalizers=finalizers))  # captured 10:00:00Z
    b["leases"] = leases
    b["leasesObserved"] = seen or []
    d = diagnose(parse_bundle(b))
    p = plan(d, parse_policy(policy) if policy else None)
    return d, p, [e.message for e in d.evidence if e.kind == "finalizer"]


def test_job_tracking_with_a_live_job_controller_says_wait() -> None:
    # renewTime 3 h behind by the holder's clock (issue 33 finding 6): the reader saw it
    # change 5 s ago on its own clock, so it is alive
    seen = [observed("2026-11-20T09:59:55Z")]
    d, p, words = _diagnosed([JOB], [kcm_lease("2026-11-20T07:00:00Z")], seen=seen)
    assert d.cause is Cause.FinalizerBlocked
    assert (
        f"finalizer {JOB} is removed by the Job controller of kube-controller-manager; its "
        "leader lease kube-system/kube-controller-manager was seen renewed 5s ago by "
        "cp-1_8f2c (its renewTime or resourceVersion changed between two reads, timed on "
        "this reader's clock): it is alive — wait for it" in words[-1]
    )
    assert p.actions == (Action.OBSERVE,)  # no allowlist, no removal


def test_a_lease_read_once_counts_as_held_and_shows_the_holders_renew_time() -> None:
    """One read (a snapshot) cannot tell a stopped owner from a running one: held, as
    client-go judges a first sight; its renewTime is shown as the holder's clock says."""
    _, _, words = _diagnosed([JOB], [kcm_lease("2026-11-20T07:00:00Z")])
    assert "held by cp-1_8f2c was first read 0s ago and has not changed since" in words[-1]
    assert "its renewTime says 3h0m0s ago by its holder's clock" in words[-1]


def test_a_lease_unchanged_for_long_says_the_controller_seems_gone() -> None:
    seen = [observed("2026-11-20T07:00:00Z")]
    _, _, words = _diagnosed([JOB], [kcm_lease("2026-11-20T09:59:00Z")], seen=seen)
    assert (
        "held by cp-1_8f2c has not changed for 3h0m0s on this reader's clock, more than 30s "
        "(twice its duration; its renewTime says 1m0s ago by its holder's clock): the Job "
        "controller" in words[-1]
    )
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
    stale, seen = [kcm_lease("2026-11-20T07:00:00Z")], [observed("2026-11-20T07:00:00Z")]
    _, p, _ = _diagnosed([JOB], stale, {"actions": ["observe", "remove-finalizer"]}, seen)
    assert p.actions == (Action.OBSERVE,)
    allowed = {"actions": ["observe", "remove-finalizer"], "finalizerAllowlist": [JOB]}
    _, p, _ = _diagnosed([JOB], stale, allowed, seen)
    assert [(s.action, s.target) for s in p.steps] == [(Action.REMOVE_FINALIZER, JOB)]


def test_a_malformed_lease_is_a_clear_error_naming_the_field() -> None:
    b = bundle(the_pod=pod(node=None, grace=0, finalizers=[JOB]))
    b["leases"] = [kcm_lease("soon")]
    with pytest.raises(BundleError, match=r"leases\[0\]\.spec\.renewTime"):
        parse_bundle(b)


# --- issue #25, the policy's finalizer owners and "gone for longer than" --------------------

OWNED = "example.com/protect"
OPS = {"namespace": "ops", "name": "example-operator"}


def deployment(available: int, replicas: int = 1, unavailable_since: str | None = None) -> dict:
    status: dict = {"replicas": replicas, "availableReplicas": available}
    if unavailable_since:
        status["conditions"] = [
            {
                "type": "Available",
                "status": "False",
                "reason": "MinimumReplicasUnavailable",
                "lastTransitionTime": unavailable_since,
            }
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"namespace": "ops", "name": "example-operator"},
        "spec": {"replicas": replicas},
        "status": status,
    }


def owned_policy(gone_s: float | None = 3600, allow: bool = True, **owner: object) -> dict:
    spec: dict = {
        "actions": ["observe", "remove-finalizer"],
        "finalizerAllowlist": [OWNED] if allow else [],
        "finalizerOwners": [{"prefix": "example.com/", **(owner or {"deployment": OPS})}],
    }
    if gone_s is not None:
        spec["finalizerOwnerGoneSeconds"] = gone_s
    return spec


def _triaged(extra: dict, policy: dict, finalizers: list[str] | None = None) -> tuple:
    b = bundle(the_pod=pod(node=None, grace=0, finalizers=finalizers or [OWNED]))  # 10:00:00Z
    b.update(extra)
    parsed = parse_policy(policy)
    d = diagnose(parse_bundle(b), parsed.settings)
    p = plan(d, parsed)
    return d, p, [e.message for e in d.evidence if e.kind == "finalizer"]


def test_a_mapped_deployment_gone_longer_than_the_threshold_makes_the_allowlisted_removable() -> (
    None
):
    gone = {"deployments": [deployment(0, unavailable_since="2026-11-20T07:00:00Z")]}
    d, p, words = _triaged(gone, owned_policy())
    assert (
        f"finalizer {OWNED} is served by the Deployment ops/example-operator "
        "(spec.finalizerOwners): 0 of 1 replicas available since 2026-11-20T07:00:00Z "
        "(3h0m0s): it seems gone" in words[-1]
    )
    assert [(s.action, s.target) for s in p.steps] == [(Action.REMOVE_FINALIZER, OWNED)]
    assert d.finalizer_owners[0].state == "gone"


def test_an_alive_owner_means_wait_and_a_recent_outage_is_not_long_enough() -> None:
    _, p, words = _triaged({"deployments": [deployment(1)]}, owned_policy())
    assert "1 of 1 replicas available: it is alive — wait for it" in words[-1]
    assert p.actions == (Action.OBSERVE,)
    assert [r.reason for r in p.refused if r.action is Action.REMOVE_FINALIZER] == [
        f"Deployment ops/example-operator serving finalizer {OWNED} is alive: waiting for it"
    ]
    recent = {"deployments": [deployment(0, unavailable_since="2026-11-20T09:30:00Z")]}
    _, p, _ = _triaged(recent, owned_policy())
    assert p.actions == (Action.OBSERVE,)
    assert any("gone for 30m0s, not yet longer than 1h0m0s" in r.reason for r in p.refused)


def test_never_broader_than_the_allowlist_and_without_a_threshold_the_allowlist_alone() -> None:
    gone = {"deployments": [deployment(0, unavailable_since="2026-11-20T07:00:00Z")]}
    _, p, _ = _triaged(gone, owned_policy(allow=False))
    assert p.actions == (Action.OBSERVE,)
    _, p, _ = _triaged({"deployments": [deployment(1)]}, owned_policy(gone_s=None))
    assert p.actions == (Action.REMOVE_FINALIZER,)  # as before the threshold existed


def test_a_missing_owner_counts_from_when_it_was_first_seen_missing() -> None:
    seen = {
        "ownersGoneSince": [
            {"kind": "Deployment", **OPS, "since": "2026-11-20T08:00:00Z"},
        ]
    }
    _, p, words = _triaged(seen, owned_policy())
    assert (
        "it does not exist (seen missing since 2026-11-20T08:00:00Z (2h0m0s)): nothing removes"
        in words[-1]
    )
    assert p.actions == (Action.REMOVE_FINALIZER,)
    _, p, words = _triaged({}, owned_policy())  # not read at all: not known
    assert "it was not read: whether it runs is not known here" in words[-1]
    assert p.actions == (Action.OBSERVE,)
    assert any("was not read: whether it is gone is not known" in r.reason for r in p.refused)


def test_with_the_threshold_an_unmapped_finalizer_is_not_removed() -> None:
    other = "other.example.org/keep"
    policy = owned_policy() | {"finalizerAllowlist": [other]}
    _, p, words = _triaged({}, policy, finalizers=[other])
    assert "is not a built-in one: the controller that added it (other.example.org)" in words[-1]
    assert p.actions == (Action.OBSERVE,)
    assert any(f"the owner of finalizer {other} is not known" in r.reason for r in p.refused)


def test_a_mapped_lease_and_the_built_in_lease_under_the_threshold() -> None:
    lease = kcm_lease("2026-11-20T07:00:00Z") | {
        "metadata": {"namespace": "ops", "name": "example-leader"}
    }
    policy = owned_policy(lease={"namespace": "ops", "name": "example-leader"})
    mine = observed("2026-11-20T07:00:00Z", namespace="ops", name="example-leader")
    _, p, words = _triaged({"leases": [lease], "leasesObserved": [mine]}, policy)
    assert (
        "served by the Lease ops/example-leader (spec.finalizerOwners): lease "
        "ops/example-leader held by cp-1_8f2c has not changed for 3h0m0s" in words[-1]
    )
    assert p.actions == (Action.REMOVE_FINALIZER,)
    _, p, _ = _triaged({"leases": [lease]}, policy)  # read once: held, not removable
    assert p.actions == (Action.OBSERVE,)
    job = {"actions": ["observe", "remove-finalizer"], "finalizerAllowlist": [JOB]}
    stale = {"leases": [kcm_lease("2026-11-20T07:00:00Z")]}
    stale["leasesObserved"] = [observed("2026-11-20T07:00:00Z")]
    _, p, _ = _triaged(stale, job | {"finalizerOwnerGoneSeconds": 3600}, finalizers=[JOB])
    assert p.actions == (Action.REMOVE_FINALIZER,)  # unchanged for 3h > 1h
    _, p, _ = _triaged(stale, job | {"finalizerOwnerGoneSeconds": 4 * 3600}, finalizers=[JOB])
    assert p.actions == (Action.OBSERVE,)


def test_the_longest_prefix_wins_and_a_policy_entry_over_a_built_in_one() -> None:
    from unstick.core.model.facts import DEPLOYMENT
    from unstick.core.rules.finalizer_owners import FinalizerOwner, OwnerRef, owner_of

    a = FinalizerOwner("example.com/", OwnerRef(DEPLOYMENT, "ops", "a"))
    b = FinalizerOwner("example.com/protect", OwnerRef(DEPLOYMENT, "ops", "b"))
    assert owner_of(OWNED, (a, b)) == b.owner
    assert owner_of("example.com/other", (a, b)) == a.owner
    assert owner_of(JOB, (a,)) == OwnerRef("Lease", "kube-system", "kube-controller-manager")
    mine = FinalizerOwner("batch.kubernetes.io/", OwnerRef("Lease", "kube-system", "kcm-2"))
    assert owner_of(JOB, (mine,)) == mine.owner


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("deployments", [{"metadata": {"namespace": "ops"}}], r"deployments\[0\]\.metadata\.name"),
        (
            "deployments",
            [deployment(0) | {"status": {"availableReplicas": "none"}}],
            r"deployments\[0\]\.status\.availableReplicas",
        ),
        ("ownersGoneSince", [{"kind": "Pod", **OPS, "since": NOW}], r"ownersGoneSince\[0\]\.kind"),
        ("ownersGoneSince", [{"kind": "Lease", **OPS}], r"ownersGoneSince\[0\]\.since"),
        ("ownersGoneSince", {"kind": "Lease"}, r"ownersGoneSince"),
        ("leasesObserved", [OPS], r"leasesObserved\[0\]\.unchangedSince"),
        (
            "leasesObserved",
            [OPS | {"unchangedSince": NOW, "changeSeen": "yes"}],
            r"leasesObserved\[0\]\.changeSeen",
        ),
    ],
)
def test_malformed_owner_keys_are_a_clear_error_naming_the_field(
    key: str, value: object, field: str
) -> None:
    b = bundle(the_pod=pod(node=None, grace=0, finalizers=[OWNED]))
    b[key] = value
    with pytest.raises(BundleError, match=field):
        parse_bundle(b)


def test_an_old_bundle_without_the_new_keys_reads_as_before() -> None:
    b = bundle(the_pod=pod(node=None, grace=0, finalizers=[OWNED]))
    facts = parse_bundle(b)
    assert facts.deployments == {} and facts.owners_gone_since == {}


def test_waiting_for_names_the_owner_an_allowlisted_finalizer_waits_for() -> None:
    from unstick.core.rules.finalizer_owners import waiting_for

    d, _, _ = _triaged({"deployments": [deployment(1)]}, owned_policy())
    assert waiting_for(d.finalizers, d.finalizer_owners, (OWNED,), 3600, d.now) == (
        "the finalizer's owner: Deployment ops/example-operator serving finalizer "
        f"{OWNED} is alive: waiting for it"
    )
    assert waiting_for(d.finalizers, d.finalizer_owners, (), 3600, d.now) is None
    assert waiting_for(d.finalizers, d.finalizer_owners, (OWNED,), None, d.now) is None
