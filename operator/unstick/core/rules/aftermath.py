"""What a stuck pod leaves behind and what it blocks (design.md §9), decided without I/O.

- **Orphaned pod directories**: `<kubeletRoot>/pods/<uid>` whose UID is no pod of the
  node in the API (a fresh LIST; a static pod counts by its mirror pod's
  `kubernetes.io/config.mirror` hash), older than `ORPHAN_MIN_AGE_S`.
- **Blocked replacements**: a pod that cannot attach or mount a ReadWriteOnce(Pod) volume
  because a Terminating pod (or a VolumeAttachment on another node) still holds it.
- **Blocked namespaces**: a Terminating namespace whose remaining pods are stuck.

Only facts and words live here; the agent and the controller do the reading and writing.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from unstick.core import fields as f
from unstick.core.remediation import REMEDIATE
from unstick.core.vocabulary import Action

JSON = dict[str, Any]

#: A pod dir younger than this is never an orphan: the API may not show a pod created
#: seconds ago yet, and the kubelet needs a while to tear down a pod deleted just now.
ORPHAN_MIN_AGE_S = 300.0
#: The attach/detach controller force-detaches after this long (maxWaitForUnmountDuration).
FORCE_DETACH_AFTER = "6 min"
FENCING_TAINT = "node.kubernetes.io/out-of-service"
MIRROR_ANNOTATIONS = ("kubernetes.io/config.mirror", "kubernetes.io/config.hash")
EXCLUSIVE_MODES = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})
_UID = re.compile(r"^[0-9a-zA-Z][-0-9a-zA-Z_.]{0,127}$")


# --- orphaned pod directories -----------------------------------------------------------


def live_pod_uids(pods: Iterable[JSON]) -> set[str]:
    """UIDs the kubelet may use for these pods' dirs: each pod's uid, and for a mirror pod
    the static pod's UID (its config hash)."""
    out: set[str] = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        if isinstance(meta.get("uid"), str):
            out.add(meta["uid"])
        annotations = meta.get("annotations") or {}
        out.update(v for k in MIRROR_ANNOTATIONS if isinstance(v := annotations.get(k), str))
    return out


def is_pod_dir_name(name: str) -> bool:
    """A directory name the kubelet could have made for a pod (one path component)."""
    return bool(_UID.match(name)) and name not in (".", "..")


def orphan_uids(
    ages: Mapping[str, float], live: Collection[str] | None, min_age_s: float = ORPHAN_MIN_AGE_S
) -> tuple[str, ...]:
    """The pod dirs (uid → age in seconds) that are orphans. `live` None (the pod list
    could not be read) knows none: nothing is an orphan without a fresh list."""
    if live is None:
        return ()
    return tuple(
        sorted(
            uid
            for uid, age in ages.items()
            if is_pod_dir_name(uid) and uid not in live and age >= min_age_s
        )
    )


@dataclass(frozen=True, slots=True)
class OrphanDir:
    """One orphaned pod dir as reported (Node Event annotation, `unstick status`)."""

    uid: str
    path: str
    age_s: float
    mounts: tuple[str, ...] = ()  # volume/subpath mount points still mounted
    held: tuple[str, ...] = ()  # "mount: pid N (comm) via fd", from a complete scan
    data: tuple[tuple[str, int], ...] = ()  # files kept (path, bytes), never removed
    data_bytes: int = 0
    result: str = ""  # what the clean pass did: "" (observe), or its words

    @property
    def state(self) -> str:
        if self.held:
            return "held"
        if self.mounts:
            return "mounted"
        return "data" if self.data else "empty"

    def to_json(self) -> JSON:
        return {
            "uid": self.uid,
            "path": self.path,
            "ageSeconds": round(self.age_s),
            "state": self.state,
            "mounts": list(self.mounts),
            "held": list(self.held),
            "files": [{"path": p, "bytes": b} for p, b in self.data[:20]],
            "fileCount": len(self.data),
            "bytes": self.data_bytes,
            "result": self.result,
        }


def orphan_steps(csi_replayable: bool, mounted: bool) -> tuple[Action, ...]:
    """The safe steps for an orphaned dir, in order (as for a stuck pod's OrphanedMount /
    CSIDriverMissing / StaleVolumeDirs): replay NodeUnpublish only for a CSI mount whose
    driver is registered, unmount what is still mounted, then rmdir of empty dirs."""
    steps: list[Action] = []
    if csi_replayable:
        steps.append(Action.REPLAY_UNPUBLISH)
    if mounted:
        steps.append(Action.UNMOUNT)
    steps.append(Action.RMDIR_STALE)
    return tuple(steps)


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def describe_orphan(d: OrphanDir) -> str:
    parts = [f"{d.path} ({d.state}, {round(d.age_s / 60)} min old"]
    if d.held:
        parts.append(f"; held: {', '.join(d.held[:2])}")
    elif d.mounts:
        parts.append(f"; {len(d.mounts)} mount(s): {', '.join(d.mounts[:2])}")
    if d.data:
        first = d.data[0][0]
        parts.append(f"; {len(d.data)} file(s), {human_bytes(d.data_bytes)} kept, e.g. {first}")
    if d.result:
        parts.append(f"; {d.result}")
    return "".join(parts) + ")"


