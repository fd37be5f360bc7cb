"""RemediationPolicy parsing and the safety predicates, directly."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unstick.core.policy.mandate import opted_in
from unstick.core.policy.ratelimit import ActionBudget
from unstick.core.policy.remediation_policy import PolicyError, RemediationPolicy, parse_policy
from unstick.core.safety import (
    finalizer_allowed,
    force_delete_safe,
    fresh_probe,
    replay_unpublish_safe,
    restart_kubelet_allowed,
    rmdir_safe,
    unmount_safe,
)
from unstick.core.vocabulary import Action, Cause

NOW = datetime.fromisoformat("2026-11-20T10:00:00+00:00")
ROOT = "/var/lib/kubelet"
UID = "u-1"
MOUNT = f"{ROOT}/pods/{UID}/volumes/kubernetes.io~csi/pv-1/mount"

FULL = {
    "apiVersion": "unstick.dev/v1alpha1",
    "kind": "RemediationPolicy",
    "metadata": {"name": "default"},
    "spec": {
        "dryRun": False,
        "actions": ["observe", "unmount", "force-delete"],
        "slackSeconds": 30,
        "nodeLostAfterSeconds": 600.5,
        "probeMaxAgeSeconds": 60,
        "finalizerAllowlist": ["example.com/cleanup"],
        "rateLimits": {"clusterPerMinute": 10, "nodePerMinute": 2},
        "lazyUnmount": True,
    },
}


def test_whole_object_and_spec_alone_mean_the_same() -> None:
    whole = parse_policy(FULL)
    assert whole == parse_policy(FULL["spec"])
    assert whole.dry_run is False
    assert whole.actions == {Action.OBSERVE, Action.UNMOUNT, Action.FORCE_DELETE}
    assert whole.settings.slack_s == 30 and whole.settings.node_lost_after_s == 600.5
    assert whole.rate_limits.node_per_minute == 2 and whole.lazy_unmount is True


def test_defaults_are_safe() -> None:
    p = parse_policy({})
    assert p == RemediationPolicy()
    assert p.dry_run is True
    assert p.finalizer_allowlist == ()
    assert [a for a in Action if p.permits(a)] == [Action.OBSERVE]


def test_name_comes_from_metadata() -> None:
    assert parse_policy({**FULL, "metadata": {"name": "gold"}}).name == "gold"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"actions": "unmount"}, "spec.actions"),
        ({"actions": ["observe", "delete-everything"]}, "spec.actions[1]"),
        ({"probeMaxAgeSeconds": True}, "spec.probeMaxAgeSeconds"),
        ({"nodeLostAfterSeconds": -0.5}, "spec.nodeLostAfterSeconds"),
        ({"rateLimits": {"clusterPerMinute": 1.5}}, "spec.rateLimits.clusterPerMinute"),
        ({"rateLimits": []}, "spec.rateLimits"),
        ({"finalizerAllowlist": ["Example.com/x"]}, "spec.finalizerAllowlist[0]"),
        ({"finalizerAllowlist": ["example.com/"]}, "spec.finalizerAllowlist[0]"),
        ({"finalizerAllowlist": [3]}, "spec.finalizerAllowlist[0]"),
        ({"lazyUnmount": "false"}, "spec.lazyUnmount"),
        ({"dryrun": True}, "spec.dryrun"),
    ],
)
def test_bad_policies_name_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy({"spec": spec})
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_fresh_probe() -> None:
    assert fresh_probe("n1", NOW - timedelta(seconds=120), "n1", NOW, 120)
    assert not fresh_probe("n1", NOW - timedelta(seconds=121), "n1", NOW, 120)
    assert not fresh_probe("n2", NOW, "n1", NOW, 120)
    assert not fresh_probe(None, None, "n1", NOW, 120)
    assert "probeMaxAge" in fresh_probe("n1", NOW - timedelta(hours=1), "n1", NOW, 120).reason


def test_unmount_safe() -> None:
    assert unmount_safe(MOUNT, ROOT, UID, holders=0, containers_running=False)
    assert not unmount_safe(MOUNT, ROOT, UID, holders=1, containers_running=False)
    assert not unmount_safe(MOUNT, ROOT, UID, holders=0, containers_running=True)
    assert not unmount_safe(MOUNT, ROOT, "u-2", holders=0, containers_running=False)
    assert not unmount_safe(f"{ROOT}/pods/{UID}/volumes", ROOT, UID, 0, False)
    assert not unmount_safe(f"{ROOT}/pods/{UID}/volumes/x/../../etc", ROOT, UID, 0, False)


def test_rmdir_and_replay_unpublish_safe() -> None:
    assert rmdir_safe(MOUNT, ROOT, UID, empty=True)
    assert rmdir_safe(MOUNT, ROOT, UID, empty=None)
    assert "never deletes data" in rmdir_safe(MOUNT, ROOT, UID, empty=False).reason
    assert not rmdir_safe(f"{ROOT}/pods/{UID}", ROOT, UID, empty=True)
    assert replay_unpublish_safe(MOUNT, ROOT, UID, driver_registered=True)
    assert not replay_unpublish_safe(MOUNT, ROOT, UID, driver_registered=None)
    sub = f"{ROOT}/pods/{UID}/volume-subpaths/data/app/0"
    assert not replay_unpublish_safe(sub, ROOT, UID, driver_registered=True)


@pytest.mark.parametrize(
    ("cause", "fenced", "nothing_left", "fresh", "ok"),
    [
        (Cause.NodeGone, None, False, False, True),
        (Cause.NodeUnreachable, True, False, False, True),
        (Cause.NodeUnreachable, False, False, False, False),
        (Cause.KubeletNotProgressing, False, True, True, True),
        (Cause.KubeletNotProgressing, False, True, False, False),
        (Cause.OrphanedMount, True, False, True, False),
        (Cause.FinalizerBlocked, True, False, True, False),
        (Cause.Unknown, True, False, False, False),
    ],
)
def test_force_delete_safe(
    cause: Cause, fenced: bool | None, nothing_left: bool, fresh: bool, ok: bool
) -> None:
    assert bool(force_delete_safe(cause, fenced, nothing_left, fresh)) is ok


def test_finalizer_allowed() -> None:
    assert finalizer_allowed("example.com/x", ("example.com/x",))
    assert not finalizer_allowed("example.com/x", ())
    assert not finalizer_allowed("example.com/x", ("example.com/y",))


def test_opt_in() -> None:
    key = "unstick.dev/remediate"
    assert opted_in({key: "true"}, None, "default")
    assert opted_in({key: "gold"}, None, "gold")
    assert not opted_in({key: "gold"}, None, "default")
    assert not opted_in({key: "True "}, None, "default")
    assert not opted_in({}, None, "default")
    assert opted_in({}, {key: "true"}, "default")
    assert not opted_in({}, {key: "yes"}, "default")


def test_rate_limits_per_node_and_cluster() -> None:
    budget = ActionBudget()
    assert budget.try_acquire("a", 0.0, cluster_per_minute=3, node_per_minute=2) == 0.0
    assert budget.try_acquire("a", 1.0, 3, 2) == 0.0
    assert budget.try_acquire("a", 2.0, 3, 2) == 58.0  # node a: full until 60 s
    assert budget.try_acquire("b", 3.0, 3, 2) == 0.0
    assert budget.try_acquire("c", 4.0, 3, 2) == 56.0  # cluster: full until 60 s
    assert budget.try_acquire("a", 61.0, 3, 2) == 0.0


def test_window_waits_until_the_oldest_grant_leaves_it() -> None:
    budget = ActionBudget()
    for t in (0.0, 10.0, 20.0):
        assert budget.try_acquire("n1", t, cluster_per_minute=3, node_per_minute=60) == 0.0
    assert budget.try_acquire("n1", 30.0, 3, 60) == 30.0  # the grant at 0 s leaves at 60 s
    assert budget.try_acquire("n1", 60.0, 3, 60) == 0.0


def test_policies_share_the_cluster_wide_budget() -> None:
    """Two policies with 2/min each: still 2/min cluster-wide, not 4."""
    budget = ActionBudget()
    assert budget.try_acquire("n1", 0.0, 2, 60) == 0.0  # policy A
    assert budget.try_acquire("n2", 0.0, 2, 60) == 0.0  # policy B
    assert budget.try_acquire("n3", 0.0, 2, 60) == 60.0


def test_a_permissive_policy_gets_nothing_after_a_strict_one_used_the_window() -> None:
    """The finding: after the default policy's 5/node/min were used, a pod naming a
    1000/min policy got 5 more at once. The strictest limit in the window holds."""
    budget = ActionBudget(cluster_cap=10_000, node_cap=10_000)
    for t in range(5):
        assert budget.try_acquire("n1", float(t), 30, 5) == 0.0
    assert budget.try_acquire("n1", 5.0, 1000, 1000) == 55.0  # the first grant leaves at 60
    assert budget.try_acquire("n2", 5.0, 1000, 1000) == 0.0  # another node: its own window
    assert budget.try_acquire("n1", 60.0, 1000, 1000) == 0.0


def test_a_strict_request_is_held_to_its_own_limit_after_permissive_grants() -> None:
    budget = ActionBudget(cluster_cap=10_000, node_cap=10_000)
    for t in range(3):
        assert budget.try_acquire(f"n{t}", float(t), 1000, 1000) == 0.0
    assert budget.try_acquire("n9", 3.0, 2, 5) == 58.0  # 3 in the window >= 2


def test_caps_hold_whatever_the_policy_says() -> None:
    budget = ActionBudget(cluster_cap=4, node_cap=2)
    assert budget.try_acquire("n1", 0.0, 1000, 1000) == 0.0
    assert budget.try_acquire("n1", 1.0, 1000, 1000) == 0.0
    assert budget.try_acquire("n1", 2.0, 1000, 1000) == 58.0  # node cap 2
    assert budget.try_acquire("n2", 2.0, 1000, 1000) == 0.0
    assert budget.try_acquire("n3", 3.0, 1000, 1000) == 0.0
    assert budget.try_acquire("n4", 4.0, 1000, 1000) == 56.0  # cluster cap 4


def test_peek_answers_like_acquire_and_takes_nothing() -> None:
    budget = ActionBudget()
    assert budget.try_acquire("n1", 0.0, 30, 1) == 0.0
    assert budget.peek("n1", 1.0, 30, 1) == 59.0
    assert budget.peek("n2", 1.0, 30, 1) == 0.0
    assert budget.peek("n2", 1.0, 30, 1) == 0.0  # still free: a look takes no slot
    assert budget.try_acquire("n2", 1.0, 30, 1) == 0.0


def test_recorded_grants_count_with_their_limits() -> None:
    """Grants read back after a restart: in time order wherever they are recorded."""
    budget = ActionBudget()
    budget.record("n1", 30.0, 30, 5)
    budget.record("n1", 10.0, 30, 2)
    assert budget.try_acquire("n1", 40.0, 30, 5) == 30.0  # 2/node (strictest): until 70
    assert budget.try_acquire("n1", 70.0, 30, 5) == 0.0  # the grant at 10 s has left


def test_restart_kubelet_at_most_hourly() -> None:
    assert restart_kubelet_allowed(None, NOW)
    assert not restart_kubelet_allowed(NOW - timedelta(minutes=59), NOW)
    assert restart_kubelet_allowed(NOW - timedelta(hours=1), NOW)


limits = st.tuples(st.integers(1, 6), st.integers(1, 4))  # (clusterPerMinute, nodePerMinute)


@settings(max_examples=400, deadline=None)
@given(
    caps=st.tuples(st.integers(1, 8), st.integers(1, 5)),
    calls=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 4), limits, st.booleans()), max_size=60
    ),
)
def test_6_strictest_limit_holds_in_every_window(
    caps: tuple[int, int], calls: list[tuple[str, int, tuple[int, int], bool]]
) -> None:
    """Invariant 6: for any requests from policies with any limits, with restarts in
    between (a new budget rebuilt from the grants of the last minute, as the controller
    does from the Remediations), no 60 s window holds more grants than the strictest limit
    among the policies that took grants in it, nor more than the caps."""
    budget = ActionBudget(cluster_cap=caps[0], node_cap=caps[1])
    t = 0.0
    granted: list[tuple[str, float, tuple[int, int]]] = []
    for node, step, (cluster, per_node), restart in calls:
        t += step * 9
        if restart:
            budget = ActionBudget(cluster_cap=caps[0], node_cap=caps[1])
            for n, at, lim in granted:
                if at > t - 60.0:
                    budget.record(n, at, *lim)
        if budget.try_acquire(node, t, cluster, per_node) == 0.0:
            granted.append((node, t, (cluster, per_node)))
    for _, start, _ in granted:
        window = [g for g in granted if start <= g[1] < start + 60.0]
        assert len(window) <= min([caps[0], *(lim[0] for _, _, lim in window)])
        for name in "abc":
            on_node = [g for g in window if g[0] == name]
            assert len(on_node) <= min([caps[1], *(lim[1] for _, _, lim in on_node)])
