"""Issue #25's newer causes as properties over the generated bundles of
test_safety_properties: `lazy-unmount` is planned only for HungMount, only for a hung mount
of this pod nobody holds with nothing of the pod running; HungMount and CNITeardownFailed
never plan a force-delete, a plain unmount or any other change; finalizer triage never
changes what FinalizerBlocked plans."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_safety_properties import PATHS, cases, run
from tests.support.bundles import (
    DRIVER,
    PV,
    bundle,
    claimed_volume,
    csi_mount_path,
    holder,
    hung_mount,
    mount_line,
    pod,
    probe,
    pvc_volume,
)
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import CHANGING_ACTIONS, Action, Cause

EVERYTHING = {"actions": [a.value for a in Action]}


def _network_mounts(paths: list[str], fstype: str) -> list[str]:
    """Mount lines of these paths, all of `fstype` from one NFS-like source."""
    return [mount_line(1000 + i, p, fstype, "10.0.0.5:/x") for i, p in enumerate(paths)]


def _with_policy(draw: st.DrawFn, b: dict[str, Any]) -> tuple[dict[str, Any], Any, bool]:
    """The case of bundle `b`: with a policy allowing every action or none, opted in or not."""
    policy = parse_policy(EVERYTHING) if draw(st.booleans()) else None
    return b, policy, draw(st.booleans())


@st.composite
def hung_cases(draw: st.DrawFn) -> tuple[dict[str, Any], Any, bool]:
    """Stuck pods on a Ready node whose fresh probe shows network/FUSE mounts (of the pod
    and not), some held, some reported hung, with the runtime and holder scan answering or
    not — the cases the general generator reaches only rarely."""
    paths = draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=4, unique=True))
    fstype = draw(st.sampled_from(["nfs4", "fuse.sshfs", "ext4"]))
    held = draw(st.lists(st.sampled_from(paths), max_size=2, unique=True))
    hung = draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=3, unique=True))
    the_probe = probe(
        mounts=_network_mounts(paths, fstype),
        holders=[holder(p, 100 + i) for i, p in enumerate(held)],
        containers=draw(st.sampled_from([[("app", "exited")], [("app", "running")], None])),
        sight={
            "holderScan": draw(st.sampled_from(["complete", "complete", "incomplete"])),
            "hungMounts": [hung_mount(p, fstype, source="x", waiting=1) for p in hung],
        },
    )
    status = draw(st.sampled_from(["terminated", "running"]))
    b = bundle(the_pod=pod(statuses=[("app", status)]), the_probe=the_probe)
    return _with_policy(draw, b)


@settings(max_examples=300, deadline=None)
@given(hung_cases())
def test_hung_mounts_plan_only_a_lazy_unmount_of_an_unheld_one(case: Any) -> None:
    _check(case)


@settings(max_examples=500, deadline=None)
@given(cases())
def test_lazy_unmount_only_for_an_unheld_hung_mount_of_the_pod(case: Any) -> None:
    _check(case)


@st.composite
def waiter_cases(draw: st.DrawFn) -> tuple[dict[str, Any], Any, bool]:
    """Stuck pods whose mounts (network, FUSE or not) some processes are blocked on —
    holders, the pod's own, or outside the pod holding nothing (the kubelet's `stat` of
    the mount point: via `path`) — with or without a FUSE count, the pod's containers
    done or not: where a plain unmount is otherwise the plan (OrphanedMount)."""
    paths = draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=4, unique=True))
    fstype = draw(st.sampled_from(["nfs4", "fuse.sshfs", "ext4", "tmpfs"]))
    waited = draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3, unique=True))
    blocked = [
        {"pid": 812, "comm": "kubelet", "state": draw(st.sampled_from(["D", "S"]))}
        | {"wchan": "request_wait_answer", "via": draw(st.sampled_from(["path", "pod", "cwd"]))}
        | {"path": p}
        for p in waited
    ]
    the_probe = probe(
        mounts=_network_mounts(paths, fstype),
        containers=draw(st.sampled_from([[("app", "exited")], [("app", "running")], []])),
        sight={
            "hungMounts": [
                hung_mount(b["path"], fstype, source="x")
                | {"waiting": draw(st.sampled_from([None, 0, 1])), "blocked": [b]}
                for b in blocked
            ]
        },
    )
    status = draw(st.sampled_from(["terminated", "terminated", "running"]))
    b = bundle(
        the_pod=pod(volumes=[pvc_volume()], statuses=[("app", status)]),
        **claimed_volume(driver=draw(st.sampled_from([DRIVER, None]))),
        the_probe=the_probe,
    )
    return _with_policy(draw, b)


PLAIN = (Action.UNMOUNT, Action.REPLAY_UNPUBLISH)  # the CSI driver's unpublish: a plain umount


@settings(max_examples=300, deadline=None)
@given(waiter_cases())
def test_no_plain_unmount_of_a_mount_with_a_blocked_waiter(case: Any) -> None:
    facts, p = run(case)
    assert facts.probe is not None
    waited = {h.mount_point for h in facts.probe.hung_mounts if h.blocked}
    assert not [s for s in p.steps if s.action in PLAIN and s.target in waited], p
    _check(case)


@st.composite
def unsure_cases(draw: st.DrawFn) -> tuple[dict[str, Any], Any, bool]:
    """Stuck pods whose network/FUSE mounts the probe could not tell about: a task blocked
    in a path lookup whose path it could not read may wait on them (`waitersUnknown`),
    with or without other mounts hung, held, the driver registered, the containers done:
    where a plain unmount or the driver's unpublish is otherwise the plan."""
    paths = draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=4, unique=True))
    fstype = draw(st.sampled_from(["nfs4", "fuse.sshfs", "cifs"]))
    unsure = draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=3, unique=True))
    hung = draw(st.lists(st.sampled_from(paths), max_size=1, unique=True))
    the_probe = probe(
        mounts=_network_mounts(paths, fstype),
        holders=[holder(p, 100 + i) for i, p in enumerate(draw(st.sampled_from([[], hung])))],
        containers=draw(st.sampled_from([[("app", "exited")], [("app", "running")], []])),
        sight={
            "waitersUnknown": unsure,
            "blindSpots": ["cannot tell whether blocked tasks wait on ..."],
            "hungMounts": [hung_mount(p, fstype, source="x", waiting=1) for p in hung],
        },
    )
    b = bundle(
        the_pod=pod(volumes=[pvc_volume()], statuses=[("app", "terminated")]),
        **claimed_volume(driver=draw(st.sampled_from([DRIVER, None]))),
        the_probe=the_probe,
    )
    return _with_policy(draw, b)


