"""The controller's mandate (design.md §11) as the core reads and judges it: `spec.mandate`
and `status.nodePlan` round-trip and name a bad field; a mandate that cannot be the
controller's for this pod under the policy in force is refused (another pod or node, an
action that this version of the policy does not permit, more slots than its node budget),
and the agent's plan is cut to what both the mandate and the policy in force permit."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from unstick.core.policy.mandate import Mandate, mandated_steps, within
from unstick.core.policy.planner import Step
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.remediation import (
    NodeMandate,
    NodePlan,
    NodeStep,
    RemediationError,
    parse_mandate,
    parse_node_plan,
)
from unstick.core.vocabulary import NODE_ACTIONS, Action, Refusal

UID, NODE = "6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b", "node-a"
AT = datetime(2026, 11, 28, 7, 0, tzinfo=UTC)
GRANTED = NodeMandate(
    UID, NODE, (Action.REPLAY_UNPUBLISH, Action.UNMOUNT, Action.RMDIR_STALE), "default", "7",
    dry_run=False, slots=1,
)  # fmt: skip


def in_force(version: str = "7", **spec: Any) -> Mandate:
    body = {
        "dryRun": False,
        "actions": ["replay-unpublish", "unmount", "rmdir-stale"],
        "rateLimits": {"nodePerMinute": 5},
        **spec,
    }
    meta = {"name": "default", "resourceVersion": version}
    return Mandate(parse_policy({"kind": "RemediationPolicy", "metadata": meta, "spec": body}))


def test_the_mandate_and_the_plan_round_trip() -> None:
    spec = GRANTED.request(AT)
    assert spec["nodeSteps"] is None and spec["nodeStepsRequestedAt"].startswith("2026-11-28T07")
    assert parse_mandate(spec) == GRANTED
    assert parse_mandate({}) is None
    plan = NodePlan(AT, "OrphanedMount", (NodeStep(Action.UNMOUNT, "/x", "why"),), 1)
    assert parse_node_plan({"nodePlan": plan.to_json()}) == plan


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"actions": ["force-delete"]}, "spec.mandate.actions[0]"),
        ({"actions": "unmount"}, "spec.mandate.actions"),
        ({"slots": -1}, "spec.mandate.slots"),
        ({"slots": True}, "spec.mandate.slots"),
        ({"dryRun": "no"}, "spec.mandate.dryRun"),
        ({"policy": 3}, "spec.mandate.policy"),
        ({"nodeName": None}, "spec.mandate.nodeName"),
    ],
)
def test_a_bad_mandate_field_is_named(change: dict[str, Any], field: str) -> None:
    with pytest.raises(RemediationError) as err:
        parse_mandate({"mandate": {**GRANTED.to_json(), **change}})
    assert err.value.field == field


def test_a_mandate_of_another_pod_or_node_is_forged() -> None:
    for uid, node, field in (("other", NODE, "podUID"), (UID, "node-b", "nodeName")):
        verdict = within(GRANTED, in_force(), pod_uid=uid, node=node)
        assert verdict.refusal is Refusal.FORGED and f"spec.mandate.{field}" in verdict.message


def test_an_action_this_version_of_the_policy_does_not_permit_is_forged() -> None:
    verdict = within(GRANTED, in_force(actions=["unmount"]), pod_uid=UID, node=NODE)
    assert verdict.refusal is Refusal.FORGED and "replay-unpublish" in verdict.message
    # the policy changed since the controller decided: intersected, not refused
    changed = in_force("8", actions=["unmount"])
    assert within(GRANTED, changed, pod_uid=UID, node=NODE) == changed
    steps = [Step(Action.REPLAY_UNPUBLISH, "/m", "r"), Step(Action.UNMOUNT, "/m", "u")]
    cut = mandated_steps(steps, GRANTED, changed)
    assert [s.action for s in cut.steps] == [Action.UNMOUNT]
    assert [(s.action, r) for s, r, _ in cut.refused] == [
        (Action.REPLAY_UNPUBLISH, Refusal.POLICY_FORBIDS)
    ]


def test_slots_not_granted_and_another_policy_are_refused() -> None:
    many = NodeMandate(**{**_fields(GRANTED), "slots": 6})
    verdict = within(many, in_force(), pod_uid=UID, node=NODE)
    assert verdict.refusal is Refusal.FORGED and "spec.mandate.slots" in verdict.message
    other = NodeMandate(**{**_fields(GRANTED), "policy": "lenient"})
    assert within(other, in_force(), pod_uid=UID, node=NODE).refusal is Refusal.STALE


def test_only_granted_node_steps_are_kept_and_dry_run_is_either_sides() -> None:
    narrow = NodeMandate(**{**_fields(GRANTED), "actions": (Action.UNMOUNT,)})
    steps = [
        Step(Action.UNMOUNT, "/m", "u"),
        Step(Action.RMDIR_STALE, "/d", "r"),
        Step(Action.FORCE_DELETE, "ns/pod", "the controller's"),
        Step(Action.OBSERVE, "ns/pod", "nothing"),
    ]
    cut = mandated_steps(steps, narrow, in_force())
    assert [s.action for s in cut.steps] == [Action.UNMOUNT] and not cut.dry_run
    assert [s.action for s, _, _ in cut.refused] == [Action.RMDIR_STALE]
    assert mandated_steps(steps, narrow, in_force(dryRun=True)).dry_run
    dry = NodeMandate(**{**_fields(narrow), "dry_run": True})
    assert mandated_steps(steps, dry, in_force()).dry_run
    refused = mandated_steps(steps, narrow, Mandate(None, Refusal.NOT_OPTED_IN, "no"))
    assert not refused.steps and {r for _, r, _ in refused.refused} == {Refusal.NOT_OPTED_IN}


def _fields(m: NodeMandate) -> dict[str, Any]:
    return {k: getattr(m, k) for k in NodeMandate.__slots__}


CRD = Path(__file__).resolve().parents[2] / "operator" / "unstick" / "crds" / "remediations.yaml"
TYPES = {str: "string", bool: "boolean", int: "integer", list: "array"}


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    props: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    return props


@pytest.mark.parametrize("where", ["spec.mandate", "status.nodePlan"])
def test_the_crd_declares_every_key_the_code_writes(where: str) -> None:
    """What the controller writes as spec.mandate and the agent as status.nodePlan is what
    the CRD's schema declares, key for key, with its type, and within its bounds."""
    part, key = where.split(".")
    schema = _schema()[part]["properties"][key]
    plan = NodePlan(AT, "OrphanedMount", (NodeStep(Action.UNMOUNT, "/x", "why"),), 1)
    written = GRANTED.to_json() if key == "mandate" else plan.to_json()
    assert set(written) == set(schema["properties"]) == set(schema["required"])
    for name, value in written.items():
        declared = schema["properties"][name]
        assert declared["type"] == TYPES[type(value)], name
        if isinstance(value, str):
            assert len(value) <= declared["maxLength"], name
    actions = {str(a) for a in NODE_ACTIONS}
    items = schema["properties"]["actions" if key == "mandate" else "steps"]["items"]
    assert set(items.get("enum") or items["properties"]["action"]["enum"]) == actions