def orphan_event_message(dirs: Sequence[OrphanDir], mode: str) -> str:
    """The Node Event's message (at most 1000 characters are posted)."""
    if not dirs:
        return "no orphaned pod directories left on this node"
    head = (
        f"{len(dirs)} orphaned pod director{'y' if len(dirs) == 1 else 'ies'} "
        f"(no pod with that UID in the API; orphanedPodDirs: {mode}): "
    )
    return head + "; ".join(describe_orphan(d) for d in dirs[:5])


# --- blocked replacements ---------------------------------------------------------------

ATTACH_REASONS = ("FailedAttachVolume", "FailedMount")


@dataclass(frozen=True, slots=True)
class Claim:
    """A PersistentVolumeClaim as the linking reads it."""

    namespace: str
    name: str
    volume: str  # bound PV name, "" when unbound
    modes: frozenset[str] = frozenset()

    @property
    def exclusive(self) -> bool:
        """ReadWriteOnce(Pod), or not known to be shareable."""
        return not self.modes or bool(self.modes & EXCLUSIVE_MODES)


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod as the linking reads it (waiting or holding)."""

    namespace: str
    name: str
    uid: str
    node: str
    claims: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class HolderState:
    """What is known of a holder: its cause and plan (from its Remediation) and whether
    its node is fenced."""

    cause: str = ""
    plan: tuple[str, ...] = ()
    opted_in: bool = False
    fenced: bool = False


@dataclass(frozen=True, slots=True)
class Block:
    """`waiter` cannot get `claim`'s volume: held by `holder` (a Terminating pod) and/or
    attached on `attached_node` (a VolumeAttachment of another node)."""

    waiter: PodRef
    claim: Claim
    holder: PodRef | None = None
    attached_node: str = ""
    reasons: tuple[str, ...] = field(default=())

    @property
    def blocker_node(self) -> str:
        return self.holder.node if self.holder is not None else self.attached_node


def find_blocks(
    waiter: PodRef,
    claims: Mapping[tuple[str, str], Claim],
    terminating: Iterable[PodRef],
    attachments: Mapping[str, Collection[str]],
) -> tuple[Block, ...]:
    """The blocks of `waiter`: for each of its exclusive claims, a Terminating pod using the
    same claim (another pod; on another node for ReadWriteOnce, anywhere for
    ReadWriteOncePod), else a VolumeAttachment of the claim's PV on another node.
    `attachments`: PV name → nodes it is attached to."""
    holders = [p for p in terminating if p.uid != waiter.uid and p.namespace == waiter.namespace]
    blocks: list[Block] = []
    for claim_name in waiter.claims:
        claim = claims.get((waiter.namespace, claim_name))
        if claim is None or not claim.exclusive:
            continue
        pod_only = claim.modes == frozenset({"ReadWriteOncePod"})
        elsewhere = sorted(n for n in attachments.get(claim.volume, ()) if n != waiter.node)
        for holder in holders:
            if claim_name in holder.claims and (pod_only or holder.node != waiter.node):
                attached = holder.node if holder.node in elsewhere else ""
                blocks.append(Block(waiter, claim, holder, attached))
                break
        else:
            if elsewhere:
                blocks.append(Block(waiter, claim, None, elsewhere[0]))
    return tuple(blocks)


def freed_by(block: Block, state: HolderState | None) -> str:
    """What will free the volume, in words (never a detach by unstick)."""
    node = block.blocker_node
    if block.holder is None:
        return (
            f"it is freed when the attach/detach controller detaches it from {node} (after the "
            f"pod there is gone; force-detach after {FORCE_DETACH_AFTER} if {node} is down), or "
            f"when {node} is fenced ({FENCING_TAINT}); unstick never detaches"
        )
    st = state or HolderState()
    if st.cause in ("NodeUnreachable", "NodeGone") and not st.fenced:
        return (
            f"it is freed when {node} is fenced ({FENCING_TAINT}) or by the attach/detach "
            f"controller's force-detach after {FORCE_DETACH_AFTER}"
        )
    plan = ", ".join(a for a in st.plan if a != "observe")
    if plan and st.opted_in:
        return f"it is freed when {block.holder.key} is gone: unstick's plan is {plan}"
    if plan:
        return (
            f"it is freed when {block.holder.key} is gone: unstick would {plan} but the pod "
            f"has not opted in ({REMEDIATE})"
        )
    return f"it is freed when {block.holder.key} is gone; unstick can only observe it"


def block_message(block: Block, state: HolderState | None) -> str:
    """The Event on the waiting pod."""
    vol = f"volume pvc/{block.claim.name}"
    if block.holder is not None:
        st = state or HolderState()
        cause = st.cause or "stuck"
        fence = ""
        if st.cause in ("NodeUnreachable", "NodeGone"):
            fence = ", fenced" if st.fenced else ", not fenced"
        held = (
            f"{vol} is held by {block.holder.key}, stuck Terminating on {block.holder.node} "
            f"({cause}{fence})"
        )
    else:
        held = f"{vol} (PV {block.claim.volume}) is still attached to node {block.attached_node}"
    return f"{held}: {freed_by(block, state)}"


def waiter_entry(block: Block, since: str, waited_s: float) -> JSON:
    """One entry of the holder's `status.waiters`."""
    return {
        "pod": block.waiter.key,
        "uid": block.waiter.uid,
        "node": block.waiter.node,
        "claim": block.claim.name,
        "since": since,
        "waitedSeconds": round(max(0.0, waited_s)),
        "reasons": list(block.reasons),
    }


