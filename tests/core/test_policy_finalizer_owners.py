"""RemediationPolicy's finalizer-owner fields (issue #25): `spec.finalizerOwners` and
`spec.finalizerOwnerGoneSeconds` — parsed into the policy, or a PolicyError naming the
field; never a traceback, whatever the input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unstick.core.model.facts import DEPLOYMENT, LEASE
from unstick.core.policy.remediation_policy import PolicyError, parse_policy
from unstick.core.rules.finalizer_owners import FinalizerOwner, OwnerRef

OPS = {"namespace": "ops", "name": "example-operator"}


def test_the_fields_parse_and_reach_the_diagnosis_settings() -> None:
    policy = parse_policy(
        {
            "finalizerOwners": [
                {"prefix": "example.com/", "deployment": OPS},
                {"prefix": "db.example.org/", "lease": {"namespace": "ops", "name": "db-leader"}},
            ],
            "finalizerOwnerGoneSeconds": 3600,
        }
    )
    assert policy.finalizer_owners == (
        FinalizerOwner("example.com/", OwnerRef(DEPLOYMENT, "ops", "example-operator")),
        FinalizerOwner("db.example.org/", OwnerRef(LEASE, "ops", "db-leader")),
    )
    assert policy.finalizer_owner_gone_seconds == 3600.0
    assert policy.settings.finalizer_owners == policy.finalizer_owners


def test_absent_means_no_mapping_and_no_threshold() -> None:
    policy = parse_policy({})
    assert policy.finalizer_owners == () and policy.finalizer_owner_gone_seconds is None


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"finalizerOwners": {"prefix": "a/"}}, "spec.finalizerOwners", "must be a list"),
        ({"finalizerOwners": ["example.com/"]}, "spec.finalizerOwners[0]", "must be an object"),
        ({"finalizerOwners": [{"deployment": OPS}]}, "spec.finalizerOwners[0].prefix", "missing"),
        (
            {"finalizerOwners": [{"prefix": "example.com/"}]},
            "spec.finalizerOwners[0]",
            "exactly one owner: lease or deployment",
        ),
        (
            {"finalizerOwners": [{"prefix": "example.com/", "deployment": OPS, "lease": OPS}]},
            "spec.finalizerOwners[0]",
            "exactly one owner",
        ),
        (
            {"finalizerOwners": [{"prefix": "example.com/", "deployment": {"namespace": "ops"}}]},
            "spec.finalizerOwners[0].deployment.name",
            "missing",
        ),
        (
            {"finalizerOwners": [{"prefix": "e/", "deployment": OPS | {"namespace": "Ops!"}}]},
            "spec.finalizerOwners[0].deployment.namespace",
            "is not a namespace name",
        ),
        (
            {"finalizerOwners": [{"prefix": "e/", "lease": OPS | {"name": "a_b"}}]},
            "spec.finalizerOwners[0].lease.name",
            "is not a Lease name",
        ),
        (
            {"finalizerOwners": [{"prefix": "e/", "statefulSet": OPS}]},
            "spec.finalizerOwners[0].statefulSet",
            "unknown field",
        ),
        (
            {"finalizerOwners": [{"prefix": "e/", "deployment": OPS | {"kind": "x"}}]},
            "spec.finalizerOwners[0].deployment.kind",
            "unknown field",
        ),
        (
            {"finalizerOwners": [{"prefix": " e", "deployment": OPS}]},
            "spec.finalizerOwners[0].prefix",
            "is not the start of a finalizer name",
        ),
        (
            {"finalizerOwners": [{"prefix": "e/", "deployment": OPS}] * 2},
            "spec.finalizerOwners[1].prefix",
            "listed twice",
        ),
        ({"finalizerOwnerGoneSeconds": -1}, "spec.finalizerOwnerGoneSeconds", "non-negative"),
        ({"finalizerOwnerGoneSeconds": True}, "spec.finalizerOwnerGoneSeconds", "non-negative"),
        ({"finalizerOwnerGoneSeconds": "1h"}, "spec.finalizerOwnerGoneSeconds", "non-negative"),
        ({"finalizerOwnerGoneSecond": 60}, "spec.finalizerOwnerGoneSecond", "unknown field"),
    ],
)
def test_malformed_fields_are_named(spec: dict, field: str, words: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(spec)
    assert err.value.field == field, str(err.value)
    assert words in err.value.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
entry_keys = st.sampled_from(["prefix", "lease", "deployment", "namespace", "name", "x"])
entries = st.dictionaries(entry_keys, json_values | st.fixed_dictionaries({}), max_size=4)


@given(owners=st.lists(entries, max_size=3) | json_values, gone=json_values)
def test_any_input_parses_or_is_a_policy_error_never_a_traceback(
    owners: object, gone: object
) -> None:
    try:
        policy = parse_policy({"finalizerOwners": owners, "finalizerOwnerGoneSeconds": gone})
    except PolicyError as err:
        assert err.field.startswith("spec.finalizerOwner")
        return
    assert all(isinstance(e, FinalizerOwner) for e in policy.finalizer_owners)
