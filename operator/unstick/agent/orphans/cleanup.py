"""Orphaned pod directories (design.md §9): `<kubeletRoot>/pods/<uid>` of no pod in the API.

One pass (`OrphanPass.run`, from the agent's summary thread):
1. a fresh LIST of this node's pods (field selector `spec.nodeName`) — never a cache; if it
   fails, nothing is an orphan this pass;
2. the pod dirs whose UID is not in that list (a mirror pod's config hash counts as the
   static pod's UID) are orphans once they are older than `ORPHAN_MIN_AGE_S` AND this
   agent has seen them without their pod for that long (`OrphanPass.seen`, in memory: a
   restarted agent waits again). The dir's own age says nothing about when its pod left
   the API — a long-lived pod force-deleted now has an old dir, and the kubelet is tearing
   it down right then;
3. each is inspected: its volume/subpath mounts (from the mount table, never a stat of a
   mount point), their holders (a complete scan, or "held: cannot tell"), and the files
   left in it (walked with lstat, never following symlinks, never crossing a mount point);
4. with the `default` RemediationPolicy's `orphanedPodDirs: clean` (read from the API right
   before acting), not held, a second fresh LIST still not showing the UID, and no
   container of the pod running (the executor's own runtime/cgroup check,
   `containers.still_running`, before any step and again right before the last rmdirs; a
   runtime that cannot tell means no action), the same node steps as for a stuck pod run
   through the executor with its re-checks — replay-unpublish (CSI mount, driver
   registered), unmount (no holders), rmdir-stale (empty volume dirs) — and then empty
   directories of the pod dir are removed bottom-up, each through its parent's directory
   fd (`safepath.rmdir_at`: never through a symlink, even one swapped in after listing).
   A file is never removed, nothing is removed recursively: a dir with data stays and is
   reported with its size and paths. Each dir cleaned is one action of this node's budget
   (`authority.NodeBudget`), taken only when there is an act to do (a mount, or an empty
   directory to remove), and the orphan pass takes at most half of it (`ORPHAN_SHARE`):
   the rest is the stuck pods'. A dir that one clean left as it was (its directories and
   mounts: `tree_state`) — data only, a directory that cannot be removed, a refused
   unmount — is not cleaned again until it changes (or `RELOOK_S` passed): its report
   keeps the words of that clean.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from unstick.agent.authority.rederive import NodeBudget
from unstick.agent.holders.scan import scan_holders
from unstick.agent.probe.containers import still_running
from unstick.agent.probe.mount_file import MountTable, read_mount_table
from unstick.agent.probe.plugins import registered_plugins
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.checks import Refused
from unstick.agent.steps.executor import DRY_RUN, FAILED, REFUSED, Executor
from unstick.agent.steps.safepath import UnsafePath, rmdir_at
from unstick.core.model.kubelet_paths import classify, normalise, pod_dir
from unstick.core.model.mountinfo import Mount
from unstick.core.policy.ratelimit import Grant, SlidingWindow
from unstick.core.policy.remediation_policy import (
    DEFAULT_POLICY,
    PolicyError,
    RemediationPolicy,
    parse_policy,
)
from unstick.core.rules.aftermath import (
    ORPHAN_MIN_AGE_S,
    OrphanDir,
    live_pod_uids,
    orphan_steps,
    orphan_uids,
)
from unstick.core.vocabulary import Refusal

log = logging.getLogger(__name__)

JSON = dict[str, object]
MAX_FILES = 10_000  # files looked at per orphaned dir (a report, not an inventory)
ORPHAN_SHARE = 2  # the orphan pass takes at most 1/ORPHAN_SHARE of the node's budget
RELOOK_S = 600.0  # a dir a clean left unchanged is cleaned again once it changes, or then
NOTHING_TO_DO = (
    "not cleaned: nothing to do (no mount, no empty directory; files are never removed); "
    "looked at again when the directory changes"
)


def pod_dir_ages(kubelet_root: str, now: float) -> dict[str, float]:
    """uid → age in seconds of each directory in `<root>/pods/` (the younger of mtime and
    ctime: a dir just written to is young). Symlinks are not dirs here."""
    out: dict[str, float] = {}
    try:
        with os.scandir(os.path.join(kubelet_root, "pods")) as entries:
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    out[e.name] = now - max(st.st_mtime, st.st_ctime)
    except OSError as exc:
        log.warning("cannot list %s/pods: %s", kubelet_root, exc)
    return out


def files_left(top: str, mount_points: frozenset[str]) -> list[tuple[str, int]]:
    """Every non-directory under `top` (path, bytes), walked with lstat only: symlinks are
    reported, never followed; a mount point is neither entered nor stat'ed."""
    found: list[tuple[str, int]] = []
    stack = [top]
    while stack and len(found) < MAX_FILES:
        path = stack.pop()
        try:
            with os.scandir(path) as entries:
                for e in entries:
                    if e.path in mount_points:
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
                    else:
                        found.append((e.path, st.st_size if stat.S_ISREG(st.st_mode) else 0))
        except OSError:
            continue
    return sorted(found)


