"""The reconciler's action budget (controller/acting/grants.py), shared by its collaborators
(node steps, per-pod API actions, the incident path): a slot counts from its time plus
ACT_WITHIN_S, a slot given back frees the budget, the caps hold over any policy, and a
restart's rebuild keeps each grant's recorded policy limits (built-in when unknown)."""

from __future__ import annotations

from dataclasses import replace

from unstick.controller.acting.budget_rebuild import ACT_WITHIN_S
from unstick.controller.acting.grants import Grants
from unstick.controller.deciding.policies import BUILTIN, Policy
from unstick.core.remediation import rfc3339

T0 = 1_800_000_000.0
TWO_PER_NODE = replace(BUILTIN, name="two", cluster_per_minute=100, node_per_minute=2)


def test_a_slot_counts_from_its_time_plus_act_within() -> None:
    grants = Grants(cluster_cap=60, node_cap=10)
    assert grants.take(TWO_PER_NODE, "n1", T0) == 0
    assert grants.take(TWO_PER_NODE, "n1", T0 + 1) == 0
    wait = grants.take(TWO_PER_NODE, "n1", T0 + 2)
    assert wait > 0  # the third on the node waits until the first slot leaves the window
    assert T0 + 2 + wait >= T0 + ACT_WITHIN_S + 60
    assert grants.take(TWO_PER_NODE, "n2", T0 + 2) == 0  # another node has its own window


def test_a_slot_given_back_frees_the_budget_and_a_look_takes_nothing() -> None:
    grants = Grants(cluster_cap=60, node_cap=10)
    grants.take(TWO_PER_NODE, "n1", T0)
    grants.take(TWO_PER_NODE, "n1", T0 + 1)
    assert grants.wait(TWO_PER_NODE, "n1", T0 + 2) > 0
    grants.give_back("n1", T0 + 1)  # the API server refused that act: not carried out
    assert grants.wait(TWO_PER_NODE, "n1", T0 + 2) == 0
    assert grants.wait(TWO_PER_NODE, "n1", T0 + 2) == 0  # looking twice took no slot
    assert grants.take(TWO_PER_NODE, "n1", T0 + 2) == 0


def test_the_caps_hold_over_a_generous_policy() -> None:
    generous = replace(BUILTIN, name="generous", cluster_per_minute=1000, node_per_minute=1000)
    grants = Grants(cluster_cap=60, node_cap=1)
    assert grants.take(generous, "n1", T0) == 0
    assert grants.take(generous, "n1", T0 + 1) > 0


def test_a_rebuild_keeps_the_recorded_policys_limits_or_the_built_in_ones() -> None:
    def record(policy: str, node: str, at: float) -> dict[str, object]:
        action = {"action": "force-delete", "result": "succeeded", "by": "controller"}
        return {
            "spec": {"nodeName": node},
            "status": {"policy": policy, "actions": [{**action, "time": rfc3339(at)}]},
        }

    known: dict[str, Policy] = {"two": TWO_PER_NODE}
    grants = Grants(cluster_cap=60, node_cap=10)
    found = [record("two", "n1", T0 - 10), record("two", "n1", T0 - 5), record("gone", "n2", T0)]
    assert grants.rebuild(found, T0, known.get) == 3
    assert grants.wait(TWO_PER_NODE, "n1", T0 + 1) > 0  # two of two on n1 already
    generous = replace(BUILTIN, name="generous", cluster_per_minute=1000, node_per_minute=1000)
    # n2's grant keeps the built-in 5 per node: four more, not a fifth
    for i in range(4):
        assert grants.take(generous, "n2", T0 + 1 + i) == 0
    assert grants.take(generous, "n2", T0 + 6) > 0
