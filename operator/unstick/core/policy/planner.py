"""What to do about a diagnosis: design.md §3's plan per cause, filtered by safety and policy.

Order of filtering: the cause's plan → the safety invariants (same predicates the
executors re-check before acting) → the policy's permitted actions → opt-in. What is
dropped on the way is listed in `refused` with the reason. When nothing is left to do,
the plan is `observe` (observing is always permitted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from unstick.core import safety
from unstick.core.model.kubelet_paths import depth
from unstick.core.policy.remediation_policy import RemediationPolicy
from unstick.core.rules.diagnosis import Diagnosis
from unstick.core.rules.finalizer_owners import owner_gone_for
from unstick.core.rules.hung_mounts import lazy_unmount_safe, waiters_told
from unstick.core.rules.pod_tasks import thaw_safe
from unstick.core.verdict import SAFE, Verdict, refuse
from unstick.core.vocabulary import CHANGING_ACTIONS, NODE_ACTIONS, Action, Cause

NOT_OPTED_IN = "pod has not opted in"
#: steps that take a mount away (the rmdir of a dir above it may follow)
_EMPTIES_A_MOUNT = (Action.UNMOUNT, Action.LAZY_UNMOUNT, Action.REPLAY_UNPUBLISH)


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    target: str  # a mount point, a dir, a finalizer name, the node, or the pod (ns/name)
    reason: str


@dataclass(frozen=True, slots=True)
class Refusal:
    action: Action
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[Step, ...]
    refused: tuple[Refusal, ...]

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(s.action for s in self.steps)


def _order(actions: frozenset[Action]) -> list[Action]:
    return [a for a in Action if a in actions]


class _Builder:
    def __init__(
        self,
        d: Diagnosis,
        allowlist: tuple[str, ...],
        owner_gone_s: float | None = None,
        permits: Callable[[Action], bool] = lambda _: True,
    ) -> None:
        self.d = d
        self.permits = permits  # the policy's spec.actions (filtered after the cause's plan)
        self.allowlist = allowlist
        self.owner_gone_s = owner_gone_s  # spec.finalizerOwnerGoneSeconds
        self.steps: list[Step] = []
        self.refused: list[Refusal] = []

    def step(self, action: Action, target: str, reason: str) -> None:
        verdict = self._safe(action, target)
        if verdict:
            self.steps.append(Step(action, target, reason))
        else:
            self.refuse(action, verdict.reason)

    def refuse(self, action: Action, reason: str) -> None:
        if Refusal(action, reason) not in self.refused:
            self.refused.append(Refusal(action, reason))

    def refuse_all(self, actions: frozenset[Action], reason: str) -> None:
        for action in _order(actions):
            self.refuse(action, reason)

    def _safe(self, action: Action, target: str) -> Verdict:
        """The invariants, checked against what the diagnosis saw."""
        d = self.d
        if action in NODE_ACTIONS and not d.probe_fresh:
            return refuse("no fresh probe of the pod's node")  # invariant 1
        root = d.kubelet_root or ""
        if action in (Action.UNMOUNT, Action.REPLAY_UNPUBLISH):  # a plain umount
            told = waiters_told(target, d.mounts)  # (the driver's too) could hang with a waiter
            if not told:
                return told
        if action is Action.UNMOUNT:  # invariant 2
            holders = sum(len(m.holders) for m in d.mounts if m.mount_point == target)
            return safety.unmount_safe(
                target, root, d.uid, holders, containers_running=bool(d.running_containers)
            )
        if action is Action.LAZY_UNMOUNT:  # only a hung mount, unheld
            if d.cause is not Cause.HungMount:
                return refuse("lazy-unmount is only for HungMount")
            if d.holders_unknown:
                return refuse(f"cannot tell whether {target} is held: not unmounting")
            # MNT_DETACH detaches the whole subtree: holders of the mounts below count too
            subtree = target.rstrip("/") + "/"
            holders = sum(
                len(m.holders)
                for m in d.mounts
                if m.mount_point == target or m.mount_point.startswith(subtree)
            )
            return lazy_unmount_safe(
                target,
                root,
                d.uid,
                d.hung_mounts,
                holders=holders,
                containers_running=bool(d.running_containers),
            )
        if action is Action.RMDIR_STALE:
            return self._rmdir_safe(target, root)
        if action is Action.REPLAY_UNPUBLISH:
            registered = next(
                (m.driver_registered for m in d.mounts if m.mount_point == target), None
            )
            return safety.replay_unpublish_safe(target, root, d.uid, registered)
        if action is Action.THAW:  # only the pod's own frozen cgroups
            if d.cause is not Cause.ContainerFrozen:
                return refuse("thaw is only for ContainerFrozen")
            return thaw_safe(target, d.uid, d.frozen_cgroups)
        if action is Action.FORCE_DELETE:  # invariant 3
            return safety.force_delete_safe(d.cause, d.fenced, d.nothing_left, d.probe_fresh)
        if action is Action.REMOVE_FINALIZER:  # invariant 4, then its owner gone long enough
            allowed = safety.finalizer_allowed(target, self.allowlist)
            if not allowed:
                return allowed
            return owner_gone_for(target, d.finalizer_owners, self.owner_gone_s, d.now)
        return SAFE

    def _rmdir_safe(self, target: str, root: str) -> Verdict:
        """Emptiness as probed, unless the mounts and dirs the probe saw at/below it all go
        first by planned steps (permitted ones): then the agent's rmdir(2) decides (it never
        removes a non-empty dir). One of them left — its unmount or rmdir refused, or not
        permitted — and the dir is not empty: refused here, not left to the agent."""
        d = self.d

        def inside(path: str) -> bool:
            return path == target or path.startswith(target + "/")

        planned = [s for s in self.steps if self.permits(s.action)]
        unmounted = {s.target for s in planned if s.action in _EMPTIES_A_MOUNT}
        removed = {s.target for s in planned if s.action is Action.RMDIR_STALE}
        mounts = [m.mount_point for m in d.mounts if inside(m.mount_point)]
        dirs = {p for p in mounts + [v.path for v in d.volume_dirs] if p != target and inside(p)}
        left = [p for p in mounts if p not in unmounted] + sorted(dirs - removed)
        if left:
            return refuse(
                f"{target} is not empty: {left[0]} stays (its step is refused or not "
                "permitted); unstick never deletes data"
            )
        below = mounts or dirs
        listed = next((v.empty for v in d.volume_dirs if v.path == target), None)
        return safety.rmdir_safe(target, root, d.uid, None if below else listed)

    def finalizers(self) -> None:
        for name in self.d.finalizers:
            self.step(Action.REMOVE_FINALIZER, name, f"finalizer {name} keeps the pod")

    def force_delete(self, reason: str) -> None:
        self.step(Action.FORCE_DELETE, self.d.pod, reason)

    def unmount_all(self) -> None:
        for m in self.d.mounts:
            self.step(Action.UNMOUNT, m.mount_point, "orphaned mount of the pod (deepest first)")

    def running(self) -> None:
        """ContainersStillRunning, ContainerFrozen: thaw the pod's own frozen cgroups."""
        for c in self.d.frozen_cgroups:
            if c.self_frozen is False:
                continue  # thaws with its parent (one above the pod is not ours)
            self.step(Action.THAW, c.path, f"cgroup {c.path} is {c.state}: the kill waits")
        running = ", ".join(self.d.running_containers)
        self.refuse(Action.FORCE_DELETE, f"{running} still running")
        self.refuse(Action.UNMOUNT, f"{running} still running: the volumes are in use")

    def hung(self) -> None:
        """HungMount: a lazy unmount of each hung mount (where unheld), nothing plain."""
        for hung in self.d.hung_mounts:
            point = hung.mount_point
            self.step(Action.LAZY_UNMOUNT, point, f"{point} hangs on its server")
        self.refuse(
            Action.UNMOUNT,
            "a plain umount of a hung mount can wait for ever on its server: lazy only",
        )
        self.refuse(Action.FORCE_DELETE, "the pod's hung mounts are not gone yet")

    def csi_driver_missing(self) -> None:
        """Unmount and remove the empty dirs (the agent keeps the kubelet's vol_data.json);
        once nothing is mounted, nothing more: the kubelet still holds the volume."""
        d = self.d
        if not d.mounts:  # only the kubelet's vol_data.json is left (docs/csi.md)
            why = (
                "the kubelet still holds the pod's CSI volume (its vol_data.json is kept for "
                "it): it removes the dirs and the pod itself once the driver is back"
            )
            self.refuse(Action.RMDIR_STALE, why)
            self.refuse(Action.FORCE_DELETE, why)
            self.refuse(Action.REPLAY_UNPUBLISH, "nothing is mounted and no driver to call")
            return
        self.unmount_all()
        self.rmdir_all()
        missing = sorted(
            {m.csi_driver for m in d.mounts if m.csi_driver and m.driver_registered is False}
        )
        self.refuse(
            Action.REPLAY_UNPUBLISH,
            f"CSI driver {', '.join(missing)} is not registered on the node: no driver to call",
        )
        self.refuse(Action.FORCE_DELETE, "the pod's mounts are not gone yet")

    def rmdir_all(self) -> None:
        paths = {m.mount_point for m in self.d.mounts} | {v.path for v in self.d.volume_dirs}
        for path in sorted(paths, key=lambda p: (-depth(p), p)):
            self.step(Action.RMDIR_STALE, path, "the pod's volume dir, removed only if empty")