@dataclass(frozen=True)
class TreeState:
    """What a clean of a pod dir could change: its directories (path, inode, mtime — a
    directory's mtime changes with every entry added or removed in it) and the mount points
    under it; `has_empty`: some directory in it is empty (an rmdir to do)."""

    fingerprint: frozenset[tuple[str, int, int]]
    has_empty: bool


def tree_state(top: str, mount_points: frozenset[str]) -> TreeState:
    """The `TreeState` of `top`, walked with lstat (no symlink followed, no mount point
    entered)."""
    seen = {(p, 0, 0) for p in mount_points if p.startswith(top.rstrip("/") + "/")}
    has_empty = False
    stack = [top]
    while stack:
        path = stack.pop()
        try:
            st = os.lstat(path)
            with os.scandir(path) as it:
                entries = list(it)
        except OSError:
            continue
        seen.add((path, st.st_ino, st.st_mtime_ns))
        has_empty = has_empty or not entries
        for e in entries:
            if e.path not in mount_points and e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return TreeState(frozenset(seen), has_empty)


def _dirs_below(top: str, mount_points: frozenset[str]) -> list[str]:
    """`top` and every directory under it (lstat: symlinks are not entered), no mount point
    entered."""
    dirs: list[str] = []
    stack = [top]
    while stack:
        path = stack.pop()
        dirs.append(path)
        try:
            with os.scandir(path) as entries:
                stack.extend(
                    e.path
                    for e in entries
                    if e.path not in mount_points and e.is_dir(follow_symlinks=False)
                )
        except OSError:
            continue
    return dirs


def rmdir_empty_tree(
    top: str, mount_points: frozenset[str], after_listing: Callable[[], None] | None = None
) -> tuple[int, list[str]]:
    """Remove the empty directories under and including `top`, deepest first: rmdir only
    (a directory with anything in it stays), never a mount point or a directory containing
    one, and each through its parent's directory fd (`safepath.rmdir_at`: every component
    opened with O_NOFOLLOW, so a parent swapped for a symlink after the listing is not
    followed). `after_listing` runs between the listing and the first removal (tests).
    Returns (removed, kept)."""
    dirs = _dirs_below(top, mount_points)
    if after_listing is not None:
        after_listing()
    removed, kept = 0, []
    for path in sorted(dirs, key=lambda p: -p.count("/")):
        if path in mount_points or any(m.startswith(path + "/") for m in mount_points):
            kept.append(path)
            continue
        try:
            gone = rmdir_at(path)
        except UnsafePath as exc:
            log.warning("not removing %s: %s", path, exc)
            gone = False
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.warning("rmdir %s: %s", path, exc)
            gone = False
        if gone:
            removed += 1
        else:
            kept.append(path)
    return removed, kept


