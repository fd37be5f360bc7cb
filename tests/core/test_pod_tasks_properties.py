"""Issue #25's safety, as properties over the generated bundles of test_safety_properties: a
frozen cgroup or a task in D state never leads to a force-delete or a node step that a pod
with a running container would not get — ContainerFrozen plans nothing that changes
anything except an allowed `thaw` of the pod's own frozen cgroups — and a bundle without
the new probe keys reads as before."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_safety_properties import cases, fresh, run
from tests.support.bundles import OTHER_UID, UID, bundle, pod, probe
from unstick.core.model.snapshot import BundleError, parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.rules.diagnosis import diagnose
from unstick.core.rules.pod_tasks import is_pod_cgroup
from unstick.core.vocabulary import CHANGING_ACTIONS, NODE_ACTIONS, Action, Cause

API_DECIDED = (Cause.NotStuck, Cause.FinalizerBlocked, Cause.NodeGone, Cause.NodeUnreachable)


@settings(max_examples=500, deadline=None)
@given(cases())
def test_a_frozen_cgroup_never_leads_to_a_change_beyond_the_api_rules_but_a_thaw(
    case: Any,
) -> None:
    facts, p = run(case)
    d = diagnose(facts, case[1].settings if case[1] else None)
    if d.cause is Cause.ContainerFrozen:
        assert not set(p.actions) & (CHANGING_ACTIONS - {Action.THAW}), p
        assert {Action.FORCE_DELETE, Action.UNMOUNT} <= {r.action for r in p.refused}
        assert not d.nothing_left
    probe_ = facts.probe
    if probe_ is not None and probe_.frozen_cgroups and fresh(facts) and facts.pod.node_name:
        # fresh: rule 3a decides unless an API-only rule (1-3) came first
        assert d.cause in (Cause.ContainerFrozen, *API_DECIDED), d.cause
    if probe_ is not None and (probe_.frozen_cgroups or probe_.d_tasks) and fresh(facts):
        assert d.cause is not Cause.KubeletNotProgressing


@settings(max_examples=500, deadline=None)
@given(cases())
def test_thaw_only_for_container_frozen_and_only_the_pods_own_frozen_cgroups(case: Any) -> None:
    facts, p = run(case)
    thaws = [s for s in p.steps if s.action is Action.THAW]
    if not thaws:
        return
    d = diagnose(facts, case[1].settings if case[1] else None)
    assert d.cause is Cause.ContainerFrozen and fresh(facts)
    assert facts.probe is not None
    frozen = {c.path for c in facts.probe.frozen_cgroups if c.self_frozen is not False}
    for s in thaws:
        assert is_pod_cgroup(s.target, facts.pod.uid), s.target
        assert s.target in frozen
        assert ".." not in s.target.split("/")


OWN = f"/kubepods/pod{UID}/cri-containerd-id-app"
PATHS = [OWN, f"/kubepods/pod{OTHER_UID}/c", f"/kubepods/pod{UID}/../x", "/", "/kubepods"]


@settings(max_examples=300, deadline=None)
@given(
    actions=st.lists(st.sampled_from([a.value for a in Action]), unique=True),
    opted_in=st.booleans(),
    state=st.sampled_from(["FROZEN", "FREEZING"]),
    version=st.sampled_from(["v1", "v2"]),
    path=st.sampled_from(PATHS),
    own=st.sampled_from([True, False, None]),
    tasks=st.lists(st.integers(1, 99999), max_size=5, unique=True),
)
def test_container_frozen_plans_a_thaw_of_its_own_cgroup_or_only_observe(
    actions: list[str],
    opted_in: bool,
    state: str,
    version: str,
    path: str,
    own: bool | None,
    tasks: list[int],
) -> None:
    entry = {"path": path, "state": state, "version": version, "selfFrozen": own}
    b = bundle(
        the_pod=pod(statuses=[("app", "running")]),
        the_probe=probe(
            containers=[("app", "running")],
            sight={
                "frozenCgroups": [entry],
                "dTasks": [{"pid": t, "comm": "app", "wchan": "__refrigerator"} for t in tasks],
            },
        ),
    )
    d = diagnose(parse_bundle(b))
    assert d.cause is Cause.ContainerFrozen
    p = plan(d, parse_policy({"actions": actions}), opted_in=opted_in)
    thaw = "thaw" in actions and opted_in and path == OWN and own is not False
    assert p.actions == ((Action.THAW,) if thaw else (Action.OBSERVE,))
    assert all(s.target == OWN for s in p.steps if s.action is Action.THAW)
    assert not set(p.actions) & (NODE_ACTIONS - {Action.THAW} | {Action.FORCE_DELETE})


def test_an_older_probe_without_the_new_keys_reads_as_before() -> None:
    old = probe(containers=[("app", "running")])
    assert "dTasks" not in old and "frozenCgroups" not in old
    facts = parse_bundle(bundle(the_pod=pod(statuses=[("app", "running")]), the_probe=old))
    assert facts.probe is not None
    assert facts.probe.d_tasks == () and facts.probe.frozen_cgroups == ()
    assert diagnose(facts).cause is Cause.ContainersStillRunning


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("dTasks", [{"comm": "dd"}], "probe.dTasks[0].pid"),
        ("dTasks", [{"pid": 0, "comm": "dd"}], "probe.dTasks[0].pid"),
        ("dTasks", "dd", "probe.dTasks"),
        ("frozenCgroups", [{"path": "x", "state": "FROZEN", "version": "v1"}], "path"),
        ("frozenCgroups", [{"path": "/x", "state": "THAWED", "version": "v1"}], "state"),
        ("frozenCgroups", [{"path": "/x", "state": "FROZEN", "version": "v3"}], "version"),
    ],
)
def test_a_bad_new_key_is_a_clear_error_naming_the_field(key: str, value: Any, field: str) -> None:
    b = bundle(the_pod=pod(), the_probe=probe(containers=[], sight={key: value}))
    with pytest.raises(BundleError) as err:
        parse_bundle(b)
    assert field in str(err.value)


def test_a_task_in_d_state_is_something_left_even_when_the_runtime_lists_none() -> None:
    """Found by the property above: a fresh probe whose runtime lists no container but that
    saw a task of the pod in D state said KubeletNotProgressing (nothing left → force-delete).
    A process of the pod is still on the node: ContainersStillRunning, observe only."""
    b = bundle(
        the_pod=pod(),
        the_probe=probe(
            containers=[],
            sight={"dTasks": [{"pid": 4711, "comm": "dd", "container": "id-app", "wchan": "x"}]},
        ),
    )
    d = diagnose(parse_bundle(b))
    assert d.cause is Cause.ContainersStillRunning
    assert not d.nothing_left
    p = plan(d, parse_policy({"actions": [a.value for a in Action]}), opted_in=True)
    assert not set(p.actions) & CHANGING_ACTIONS


@settings(max_examples=300, deadline=None)
@given(
    st.uuids().map(str),
    st.uuids().map(str),
    st.sampled_from(["cgroupfs", "systemd"]),
    st.lists(st.sampled_from(["kubepods", "burstable", "kubepods.slice", "x"]), max_size=3),
    st.lists(st.sampled_from(["ctr", "cri-containerd-abc.scope", "sub"]), max_size=2),
)
def test_a_pod_named_cgroup_inside_another_pods_cgroup_is_never_this_pods(
    mine: str, other: str, driver: str, above: list[str], below: list[str]
) -> None:
    """Safety review of issue 25: a cgroup named after this pod inside another pod's
    cgroup (made by a privileged container of that pod) is not this pod's: never thawed."""

    def component(uid: str) -> str:
        if driver == "cgroupfs":
            return f"pod{uid}"
        return f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"

    path = "/" + "/".join([*above, component(other), component(mine), *below])
    assert is_pod_cgroup(path, mine) is (mine == other)
    own = "/" + "/".join([*above, component(mine), *below])
    assert is_pod_cgroup(own, mine)
