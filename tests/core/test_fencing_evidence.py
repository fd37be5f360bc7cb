"""Fencing evidence (design.md §10, docs/fencing.md): a NotReady node counts as fenced only
on proof from a source the policy lists in `fencingEvidence` — the out-of-service taint,
the cloud provider's shutdown taint, a FenceAgentsRemediation (in a namespace the policy
names) whose fence action succeeded after the node's last Ready, a SelfNodeRemediation whose
timeAssumedRebooted has passed. Properties over drawn bundles, each checked against an
oracle written here from the drawn objects, and the policy field's validation."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.bundles import CLOUD_SHUTDOWN, NODE, NOW, bundle, far, node, snr
from unstick.core.model.snapshot import parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.policy.remediation_policy import PolicyError, parse_policy
from unstick.core.rules.diagnosis import diagnose
from unstick.core.rules.fencing import FencingSettings, FencingSource, fencing
from unstick.core.vocabulary import Action, Cause

T0 = datetime.fromisoformat(NOW.replace("Z", "+00:00"))
SINCE_AGO = 1200  # the node went NotReady 20 min before the bundle
NAMESPACES = ["medik8s", "openshift-workload-availability", "tenant"]
SOURCES = [s.value for s in FencingSource]
OOS = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


def _at(ago: int) -> str:
    return (T0 - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


@st.composite
def fencing_case(draw: Any) -> dict[str, Any]:
    """Taints, FARs and SNRs (for this node or another, before or after the node's last
    Ready transition, passed or not), and a policy's fencing fields."""
    far_cases = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "namespace": st.sampled_from(NAMESPACES),
                    "ours": st.booleans(),
                    "by_annotation": st.booleans(),
                    "ago": st.none() | st.integers(-60, 2 * SINCE_AGO),
                    "status": st.sampled_from(["True", "True", "False", "Unknown"]),
                }
            ),
            max_size=3,
        )
    )
    snr_cases = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "ours": st.booleans(),
                    "ago": st.none() | st.integers(-600, 2 * SINCE_AGO),
                }
            ),
            max_size=2,
        )
    )
    sources = draw(st.lists(st.sampled_from(SOURCES), unique=True))
    named = draw(st.lists(st.sampled_from(NAMESPACES), unique=True, min_size=1))
    return {
        "oos": draw(st.booleans()),
        "shutdown": draw(st.booleans()),
        "fars": far_cases,
        "snrs": snr_cases,
        "sources": sources,
        "named": named,
    }


def _bundle(case: dict[str, Any]) -> dict[str, Any]:
    taints = ([OOS] if case["oos"] else []) + ([CLOUD_SHUTDOWN] if case["shutdown"] else [])
    b = bundle(
        the_node=node(
            ready="Unknown", since=_at(SINCE_AGO), reason="NodeStatusUnknown", taints=taints
        )
    )
    b["fenceAgentsRemediations"] = []
    for i, c in enumerate(case["fars"]):
        target = NODE if c["ours"] else "node-2"
        succeeded = None if c["ago"] is None else _at(c["ago"])
        if c["by_annotation"]:  # NHC's generated name, the node in the annotation
            one = far(
                name=f"{target}-{i}",
                node=target,
                namespace=c["namespace"],
                succeeded=succeeded,
                status=c["status"],
            )
        else:
            one = far(
                name=target, namespace=c["namespace"], succeeded=succeeded, status=c["status"]
            )
        b["fenceAgentsRemediations"].append(one)
    b["selfNodeRemediations"] = [
        snr(
            name=NODE if c["ours"] else "node-2",
            rebooted=None if c["ago"] is None else _at(c["ago"]),
        )
        for c in case["snrs"]
    ]
    return b


def _policy(case: dict[str, Any]) -> dict[str, Any]:
    return {
        "dryRun": False,
        "actions": ["observe", "force-delete"],
        "fencingEvidence": case["sources"],
        "fenceAgentsRemediationNamespaces": case["named"],
    }


def _oracle(case: dict[str, Any]) -> bool:
    """Fenced, from the drawn objects: a listed source with valid proof."""
    trusted = set(case["sources"])
    return (
        ("outOfServiceTaint" in trusted and case["oos"])
        or ("cloudShutdown" in trusted and case["shutdown"])
        or (
            "fenceAgentsRemediation" in trusted
            and any(
                c["ours"]
                and c["namespace"] in case["named"]
                and c["status"] == "True"
                and c["ago"] is not None
                and c["ago"] < SINCE_AGO  # strictly after the last Ready transition
                for c in case["fars"]
            )
        )
        or (
            "selfNodeRemediation" in trusted
            and any(
                c["ours"] and c["ago"] is not None and 0 <= c["ago"] < SINCE_AGO
                for c in case["snrs"]
            )
        )
    )


@settings(max_examples=400, deadline=None)
@given(fencing_case())
def test_fenced_exactly_on_proof_from_a_listed_source(case: dict[str, Any]) -> None:
    """No source the policy does not list ever fences; a FAR of another namespace, one
    that succeeded before the node's last Ready, an SNR whose time has not come: no proof.
    Fenced NodeUnreachable keeps its plan: force-delete, exactly when fenced."""
    policy = parse_policy(_policy(case))
    facts = parse_bundle(_bundle(case))
    found = fencing(facts, policy.fencing)
    assert found.fenced == _oracle(case), (found, case)
    assert {p.source.value for p in found.proofs} <= set(case["sources"])
    d = diagnose(facts, policy.settings)
    assert d.cause is Cause.NodeUnreachable
    assert d.fenced == _oracle(case)
    planned = [s.action for s in plan(d, policy, opted_in=True).steps]
    assert (Action.FORCE_DELETE in planned) == _oracle(case), (planned, d.evidence)
    for p in found.proofs:  # each proof names its source's object and a time
        line = f"fenced by {p.source.value}: {p.message}"
        assert line in [e.message for e in d.evidence]
        assert "2026-11-" in p.message or "taint" in p.message