# --- blocked namespaces -----------------------------------------------------------------


def namespace_message(namespace: str, stuck: Sequence[tuple[str, str]]) -> str:
    """The Event on a Terminating namespace whose deletion waits on stuck pods."""
    names = ", ".join(f"{name} ({cause})" for name, cause in sorted(stuck)[:10])
    more = f" and {len(stuck) - 10} more" if len(stuck) > 10 else ""
    return (
        f"namespace {namespace} is Terminating and its deletion waits on "
        f"{len(stuck)} stuck pod(s): {names}{more}"
    )


# --- the snapshot bundle's aftermath (docs/aftermath.md) --------------------------------


def _objects(value: object, where: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise f.FieldError(where, "must be a list of objects")
    return list(value)


def bundle_aftermath(bundle: object) -> JSON:
    """The aftermath facts of a snapshot bundle, checked: who waits on the pod
    (`aftermath.waiters`), the pod's volumes attached on other nodes
    (`aftermath.volumeAttachments`, and any in `volumeAttachments`), its namespace
    Terminating (`namespace`), the orphaned pod dirs of its node
    (`aftermath.orphanedPodDirs`). Every key is optional (older bundles have none).
    Raises FieldError naming the field."""
    top = bundle if isinstance(bundle, dict) else {}
    raw_pod = top.get("pod")
    pod: Mapping[str, Any] = raw_pod if isinstance(raw_pod, dict) else {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    after = top.get("aftermath")
    if after is not None and not isinstance(after, dict):
        raise f.FieldError("aftermath", "must be an object")
    after = after or {}
    waiters = _objects(after.get("waiters"), "aftermath.waiters")
    orphans = _objects(after.get("orphanedPodDirs"), "aftermath.orphanedPodDirs")
    elsewhere = []
    attachments = [
        (f"volumeAttachments[{i}]", va)
        for i, va in enumerate(_objects(top.get("volumeAttachments"), "volumeAttachments"))
    ] + [
        (f"aftermath.volumeAttachments[{i}]", va)
        for i, va in enumerate(
            _objects(after.get("volumeAttachments"), "aftermath.volumeAttachments")
        )
    ]
    for where, va in attachments:
        spec = va.get("spec") or {}
        if not isinstance(spec, dict):
            raise f.FieldError(f"{where}.spec", "must be an object")
        if spec.get("nodeName") and spec.get("nodeName") != node:
            pv = (spec.get("source") or {}).get("persistentVolumeName")
            elsewhere.append({"persistentVolume": pv, "node": spec.get("nodeName")})
    ns = top.get("namespace")
    if ns is not None and not isinstance(ns, dict):
        raise f.FieldError("namespace", "must be a Namespace object or null")
    terminating = ((ns or {}).get("status") or {}).get("phase") == "Terminating"
    return {
        "waiters": [
            {k: w.get(k) for k in ("pod", "claim", "since", "until", "waitedSeconds")}
            for w in waiters
        ],
        "attachedElsewhere": elsewhere,
        "namespaceTerminating": terminating,
        "orphanedPodDirs": [
            {k: d.get(k) for k in ("path", "state", "bytes", "fileCount")} for d in orphans
        ],
    }


def aftermath_lines(summary: Mapping[str, Any]) -> list[str]:
    """The aftermath for people (empty when there is nothing to say)."""
    lines = []
    for w in summary.get("waiters") or []:
        state = f"waited until {w['until']}" if w.get("until") else "waiting"
        lines.append(
            f"blocks {w.get('pod')} (pvc/{w.get('claim')}, {state}, {w.get('waitedSeconds')}s)"
        )
    for a in summary.get("attachedElsewhere") or []:
        lines.append(f"volume {a.get('persistentVolume')} is attached to node {a.get('node')}")
    if summary.get("namespaceTerminating"):
        lines.append("its namespace is Terminating: the namespace's deletion waits on this pod")
    for d in summary.get("orphanedPodDirs") or []:
        lines.append(f"orphaned pod dir on the node: {d.get('path')} ({d.get('state')})")
    return lines
