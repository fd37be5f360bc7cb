"""The node-level actions taint-out-of-service / untaint-out-of-service, decided in the
core (core/policy/out_of_service.py, docs/fencing.md): a case per guard, and properties
over drawn nodes, proofs and clusters for the invariants — never a taint without proof
from a trusted source other than the taint itself, never beyond maxFencedNodes, never
the removal of a taint unstick did not apply."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unstick.core.model.facts import CLOUD_SHUTDOWN_TAINT, OUT_OF_SERVICE_TAINT
from unstick.core.policy.out_of_service import (
    APPLIED_ANNOTATION,
    BUDGET_WINDOW_S,
    Applied,
    Cluster,
    Leftovers,
    Manager,
    NodeState,
    OutOfServiceGuards,
    decide_taint,
    decide_untaint,
    node_state,
    out_of_service_taint,
)
from unstick.core.policy.remediation_policy import PolicyError, parse_policy
from unstick.core.rules.fencing import Fencing, FencingSettings, FencingSource, node_fencing

NOW = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
T = NOW.timestamp()
GUARDS = OutOfServiceGuards()
STAMP = "2026-11-20T09:30:00Z"  # when unstick's taint was added (30 min before NOW)
CLOUD = {"key": CLOUD_SHUTDOWN_TAINT, "effect": "NoSchedule", "timeAdded": "2026-11-20T09:50:00Z"}
ALL_SOURCES = FencingSettings(frozenset(FencingSource), ("medik8s",))


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _node(
    ready: str = "Unknown",
    taints: list[dict[str, Any]] | None = None,
    applied: Applied | str | None = None,
    name: str = "w1",
    transition: datetime | None = NOW - timedelta(minutes=10),
) -> NodeState:
    annotations = {}
    if applied is not None:
        annotations[APPLIED_ANNOTATION] = applied if isinstance(applied, str) else applied.to_json()
    return node_state(
        {
            "metadata": {
                "name": name,
                "resourceVersion": "7",
                "creationTimestamp": "2026-11-01T00:00:00Z",
                "annotations": annotations,
            },
            "spec": {"taints": taints or []},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": ready,
                        **({"lastTransitionTime": _iso(transition)} if transition else {}),
                    }
                ]
            },
        }
    )


def _mark(stamp: str = STAMP) -> Applied:
    return Applied(stamp, "cloudShutdown", f"taint {CLOUD_SHUTDOWN_TAINT}", None, "unstick/r")


OURS = out_of_service_taint(STAMP).entry()


def _taint(node: NodeState, cluster: Cluster | None = None, **kw: Any) -> Any:
    proofs = node_fencing(node.facts, (), (), NOW, ALL_SOURCES)
    args = {"permitted": True, "dry_run": False, "now": T, **kw}
    managers = args.pop("managers", ())
    guards = args.pop("guards", GUARDS)
    return decide_taint(
        node, proofs, managers, cluster or Cluster(10, 1, frozenset()), guards, **args
    )


def test_a_notready_node_proven_off_by_the_cloud_is_tainted_with_its_evidence() -> None:
    v = _taint(_node(taints=[CLOUD]))
    assert v.act and v.proof is not None
    assert v.proof.source is FencingSource.CLOUD_SHUTDOWN
    assert v.proof.object == f"taint {CLOUD_SHUTDOWN_TAINT}"
    assert v.proof.at == datetime(2026, 11, 20, 9, 50, tzinfo=UTC)


@pytest.mark.parametrize(
    ("node", "kw", "words"),
    [
        (_node(), {}, "no proof that node w1 is off"),
        (_node(ready="True", taints=[CLOUD]), {}, "is Ready"),
        (_node(taints=[CLOUD]), {"permitted": False}, "does not list taint-out-of-service"),
        (_node(taints=[CLOUD, OURS]), {}, "already carries"),
        (
            _node(taints=[CLOUD]),
            {"managers": (Manager("FenceAgentsRemediation medik8s/w1", NOW),)},
            "does not race it",
        ),
        (_node(taints=[CLOUD]), {"dry_run": True}, "dry run: would taint"),
    ],
)
def test_what_stops_a_taint(node: NodeState, kw: dict[str, Any], words: str) -> None:
    v = _taint(node, **kw)
    assert not v.act and words in v.reason


def test_a_far_from_before_the_last_ready_manages_nothing_now() -> None:
    old = Manager("FenceAgentsRemediation medik8s/w1", NOW - timedelta(hours=2))
    assert _taint(_node(taints=[CLOUD]), managers=(old,)).act


def test_too_many_notready_nodes_stop_every_taint() -> None:
    v = _taint(_node(taints=[CLOUD]), Cluster(4, 2, frozenset()))
    assert not v.act and "2 of 4 nodes are NotReady" in v.reason
    loose = OutOfServiceGuards(max_not_ready_percent=50)
    assert _taint(_node(taints=[CLOUD]), Cluster(4, 2, frozenset()), guards=loose).act


def test_max_fenced_nodes_counts_the_other_nodes_and_the_budget_waits() -> None:
    v = _taint(_node(taints=[CLOUD]), Cluster(10, 2, frozenset({"w2"})))
    assert not v.act and "maxFencedNodes is 1" in v.reason
    spent = Cluster(10, 1, frozenset(), recent_taints=(T - 60,))
    v = _taint(_node(taints=[CLOUD]), spent)
    assert not v.act and v.retry_at == T - 60 + BUDGET_WINDOW_S
    assert _taint(_node(taints=[CLOUD]), Cluster(10, 1, frozenset(), (T - 601,))).act


def test_untaint_only_once_ready_and_nothing_is_left() -> None:
    mine = _node(ready="True", taints=[OURS], applied=_mark())
    assert mine.unstick_taint is not None
    v = decide_untaint(mine, Leftovers(), GUARDS, permitted=True, now=NOW)
    assert v.act and not v.too_long and v.held_s == 1800
    left = Leftovers(("shop/web-0",), ("csi-123",))
    v = decide_untaint(mine, left, GUARDS, permitted=True, now=NOW)
    assert not v.act and "pod shop/web-0 Terminating" in v.reason and "csi-123" in v.reason
    down = _node(taints=[OURS], applied=_mark())
    v = decide_untaint(
        down, Leftovers(), OutOfServiceGuards(fenced_taint_max_seconds=600), permitted=True, now=NOW
    )
    assert not v.act and v.too_long and "not Ready" in v.reason


def test_the_taints_own_evictions_after_the_node_was_ready_again_do_not_hold_it() -> None:
    """The taint's own evictions once the node is back (a pod bound to it by name, made
    again by its StatefulSet and evicted again, in the fencing benchmark) are its kubelet's
    to finish; any other Terminating pod holds the taint: the incident's (evicted before the
    node was Ready again, or at that second), one deleted by anybody else since (not in
    `evicted_at`), one whose time is not known — as a VolumeAttachment does."""
    mine = _node(ready="True", taints=[OURS], applied=_mark())
    ready = NOW - timedelta(minutes=10)  # the Ready condition's lastTransitionTime
    evicted = {"csi/plugin-0": ready + timedelta(seconds=1)}
    v = decide_untaint(mine, Leftovers(("csi/plugin-0",), (), evicted), GUARDS, permitted=True,
                       now=NOW)  # fmt: skip
    assert v.act and "its kubelet's to finish: pod csi/plugin-0" in v.reason, v.reason
    for deleted in ({"shop/web-0": ready - timedelta(minutes=1)}, {"shop/web-0": ready}, {}):
        left = Leftovers(("shop/web-0", "csi/plugin-0"), (), {**evicted, **deleted})
        v = decide_untaint(mine, left, GUARDS, permitted=True, now=NOW)
        assert not v.act and "pod shop/web-0 Terminating" in v.reason, deleted
        assert "csi/plugin-0" not in v.reason
    left = Leftovers(("csi/plugin-0",), ("csi-123",), evicted)
    v = decide_untaint(mine, left, GUARDS, permitted=True, now=NOW)
    assert not v.act and "VolumeAttachment csi-123" in v.reason
    unknown_ready = _node(ready="True", taints=[OURS], applied=_mark(), transition=None)
    v = decide_untaint(unknown_ready, Leftovers(("csi/plugin-0",), (), evicted), GUARDS,
                       permitted=True, now=NOW)  # fmt: skip
    assert not v.act and "pod csi/plugin-0 Terminating" in v.reason, v.reason


def test_an_admins_taint_is_never_removed() -> None:
    theirs = {**OURS, "timeAdded": "2026-11-20T09:40:00Z"}  # re-applied by someone
    for node in (
        _node(ready="True", taints=[OURS]),  # no mark: an admin's
        _node(ready="True", taints=[theirs], applied=_mark()),
        _node(ready="True", taints=[{**OURS, "effect": "NoSchedule"}], applied=_mark()),
        _node(ready="True", taints=[OURS], applied="not json"),
    ):
        v = decide_untaint(node, Leftovers(), GUARDS, permitted=True, now=NOW)
        assert not v.act, node
    gone = _node(ready="True", applied=_mark())
    v = decide_untaint(gone, Leftovers(), GUARDS, permitted=True, now=NOW)
    assert not v.act and v.clear_mark and "removed by someone else" in v.reason


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"maxFencedNodes": -1}, "spec.maxFencedNodes"),
        ({"maxFencedNodes": True}, "spec.maxFencedNodes"),
        ({"maxNotReadyPercent": 101}, "spec.maxNotReadyPercent"),
        ({"fencedTaintMaxSeconds": 0}, "spec.fencedTaintMaxSeconds"),
        ({"actions": ["taint-out-of-sevrice"]}, "spec.actions[0]"),
    ],
)
def test_the_policy_fields_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(spec)
    assert err.value.field == field


def test_the_policy_fields_defaults_and_values() -> None:
    assert parse_policy({}).out_of_service == OutOfServiceGuards(1, 49, 3600.0)
    p = parse_policy(
        {
            "actions": ["taint-out-of-service", "untaint-out-of-service"],
            "maxFencedNodes": 2,
            "maxNotReadyPercent": 30,
            "fencedTaintMaxSeconds": 7200,
        }
    )
    assert p.out_of_service == OutOfServiceGuards(2, 30, 7200.0)


# -- properties ---------------------------------------------------------------------------

TAINT_CHOICES = [
    CLOUD,
    OURS,
    {**OURS, "effect": "NoSchedule"},
    {**OURS, "timeAdded": "2026-11-20T09:40:00Z"},
    {"key": "example.com/other", "effect": "NoSchedule"},
]


@st.composite
def nodes(draw: Any) -> NodeState:
    taints = draw(
        st.lists(st.sampled_from(TAINT_CHOICES), unique_by=lambda t: (t["key"], t["effect"]))
    )
    mark = draw(st.sampled_from([None, _mark(), _mark("2026-11-20T09:40:00Z"), "{}"]))
    ready = draw(st.sampled_from(["True", "False", "Unknown"]))
    return _node(ready=ready, taints=taints, applied=mark)


@st.composite
def clusters(draw: Any) -> Cluster:
    total = draw(st.integers(1, 12))
    fenced = draw(st.sets(st.sampled_from(["w1", "w2", "w3", "w4"]), max_size=4))
    recent = draw(st.lists(st.floats(T - 2 * BUDGET_WINDOW_S, T), max_size=3))
    return Cluster(total, draw(st.integers(0, total)), frozenset(fenced), tuple(recent))


guards = st.builds(OutOfServiceGuards, st.integers(0, 3), st.integers(0, 100), st.just(600.0))
sources = st.sets(st.sampled_from(list(FencingSource))).map(
    lambda s: FencingSettings(frozenset(s), ("medik8s",))
)


@given(nodes(), clusters(), guards, sources, st.booleans(), st.booleans())
def test_never_a_taint_without_proof_or_beyond_the_guards(
    node: NodeState,
    cluster: Cluster,
    g: OutOfServiceGuards,
    trust: FencingSettings,
    permitted: bool,
    dry_run: bool,
) -> None:
    fencing: Fencing = node_fencing(node.facts, (), (), NOW, trust)
    v = decide_taint(node, fencing, (), cluster, g, permitted=permitted, dry_run=dry_run, now=T)
    if not v.act:
        return
    assert permitted and not dry_run and not node.ready and not node.out_of_service
    assert v.proof is not None and v.proof.source is not FencingSource.OUT_OF_SERVICE_TAINT
    assert trust.trusts(v.proof.source)  # a source the policy lists, never silence
    assert CLOUD_SHUTDOWN_TAINT in node.facts.taints  # the only proof these nodes can carry
    assert len(cluster.fenced - {node.name}) + 1 <= g.max_fenced_nodes
    assert cluster.not_ready * 100 <= g.max_not_ready_percent * cluster.nodes
    assert len([t for t in cluster.recent_taints if T - t < BUDGET_WINDOW_S]) < g.max_fenced_nodes


@given(nodes(), st.booleans(), st.booleans(), st.booleans())
def test_never_removes_a_taint_unstick_did_not_apply(
    node: NodeState, permitted: bool, pods_left: bool, attachments_left: bool
) -> None:
    left = Leftovers(("ns/p",) if pods_left else (), ("va",) if attachments_left else ())
    v = decide_untaint(node, left, GUARDS, permitted=permitted, now=NOW)
    if not v.act:
        return
    taint = node.unstick_taint
    assert taint is not None and node.applied is not None
    assert taint.key == OUT_OF_SERVICE_TAINT and taint.effect == "NoExecute"
    assert taint.time_added == node.applied.time_added  # the one its annotation names
    assert permitted and node.ready and not pods_left and not attachments_left