@settings(max_examples=200, deadline=None)
@given(fencing_case())
def test_without_any_evidence_never_fenced(case: dict[str, Any]) -> None:
    """Silence is never proof: no taint, no record — never fenced, whatever is trusted."""
    case = case | {"oos": False, "shutdown": False, "fars": [], "snrs": []}
    policy = parse_policy(_policy(case) | {"fencingEvidence": SOURCES})
    d = diagnose(parse_bundle(_bundle(case)), policy.settings)
    assert d.fenced is False
    assert Action.FORCE_DELETE not in [s.action for s in plan(d, policy, opted_in=True).steps]
    assert "NOT fenced" in " ".join(e.message for e in d.evidence)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(SINCE_AGO, 5 * SINCE_AGO), min_size=1, max_size=3))
def test_a_fence_before_the_last_ready_is_not_proof(agos: list[int]) -> None:
    """A FAR whose fence action succeeded at or before the node's last Ready transition
    (an earlier incident) proves nothing now, even with every source trusted."""
    b = bundle(the_node=node(ready="False", since=_at(SINCE_AGO), reason="KubeletNotReady"))
    b["fenceAgentsRemediations"] = [far(succeeded=_at(a)) for a in agos]
    s = FencingSettings(frozenset(FencingSource), ("medik8s",))
    found = fencing(parse_bundle(b), s)
    assert not found.fenced
    assert all("predates the node's last Ready transition" in n for n in found.notes)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMESPACES[1:]), st.integers(0, SINCE_AGO - 1))
def test_a_far_in_a_namespace_not_named_is_not_proof(namespace: str, ago: int) -> None:
    b = bundle(the_node=node(ready="False", since=_at(SINCE_AGO), reason="KubeletNotReady"))
    b["fenceAgentsRemediations"] = [far(namespace=namespace, succeeded=_at(ago))]
    found = fencing(parse_bundle(b), FencingSettings(frozenset(FencingSource), ("medik8s",)))
    assert not found.fenced
    assert f"namespace {namespace} is not one the policy names" in found.notes[0]


def test_evidence_names_source_object_and_time() -> None:
    b = bundle(the_node=node(ready="Unknown", since=_at(SINCE_AGO), reason="NodeStatusUnknown"))
    b["fenceAgentsRemediations"] = [far(name="node-1-x", node=NODE, succeeded=_at(600))]
    policy = parse_policy(
        {
            "fencingEvidence": ["fenceAgentsRemediation"],
            "fenceAgentsRemediationNamespaces": ["medik8s"],
        }
    )
    messages = [e.message for e in diagnose(parse_bundle(b), policy.settings).evidence]
    assert any(m.endswith("; fenced by fenceAgentsRemediation") for m in messages), messages
    assert (
        "fenced by fenceAgentsRemediation: FenceAgentsRemediation medik8s/node-1-x says the fence "
        "action succeeded (FenceAgentActionSucceeded=True, FenceAgentSucceeded) at "
        "2026-11-20T09:50:00Z" in messages
    ), messages


def test_the_default_policy_trusts_only_the_out_of_service_taint() -> None:
    b = bundle(the_node=node(ready="Unknown", since=_at(SINCE_AGO), taints=[CLOUD_SHUTDOWN]))
    b["selfNodeRemediations"] = [snr(rebooted=_at(60))]
    d = diagnose(parse_bundle(b), parse_policy({}).settings)
    assert d.fenced is False
    text = " | ".join(e.message for e in d.evidence)
    assert "NOT fenced" in text and "fencingEvidence: outOfServiceTaint" in text
    assert "the policy does not list cloudShutdown in fencingEvidence" in text
    assert "the policy does not list selfNodeRemediation in fencingEvidence" in text


def test_a_machine_owned_snr_names_no_node() -> None:
    b = bundle(the_node=node(ready="Unknown", since=_at(SINCE_AGO)))
    one = snr(rebooted=_at(60))
    one["metadata"]["ownerReferences"] = [
        {"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine", "name": NODE, "uid": "u"}
    ]
    b["selfNodeRemediations"] = [one]
    facts = parse_bundle(b)
    assert facts.self_node_remediations[0].node is None
    assert not fencing(facts, FencingSettings(frozenset(FencingSource), ("medik8s",))).fenced


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (
            {"fencingEvidence": ["outOfServiceTaint", "heartbeat"]},
            "spec.fencingEvidence[1]",
            "unknown fencing evidence 'heartbeat'",
        ),
        ({"fencingEvidence": "cloudShutdown"}, "spec.fencingEvidence", "list"),
        (
            {"fencingEvidence": ["fenceAgentsRemediation"]},
            "spec.fenceAgentsRemediationNamespaces",
            "must name the namespaces",
        ),
        (
            {"fenceAgentsRemediationNamespaces": ["Bad_NS"]},
            "spec.fenceAgentsRemediationNamespaces[0]",
            "not a namespace name",
        ),
    ],
)
def test_bad_fencing_fields_are_named(spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(spec)
    assert err.value.field == field
    assert words in str(err.value)


def test_the_policy_fields() -> None:
    assert parse_policy({}).fencing == FencingSettings()
    p = parse_policy(
        {"fencingEvidence": [], "fenceAgentsRemediationNamespaces": ["medik8s", "medik8s"]}
    )
    assert p.fencing.sources == frozenset() and p.fencing.far_namespaces == ("medik8s",)
    assert not p.fencing.reads_far and not p.fencing.reads_snr