@dataclass
class OrphanPass:
    """Finds, reports and (when the `default` policy says `clean`) cleans orphaned dirs."""

    settings: AgentSettings
    executor: Executor
    list_pods: Callable[[], list[dict[str, object]]]  # fresh LIST of this node's pods
    get_policy: Callable[[str], dict[str, object] | None]  # GET a RemediationPolicy
    budget: NodeBudget
    on_refusal: Callable[[Refusal], None] = lambda _r: None
    clock: Callable[[], float] = time.time
    min_age_s: float = ORPHAN_MIN_AGE_S
    mode: str = field(default="observe", init=False)  # the policy's word, last pass
    # the orphan pass's own grants of the node budget (its share: ORPHAN_SHARE)
    grants: SlidingWindow = field(default_factory=SlidingWindow, init=False)
    # uid -> (the dir's state after a clean that changed nothing, when, that clean's words)
    idle: dict[str, tuple[TreeState, float, str]] = field(default_factory=dict, init=False)
    # uid -> when this agent first saw the dir without its pod in a fresh list (forgotten
    # when the pod is listed again or the dir goes)
    seen: dict[str, float] = field(default_factory=dict, init=False)

    @property
    def root(self) -> str:
        return normalise(self.settings.kubelet_root) or self.settings.kubelet_root

    def _live(self) -> set[str] | None:
        try:
            return live_pod_uids(self.list_pods())
        except Exception as exc:  # no fresh list: nothing is an orphan
            log.warning("cannot list this node's pods: %s", exc)
            return None

    def find(self) -> tuple[dict[str, float], tuple[str, ...] | None]:
        """(ages of all pod dirs, the orphaned UIDs or None when the pods are unknown). The
        age of a dir without its pod is the younger of the dir's own and the time since
        this agent first saw it so (`seen`)."""
        now = self.clock()
        ages = pod_dir_ages(self.root, now)
        live = self._live()
        if live is None:
            return ages, None
        podless = orphan_uids(ages, live, -float("inf"))
        self.seen = {uid: self.seen.get(uid, now) for uid in podless}
        for uid in podless:
            ages[uid] = min(ages[uid], now - self.seen[uid])
        return ages, orphan_uids(ages, live, self.min_age_s)

    def inspect(self, uid: str, age_s: float, table: MountTable) -> OrphanDir:
        """What is left in the orphaned dir of `uid`, from the mount table and lstat."""
        top = pod_dir(self.root, uid)
        mounts = table.pod_mounts(self.root, uid)
        points = tuple(dict.fromkeys(m.mount_point for m in mounts))
        held: tuple[str, ...] = ()
        if mounts:
            scan = scan_holders(self.settings.host_proc, mounts, kubelet_root=self.root)
            held = tuple(
                f"{h.mount_point}: pid {h.pid} ({h.comm}) via {h.via}" for h in scan.holders
            )
            if scan.unknown and not held:
                held = (f"cannot tell who holds the mounts: {scan.unknown}"[:300],)
        under = frozenset(p for p in table.mount_points() if p == top or p.startswith(top + "/"))
        data = files_left(top, under)
        return OrphanDir(
            uid=uid,
            path=top,
            age_s=age_s,
            mounts=points,
            held=held,
            data=tuple(data),
            data_bytes=sum(b for _, b in data),
        )

    def policy(self) -> tuple[RemediationPolicy | None, str]:
        """The `default` RemediationPolicy from the API, or why there is none to use."""
        try:
            obj = self.get_policy(DEFAULT_POLICY)
        except Exception as exc:
            return None, f"cannot GET RemediationPolicy {DEFAULT_POLICY!r}: {exc}"
        if obj is None:
            return None, f"no RemediationPolicy {DEFAULT_POLICY!r}"
        try:
            return parse_policy(obj), ""
        except PolicyError as exc:
            return None, f"RemediationPolicy {DEFAULT_POLICY!r} is invalid: {exc}"

    def run(self) -> list[OrphanDir] | None:
        """One pass; None when the pod list could not be read (nothing known)."""
        ages, uids = self.find()
        if uids is None:
            return None
        table = read_mount_table(self.settings.mountinfo)
        found = [self.inspect(uid, ages[uid], table) for uid in uids]
        self.idle = {uid: v for uid, v in self.idle.items() if uid in uids}
        if not found:
            return found
        policy, why = self.policy()
        self.mode = policy.orphaned_pod_dirs if policy is not None else "observe"
        if policy is None or policy.orphaned_pod_dirs != "clean":
            if why:
                log.info("orphaned pod dirs: observing only (%s)", why)
            return found
        return [self.clean(d, policy) if d.state != "held" else d for d in found]

    def clean(self, d: OrphanDir, policy: RemediationPolicy) -> OrphanDir:
        """The safe steps for one orphaned dir, when there is one to do; the report of what
        is left afterwards. A dir the last clean left as it was is skipped until it
        changes (or RELOOK_S passed), with that clean's words."""
        before = tree_state(d.path, self._table_points())
        idle = self.idle.get(d.uid)
        if idle is not None and idle[0] == before and self.clock() - idle[1] < RELOOK_S:
            return replace(d, result=idle[2])
        if not d.mounts and not before.has_empty:  # no act to do: no budget taken
            self.idle[d.uid] = (before, self.clock(), NOTHING_TO_DO)
            return replace(d, result=NOTHING_TO_DO)
        self.idle.pop(d.uid, None)
        done = self._clean(d, policy)
        if done.result.startswith("not cleaned") or done.result.startswith("rate limit"):
            return done  # nothing was tried: looked at again next pass
        if os.path.lexists(d.path) and tree_state(d.path, self._table_points()) == before:
            self.idle[d.uid] = (before, self.clock(), done.result)
        return done

    def _take_budget(self, policy: RemediationPolicy) -> str:
        """'' when this dir may take one action of the node's budget (recorded), else why
        not: the orphan pass's share (at most 1/ORPHAN_SHARE of the strictest limit in
        force, rounded down) is used up, or the node's budget is."""
        now, limit = self.clock(), policy.rate_limits.node_per_minute
        share = min(limit, self.budget.cap) // ORPHAN_SHARE
        if share == 0 or self.grants.wait_s(now, share) > 0:
            return (
                f"rate limit: the orphan pass's share of this node's budget ({share} per "
                f"minute: half of {min(limit, self.budget.cap)}, the rest is the stuck pods') "
                "is used up"
            )
        wait = self.budget.try_take(now, limit)
        if wait > 0:
            return f"rate limit: this node's budget is used up for {wait:.0f}s"
        self.grants.add(Grant(now, share))
        return ""

    def _clean(self, d: OrphanDir, policy: RemediationPolicy) -> OrphanDir:
        live = self._live()  # right before acting: the pod may exist after all
        if live is None or d.uid in live:
            return replace(d, result="not cleaned: the pod list does not prove it gone")
        running = self._running(d.uid)  # never touch a pod whose containers run
        if running:
            self.on_refusal(Refusal.UNSAFE)
            return replace(d, result=f"not cleaned: {running}")
        table = read_mount_table(self.settings.mountinfo)
        steps = orphan_steps(self._replayable(d.uid, table), bool(d.mounts))
        refused = [a for a in steps if not policy.permits(a)]
        if refused:
            self.on_refusal(Refusal.POLICY_FORBIDS)
            names = ", ".join(str(a) for a in refused)
            return replace(d, result=f"not cleaned: policy {policy.name!r} does not permit {names}")
        if not policy.dry_run:
            busy = self._take_budget(policy)
            if busy:
                self.on_refusal(Refusal.POLICY_FORBIDS)
                return replace(d, result=busy)
        results = []
        for action in steps:
            r = self.executor.run_step(
                d.uid, str(action), "", dry_run=policy.dry_run, lazy_unmount=policy.lazy_unmount
            )
            results.append(f"{r.action} {r.result}")
            if r.result == REFUSED:
                self.on_refusal(Refusal.UNSAFE)
            if r.result in (REFUSED, FAILED):
                results[-1] += f" ({r.message[:200]})"
                break
        else:
            if r.result == DRY_RUN:
                self.on_refusal(Refusal.DRY_RUN)
            elif running := self._running(d.uid):  # re-checked right before the rmdirs
                self.on_refusal(Refusal.UNSAFE)
                results.append(f"empty dirs not removed: {running}")
            else:
                removed, _kept = rmdir_empty_tree(d.path, self._table_points())
                results.append(f"{removed} empty dir(s) removed")
        after = self._after(d)
        log.info("orphaned pod dir %s: %s", d.path, "; ".join(results))
        return replace(after, result="; ".join(results))

    def _after(self, d: OrphanDir) -> OrphanDir:
        if not os.path.lexists(d.path):
            return replace(d, mounts=(), held=(), data=(), data_bytes=0)
        return self.inspect(d.uid, d.age_s, read_mount_table(self.settings.mountinfo))

    def _running(self, uid: str) -> str | None:
        """Why the pod's paths may not be touched (a container of it runs, or the runtime
        cannot tell), by the same check as every node step; None when none runs."""
        s = self.settings
        return still_running(s.host_proc, uid, s.cri_socket, s.grpc_timeout_s)

    def _table_points(self) -> frozenset[str]:
        return read_mount_table(self.settings.mountinfo).mount_points()

    def _replayable(self, uid: str, table: MountTable) -> bool:
        """A CSI volume of the dir is mounted and its driver is registered here."""
        csi = [m for m in table.pod_mounts(self.root, uid) if _csi_mount(m, self.root, uid)]
        if not csi:
            return False
        plugins = registered_plugins(self.settings.registry_dir, self.settings.grpc_timeout_s)
        read_vol_data = self.executor.checks.read_vol_data
        for m in csi:
            try:
                driver = read_vol_data(os.path.dirname(m.mount_point))["driverName"]
            except Refused:
                return False
            if driver not in plugins:
                return False
        return True


def _csi_mount(m: Mount, root: str, uid: str) -> bool:
    c = classify(m.mount_point, root, uid)
    return bool(c and c.csi_volume and c.rest == "mount")
