"""Property test (design.md §3 invariant 4, issue #25): `remove-finalizer` is planned only
for an allowlisted finalizer and, with `spec.finalizerOwnerGoneSeconds` set, only once the
finalizer's owner (the policy-mapped Deployment or Lease, or a built-in's leader lease)
has been gone for longer than that — computed here from the drawn objects, independently
of the planner. And the converse: an allowlisted finalizer whose owner is gone long enough
is removed.

A Lease is judged on the reader's clock only (issue 33 finding 6), as client-go's leader
election does: gone once the reader has seen its renewTime and resourceVersion unchanged
for longer than twice its duration (`leasesObserved`), whatever its renewTime — the
holder's clock, drawn here hours behind or ahead of the reader's — says."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.support.bundles import NOW, bundle, pod
from unstick.core.model.snapshot import parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Action, Cause

JOB = "batch.kubernetes.io/job-tracking"
FINALIZERS = ["example.com/a", "example.com/b", "db.example.org/x", JOB]
T0 = datetime.fromisoformat(NOW.replace("Z", "+00:00"))
LEASE_S = 15


def _at(ago: int) -> str:
    return (T0 - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


ago = st.integers(min_value=0, max_value=6 * 3600)


@st.composite
def owner_case(draw: Any) -> dict[str, Any]:
    return {
        "kind": draw(st.sampled_from(["Deployment", "Lease"])),
        "present": draw(st.booleans()),
        "available": draw(st.integers(0, 2)),
        "unavailable_ago": draw(st.none() | ago),
        "renewed_ago": draw(st.integers(-6 * 3600, 6 * 3600)),  # the holder's clock: any skew
        "unchanged_ago": draw(st.none() | ago),  # the reader's memory; None: read once, now
        "change_seen": draw(st.booleans()),
        "seen_gone_ago": draw(st.none() | ago),
    }


def _object(name: str, o: dict[str, Any]) -> dict[str, Any]:
    meta = {"namespace": "ops", "name": name}
    if o["kind"] == "Lease":
        spec = {"holderIdentity": "x", "leaseDurationSeconds": LEASE_S}
        return {
            "kind": "Lease",
            "metadata": meta,
            "spec": spec | {"renewTime": _at(o["renewed_ago"])},
        }
    status: dict[str, Any] = {"availableReplicas": o["available"]}
    if o["unavailable_ago"] is not None and o["available"] == 0:
        status["conditions"] = [
            {
                "type": "Available",
                "status": "False",
                "lastTransitionTime": _at(o["unavailable_ago"]),
            }
        ]
    return {"kind": "Deployment", "metadata": meta, "spec": {"replicas": 1}, "status": status}


def _gone_ago(o: dict[str, Any] | None) -> int | None:
    """Seconds the owner has been gone, from the drawn values; None: alive or not known."""
    if o is None:
        return None
    if not o["present"]:
        return o["seen_gone_ago"]
    if o["kind"] == "Lease":  # the reader's clock only, never renewTime
        unchanged = o["unchanged_ago"] or 0
        return unchanged if unchanged > 2 * LEASE_S else None
    if o["available"] >= 1:
        return None
    return o["unavailable_ago"] if o["unavailable_ago"] is not None else o["seen_gone_ago"]


@st.composite
def cases(draw: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    finalizers = draw(st.lists(st.sampled_from(FINALIZERS), min_size=1, max_size=4, unique=True))
    owners = {
        "example.com/": draw(st.none() | owner_case()),
        "example.com/b": draw(st.none() | owner_case()),
        "db.example.org/": draw(st.none() | owner_case()),
        "kcm": draw(st.none() | owner_case().map(lambda o: o | {"kind": "Lease"})),
    }
    b = bundle(
        the_pod=pod(node=None, grace=0, finalizers=finalizers),
        the_node=None,
    )
    b["leases"], b["deployments"], b["ownersGoneSince"], b["leasesObserved"] = [], [], [], []
    mapping = []
    for i, (prefix, o) in enumerate(owners.items()):
        if o is None:
            continue
        name = "kube-controller-manager" if prefix == "kcm" else f"owner-{i}"
        ns = "kube-system" if prefix == "kcm" else "ops"
        if prefix != "kcm":
            kind = o["kind"].lower()
            mapping.append({"prefix": prefix, kind: {"namespace": ns, "name": name}})
        if o["present"]:
            obj = _object(name, o)
            obj["metadata"]["namespace"] = ns
            b["leases" if o["kind"] == "Lease" else "deployments"].append(obj)
            if o["kind"] == "Lease" and o["unchanged_ago"] is not None:
                seen = {"namespace": ns, "name": name, "changeSeen": o["change_seen"]}
                b["leasesObserved"].append(seen | {"unchangedSince": _at(o["unchanged_ago"])})
        if o["seen_gone_ago"] is not None and (not o["present"] or o["kind"] == "Deployment"):
            entry = {"kind": o["kind"], "namespace": ns, "name": name}
            b["ownersGoneSince"].append(entry | {"since": _at(o["seen_gone_ago"])})
    spec: dict[str, Any] = {
        "actions": ["observe", "remove-finalizer"],
        "finalizerAllowlist": draw(st.lists(st.sampled_from(FINALIZERS), unique=True)),
        "finalizerOwners": mapping,
    }
    threshold = draw(st.none() | st.integers(0, 4 * 3600))
    if threshold is not None:
        spec["finalizerOwnerGoneSeconds"] = threshold
    return b, spec, owners


def _owner_of(finalizer: str, owners: dict[str, Any]) -> dict[str, Any] | None:
    mapped = [p for p in ("example.com/b", "example.com/", "db.example.org/") if owners[p]]
    for prefix in mapped:  # the longest first
        if finalizer.startswith(prefix):
            return owners[prefix]
    return owners["kcm"] if finalizer == JOB else None


@given(cases())
def test_removal_only_allowlisted_and_with_the_threshold_only_owner_gone_longer(
    case: tuple[dict[str, Any], dict[str, Any], dict[str, Any]],
) -> None:
    b, spec, owners = case
    policy = parse_policy(spec)
    d = diagnose(parse_bundle(b), policy.settings)
    assert d.cause is Cause.FinalizerBlocked
    removed = {s.target for s in plan(d, policy).steps if s.action is Action.REMOVE_FINALIZER}
    threshold = spec.get("finalizerOwnerGoneSeconds")
    for name in d.finalizers:
        allowlisted = name in spec["finalizerAllowlist"]
        gone = _gone_ago(_owner_of(name, owners))
        eligible = allowlisted and (threshold is None or (gone is not None and gone > threshold))
        assert (name in removed) == eligible, (name, gone, threshold, d.evidence)
