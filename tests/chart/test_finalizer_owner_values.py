"""The chart's finalizer-owner values (issue #25): `policy.finalizerOwners` and
`policy.finalizerOwnerGoneSeconds` reach the policy as unstick reads it, and the controller
may `get` exactly the owners named there (one Role per owner, by name), nothing more."""

from __future__ import annotations

import json

from unstick.core.policy.remediation_policy import parse_policy

from .render import by_kind, one, refused, template

OWNERS = [
    {"prefix": "example.com/", "deployment": {"namespace": "ops", "name": "example-operator"}},
    {"prefix": "example.com/x", "deployment": {"namespace": "ops", "name": "example-operator"}},
    {"prefix": "db.example.org/", "lease": {"namespace": "db", "name": "db-leader"}},
]


def _owner_roles(objects: list[dict]) -> list[dict]:
    return [r for r in by_kind(objects, "Role") if "-owner-" in r["metadata"]["name"]]


def test_the_owners_reach_the_policy_and_the_controller_may_read_exactly_them(helm: str) -> None:
    objects = template(
        helm,
        "--set-json",
        f"policy.finalizerOwners={json.dumps(OWNERS)}",
        "--set",
        "policy.finalizerOwnerGoneSeconds=3600",
    )
    policy = parse_policy(one(objects, "RemediationPolicy", "default"))
    assert [(e.prefix, str(e.owner)) for e in policy.finalizer_owners] == [
        ("example.com/", "Deployment ops/example-operator"),
        ("example.com/x", "Deployment ops/example-operator"),
        ("db.example.org/", "Lease db/db-leader"),
    ]
    assert policy.finalizer_owner_gone_seconds == 3600
    roles = {(r["metadata"]["namespace"], json.dumps(r["rules"])) for r in _owner_roles(objects)}
    assert roles == {
        ("ops", json.dumps([{"apiGroups": ["apps"], "resources": ["deployments"],
                             "resourceNames": ["example-operator"], "verbs": ["get"]}])),
        ("db", json.dumps([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                            "resourceNames": ["db-leader"], "verbs": ["get"]}])),
    }  # fmt: skip
    bindings = [b for b in by_kind(objects, "RoleBinding") if "-owner-" in b["metadata"]["name"]]
    assert {b["roleRef"]["name"] for b in bindings} == {
        r["metadata"]["name"] for r in _owner_roles(objects)
    }
    assert {s["name"] for b in bindings for s in b["subjects"]} == {"unstick-controller"}


def test_by_default_no_owner_is_readable_and_no_threshold_is_set(helm: str) -> None:
    objects = template(helm)
    assert _owner_roles(objects) == []
    spec = one(objects, "RemediationPolicy", "default")["spec"]
    assert "finalizerOwners" not in spec and "finalizerOwnerGoneSeconds" not in spec


def test_an_owner_naming_both_kinds_is_refused_by_the_schema(helm: str) -> None:
    both = [OWNERS[0] | {"lease": {"namespace": "ops", "name": "x"}}]
    message = refused(helm, "--set-json", f"policy.finalizerOwners={json.dumps(both)}")
    assert "/policy/finalizerOwners/0" in message, message
