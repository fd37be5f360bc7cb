"""Property test (issue 33 finding 9): a plan never carries a changing step that depends on
a step the rules refused. A directory the probe saw non-empty — listed non-empty, or with a
mount or a volume dir of the pod at or below it — gets a planned `rmdir-stale` only when
planned steps remove everything the probe saw in it: each mount at/below it unmounted
(`unmount`, `lazy-unmount` or `replay-unpublish`), each volume dir and mount point below
it rmdir'ed. An
unmount refused (holders, a waiter the probe cannot tell, a policy without `unmount`)
leaves the dirs above it as they are, on record too (docs/diagnosis.md, "Plans").

Checked from the drawn probe, independently of the planner's own checks."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.bundles import (
    PV,
    bundle,
    csi_mount_path,
    holder,
    mount_line,
    pod,
    pod_path,
    probe,
)
from unstick.core.model.snapshot import parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Action

MOUNT = csi_mount_path(PV)  # .../volumes/kubernetes.io~csi/<pv>/mount
DIRS = [  # the pod's volume dirs, from deep to shallow, and the mounts among them
    MOUNT + "/nested",
    MOUNT,
    MOUNT.removesuffix("/mount"),
    pod_path("volumes/kubernetes.io~csi"),
    pod_path("volume-subpaths/data/app/0"),
    pod_path("volume-subpaths/data/app"),
    pod_path("volume-subpaths/data"),
    pod_path("volumes/kubernetes.io~empty-dir/cache"),
    pod_path("volumes/kubernetes.io~empty-dir"),
]
MOUNTABLE = [MOUNT + "/nested", MOUNT, pod_path("volume-subpaths/data/app/0")]
REMOVES_A_MOUNT = (Action.UNMOUNT, Action.LAZY_UNMOUNT, Action.REPLAY_UNPUBLISH)


@st.composite
def cases(draw: Any) -> tuple[dict[str, Any], Any]:
    mounted = draw(st.lists(st.sampled_from(MOUNTABLE), max_size=3, unique=True))
    held = draw(st.lists(st.sampled_from(mounted or MOUNTABLE), max_size=2))
    listed = draw(st.lists(st.sampled_from(DIRS), max_size=6, unique=True))
    the_probe = probe(
        mounts=[mount_line(1000 + i, p, "ext4") for i, p in enumerate(mounted)],
        holders=[holder(p, 100 + i) for i, p in enumerate(held)],
        dirs=[(p, draw(st.booleans())) for p in listed],
        containers=[("app", "exited")],
    )
    unsure = draw(st.lists(st.sampled_from(mounted or MOUNTABLE), max_size=1))
    if unsure:  # a blocked task whose path the probe could not read
        the_probe["waitersUnknown"] = unsure
    b = bundle(
        the_pod=pod(deletion="2026-11-20T09:00:00Z", statuses=[("app", "terminated")]),
        the_probe=the_probe,
    )
    policy = None
    if draw(st.booleans()):
        actions = ["observe", "rmdir-stale", "replay-unpublish", "unmount", "lazy-unmount"]
        policy = parse_policy({"actions": draw(st.lists(st.sampled_from(actions), unique=True))})
    return b, policy


def _below(path: str, target: str) -> bool:
    return path == target or path.startswith(target + "/")


@settings(max_examples=400, deadline=None)
@given(cases())
def test_no_planned_rmdir_of_a_dir_seen_non_empty_unless_planned_steps_empty_it(
    case: tuple[dict[str, Any], Any],
) -> None:
    b, policy = case
    facts = parse_bundle(b)
    p = plan(diagnose(facts, policy.settings if policy else None), policy)
    assert facts.probe is not None
    mounts = [m.mount_point for m in facts.probe.mounts]
    listed = {v.path: v.empty for v in facts.probe.volume_dirs}
    unmounted = {s.target for s in p.steps if s.action in REMOVES_A_MOUNT}
    rmdirs = {s.target for s in p.steps if s.action is Action.RMDIR_STALE}
    for target in rmdirs:
        inside = [m for m in mounts if _below(m, target)]
        # the dirs in it: the volume dirs and the mount points below it (a mount point
        # stays a dir once unmounted)
        dirs_inside = [d for d in {*listed, *mounts} if d != target and _below(d, target)]
        if listed.get(target) is not False and not inside and not dirs_inside:
            continue  # seen empty, or not listed: the agent's rmdir(2) decides
        left = [m for m in inside if m not in unmounted] + [
            d for d in dirs_inside if d not in rmdirs
        ]
        assert not left, (target, left, p)
        assert inside or dirs_inside, (target, "seen non-empty and nothing below removed", p)