@settings(max_examples=300, deadline=None)
@given(unsure_cases())
def test_no_plain_unmount_of_a_mount_a_blocked_task_may_wait_on_unread(case: Any) -> None:
    facts, p = run(case)
    assert facts.probe is not None
    unsure = set(facts.probe.waiters_unknown)
    assert not [s for s in p.steps if s.action in PLAIN and s.target in unsure], p
    _check(case)


def test_a_mount_with_unknown_waiters_is_refused_its_unmount_and_replay_in_words() -> None:
    target = csi_mount_path()
    the_probe = probe(
        mounts=[mount_line(1000, target, "nfs4", "10.0.0.5:/x")],
        containers=[("app", "exited")],
        sight={"waitersUnknown": [target]},
    )
    b = bundle(
        the_pod=pod(volumes=[pvc_volume()], statuses=[("app", "terminated")]),
        **claimed_volume(),
        the_probe=the_probe,
    )
    facts, p = run((b, None, True))
    assert [m.waiters_unknown for m in diagnose(facts).mounts] == [True]
    assert not [s for s in p.steps if s.action in PLAIN], p
    words = {r.action: r.reason for r in p.refused}
    for action in PLAIN:
        assert words[action].startswith(f"cannot tell whether a blocked task waits on {target}")


def _check(case: Any) -> None:
    facts, p = run(case)
    d = diagnose(facts, case[1].settings if case[1] else None)
    lazy = [s for s in p.steps if s.action is Action.LAZY_UNMOUNT]
    if lazy:
        assert d.cause is Cause.HungMount
        assert not d.running_containers and not d.holders_unknown
        hung = {h.mount_point for h in d.hung_mounts}
        for s in lazy:
            assert s.target in hung
            # MNT_DETACH takes the subtree: no holder at the target or below it
            below = s.target.rstrip("/") + "/"
            assert not [
                m
                for m in d.mounts
                if (m.mount_point == s.target or m.mount_point.startswith(below)) and m.holders
            ], s
    if d.cause is Cause.HungMount:
        assert not set(p.actions) & (CHANGING_ACTIONS - {Action.LAZY_UNMOUNT}), p
        assert {Action.UNMOUNT, Action.FORCE_DELETE} <= {r.action for r in p.refused}
    if d.cause is Cause.CNITeardownFailed:
        assert not set(p.actions) & CHANGING_ACTIONS, p
        assert Action.FORCE_DELETE in {r.action for r in p.refused}
    if d.cause is Cause.FinalizerBlocked:
        allowed = case[1].finalizer_allowlist if case[1] else ()
        for s in p.steps:
            assert s.action is Action.OBSERVE or (
                s.action is Action.REMOVE_FINALIZER and s.target in allowed
            )


def test_no_lazy_unmount_of_a_hung_mount_with_a_held_mount_below_it() -> None:
    """MNT_DETACH takes the hung mount's whole subtree: a holder of a mount below it (an
    NFSv4 submount, say) holds what the step would detach — no lazy unmount planned."""
    top, nested = csi_mount_path(PV), csi_mount_path(PV) + "/nested"
    assert nested in PATHS and top in PATHS
    the_probe = probe(
        mounts=[
            mount_line(1000, top, "nfs4", "10.0.0.5:/x"),
            mount_line(1001, nested, "nfs4", "y"),
        ],
        holders=[holder(nested, 100)],
        containers=[("app", "exited")],
        sight={
            "holderScan": "complete",
            "hungMounts": [hung_mount(top, "nfs4", source="x", waiting=1)],
        },
    )
    b = bundle(the_pod=pod(statuses=[("app", "terminated")]), the_probe=the_probe)
    case = (b, parse_policy(EVERYTHING), True)
    _check(case)
    facts, p = run(case)
    assert diagnose(facts, case[1].settings).cause is Cause.HungMount
    assert Action.LAZY_UNMOUNT not in p.actions, p