STEPS = st.lists(
    st.builds(Step, st.sampled_from(list(Action)), st.sampled_from(["/a", "/b", "ns/p"]),
              st.just("r")),
    max_size=8,
)  # fmt: skip
ALL_NODE_ACTIONS = sorted(NODE_ACTIONS)


@settings(max_examples=300, deadline=None)
@given(
    planned=STEPS,
    granted_actions=st.sets(st.sampled_from(ALL_NODE_ACTIONS)),
    permitted=st.sets(st.sampled_from(ALL_NODE_ACTIONS)),
    policy_dry=st.booleans(),
    granted_dry=st.booleans(),
    refused=st.booleans(),
)
def test_only_what_both_permit_is_ever_kept(
    planned: list[Step],
    granted_actions: set[Action],
    permitted: set[Action],
    policy_dry: bool,
    granted_dry: bool,
    refused: bool,
) -> None:
    """Property: the agent keeps a step only if its plan has it, it is a node action, the
    mandate grants it and the policy in force permits it; every other node step of the
    plan is refused with a reason; nothing else is kept or refused; dry-run is either
    side's; a refused policy keeps nothing."""
    granted = NodeMandate(**{**_fields(GRANTED), "actions": tuple(sorted(granted_actions)),
                             "dry_run": granted_dry})  # fmt: skip
    m = (
        Mandate(None, Refusal.NOT_OPTED_IN, "no")
        if refused
        else in_force(actions=[str(a) for a in sorted(permitted)], dryRun=policy_dry)
    )
    cut = mandated_steps(planned, granted, m)
    node_steps = [s for s in planned if s.action in NODE_ACTIONS]
    assert sorted(map(repr, [*cut.steps, *(s for s, _, _ in cut.refused)])) == sorted(
        map(repr, node_steps)
    )
    for s in cut.steps:
        assert s.action in granted_actions and s.action in permitted and not refused
    for s, reason, message in cut.refused:
        assert message and (refused or s.action not in granted_actions or s.action not in permitted)
        assert reason in (Refusal.POLICY_FORBIDS, Refusal.NOT_OPTED_IN)
    assert cut.dry_run == (not refused and (policy_dry or granted_dry))