def _cause_plan(b: _Builder) -> None:
    d = b.d
    node_actions = NODE_ACTIONS
    changing = CHANGING_ACTIONS
    match d.cause:
        case Cause.NotStuck:
            b.refuse_all(changing, "pod is not stuck")
        case Cause.FinalizerBlocked:
            b.finalizers()
            b.refuse(
                Action.FORCE_DELETE,
                "only finalizers keep the pod: a force-delete would change nothing",
            )
        case Cause.NodeGone:
            b.force_delete(f"node {d.node} does not exist; nothing can run the pod any more")
            b.finalizers()
            b.refuse_all(node_actions, f"node {d.node} does not exist: no agent there")
        case Cause.NodeUnreachable if d.fenced:
            by = ", ".join(d.fenced_by) or "out-of-service taint"
            b.force_delete(f"node {d.node} is unreachable and fenced ({by})")
            b.refuse_all(node_actions, f"node {d.node} is unreachable: its agent cannot act")
        case Cause.NodeUnreachable:
            b.refuse(
                Action.FORCE_DELETE,
                f"node {d.node} is not fenced: the pod may still run there (split-brain risk); "
                "taint it node.kubernetes.io/out-of-service once it is known to be down",
            )
            b.refuse_all(node_actions, f"node {d.node} is unreachable: its agent cannot act")
        case Cause.ContainersStillRunning | Cause.ContainerFrozen:  # frozen: running, unkillable
            b.running()
        case Cause.HungMount:
            b.hung()
        case Cause.CNITeardownFailed:
            b.refuse(
                Action.FORCE_DELETE,
                "the pod's network is not torn down: a force-delete would leave its IP and "
                "sandbox behind; the kubelet retries the teardown once the CNI plugin works",
            )
            b.refuse_all(node_actions, "the kubelet tears the volumes down after the sandbox")
        case Cause.MountBusy:
            for m in d.mounts:
                for h in m.holders:
                    b.refuse(Action.UNMOUNT, f"{m.mount_point} is held by pid {h.pid} ({h.comm})")
            b.refuse(Action.FORCE_DELETE, "mounts of the pod are still in use")
        case Cause.CSIDriverMissing:
            b.csi_driver_missing()
        case Cause.OrphanedMount:
            for m in d.mounts:
                if m.replayable:
                    b.step(
                        Action.REPLAY_UNPUBLISH,
                        m.mount_point,
                        f"ask CSI driver {m.csi_driver} to NodeUnpublish, as the kubelet would",
                    )
            b.unmount_all()
            b.rmdir_all()
            b.refuse(Action.FORCE_DELETE, "the pod's mounts are not gone yet")
        case Cause.StaleVolumeDirs:
            b.rmdir_all()
            b.refuse(Action.FORCE_DELETE, "the pod's volume dirs remain on the node")
        case Cause.KubeletNotProgressing:
            b.force_delete("a fresh probe shows nothing of the pod left on the node")
            if d.node:
                b.step(Action.RESTART_KUBELET, d.node, "the kubelet is not finishing the pod")
        case _:
            b.refuse_all(changing, "the cause is unknown: nothing that changes state is safe")


def plan(diagnosis: Diagnosis, policy: RemediationPolicy | None, opted_in: bool = True) -> Plan:
    """The plan for a diagnosis. policy None = every action permitted (what
    `unstick diagnose` shows without --policy); the finalizer allowlist is then empty."""
    b = _Builder(
        diagnosis,
        policy.finalizer_allowlist if policy else (),
        policy.finalizer_owner_gone_seconds if policy else None,
        policy.permits if policy else (lambda _: True),
    )
    _cause_plan(b)
    steps = b.steps
    if policy is not None:
        for s in steps:
            if not policy.permits(s.action):
                b.refuse(s.action, f"not permitted by policy {policy.name} (spec.actions)")
        steps = [s for s in steps if policy.permits(s.action)]
    if not opted_in:
        for s in steps:
            if s.action in CHANGING_ACTIONS:
                b.refuse(s.action, NOT_OPTED_IN)
        steps = [s for s in steps if s.action not in CHANGING_ACTIONS]
    if not steps and diagnosis.cause is not Cause.NotStuck:
        steps = [Step(Action.OBSERVE, diagnosis.pod, f"stuck: {diagnosis.cause}")]
    return Plan(steps=tuple(steps), refused=tuple(b.refused))
