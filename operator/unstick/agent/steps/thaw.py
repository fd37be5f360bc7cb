"""The node step `thaw`: thaws one cgroup of the pod, only when the agent's own scan, right
now, finds it among this pod's frozen cgroups (the target from a Remediation is matched
against that list, never used as a path). The scan is the probe's
(agent/probe/pod_tasks.py); the result says which cgroup layout it saw (`v2`, `hybrid`,
`v1`; the systemd or cgroupfs driver's names), so the record shows what was written where.
"""

from __future__ import annotations

import os

from unstick.agent.probe.containers import pod_component, scan_cgroups
from unstick.agent.probe.pod_tasks import (
    V1,
    cgroup_dir,
    cgroup_driver,
    cgroup_layout,
    cgroup_mounts,
    frozen_cgroups,
)
from unstick.agent.steps.checks import Checks, Refused
from unstick.core.model.probe import FrozenCgroup
from unstick.core.rules.pod_tasks import is_pod_cgroup


def run(checks: Checks, uid: str, target: str, dry_run: bool) -> str:
    """Thaw one frozen cgroup of the pod, re-found by a fresh scan from the pod UID."""
    return thaw_cgroup(checks.settings.host_proc, uid, target, dry_run)


def pod_frozen_now(host_proc: str, uid: str) -> tuple[list[FrozenCgroup], str]:
    """The pod's frozen cgroups as a fresh scan finds them, and the layout it saw (e.g.
    `cgroup v2, systemd driver`). Refused if the scan is blind."""
    scan = scan_cgroups(host_proc, uid)
    if scan.gap:
        raise Refused(f"cgroup scan incomplete: {scan.gap}")
    pod, mounts = pod_component(uid), cgroup_mounts(host_proc)
    frozen, blind = frozen_cgroups(scan.members, pod, mounts)
    if blind and not frozen:
        raise Refused("; ".join(blind[:2]))
    driver = cgroup_driver(scan.members, pod)
    seen = f"cgroup {cgroup_layout(mounts)}" + (f", {driver} driver" if driver else "")
    return frozen, seen


def thaw_cgroup(host_proc: str, uid: str, target: str, dry_run: bool) -> str:
    """Thaw `target` if it is, right now, a frozen cgroup of pod `uid` (frozen itself: one
    frozen only through its parent thaws with the parent). Raises Refused otherwise."""
    if not is_pod_cgroup(target, uid):  # the planner's check, again at the act
        raise Refused(f"{target!r} is not a plain cgroup path of pod {uid}")
    frozen, seen = pod_frozen_now(host_proc, uid)
    found = next((c for c in frozen if c.path == target), None)
    if found is None:
        raise Refused(f"{target!r} is not a frozen cgroup of pod {uid} (fresh scan; {seen})")
    if found.self_frozen is False:
        raise Refused(f"{target} is frozen only through its parent: thaw the parent")
    directory = cgroup_dir(found.path, found.version, cgroup_mounts(host_proc))
    if directory is None:
        raise Refused(f"{target}: not under a cgroup mount the agent sees")
    file, value = ("freezer.state", "THAWED") if found.version == V1 else ("cgroup.freeze", "0")
    if dry_run:
        return f"would write {value} to {file} of {target} ({found.state}; {seen})"
    with open(os.path.join(directory, file), "w", encoding="ascii") as f:
        f.write(value)
    return f"wrote {value} to {file} of {target} (was {found.state}; {seen})"
