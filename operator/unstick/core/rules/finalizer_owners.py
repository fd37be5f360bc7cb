"""Finalizer triage: who removes each finalizer of a `FinalizerBlocked` pod, and
does that controller seem to be running?

Built-in finalizers are mapped to the controller that removes them and the leader lease it
renews (`batch.kubernetes.io/job-tracking` → the Job controller of kube-controller-manager,
lease `kube-system/kube-controller-manager`, kubernetes#127917). Others are mapped by the
policy's `spec.finalizerOwners` (a finalizer prefix → the Lease or the Deployment that
serves it; the longest prefix wins, and a policy entry wins over a built-in one); any
other finalizer belongs to whatever installed it and is named by its domain.

An owner is *alive* (a lease held, as client-go's leader election judges it: see
`lease_state`; a Deployment with ≥ 1 available replica), *gone* (a lease the reader has
seen unchanged for longer than twice its duration, or with no holder; a Deployment with 0
available replicas; either one missing, as `ownersGoneSince` says), or *unknown* (not
read, or no owner known). Since when it is gone: since the reader last saw the lease
change (or first read it), the Deployment's `Available=False` transition, else the first
time the reader saw it gone (`ownersGoneSince`). A lease's `renewTime` is its holder's
clock: it is shown, never compared with the reader's (an owner renewing on a node whose
clock lags is not gone). Evidence, plus `owner_gone_for`: with the policy's
`spec.finalizerOwnerGoneSeconds` set the planner removes an allowlisted finalizer only
once its owner has been gone for longer (never more than the allowlist, design.md §3
invariant 4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from unstick.core.durations import human
from unstick.core.evidence import Evidence
from unstick.core.model.facts import LEASE, Facts, LeaseFacts
from unstick.core.verdict import SAFE, Verdict, refuse

KCM_LEASE = ("kube-system", "kube-controller-manager")
KCM = "kube-controller-manager"
ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"

#: finalizer → (the controller that removes it, the lease its leader renews)
BUILT_IN: Mapping[str, tuple[str, tuple[str, str]]] = {
    "batch.kubernetes.io/job-tracking": (f"the Job controller of {KCM}", KCM_LEASE),
    "foregroundDeletion": (f"the garbage collector of {KCM}", KCM_LEASE),
    "orphan": (f"the garbage collector of {KCM}", KCM_LEASE),
    "kubernetes.io/pvc-protection": (f"the PVC protection controller of {KCM}", KCM_LEASE),
    "kubernetes.io/pv-protection": (f"the PV protection controller of {KCM}", KCM_LEASE),
}


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """A Lease or a Deployment that serves a finalizer."""

    kind: str  # LEASE or DEPLOYMENT
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class FinalizerOwner:
    """One `spec.finalizerOwners` entry of a policy: finalizers starting with `prefix`."""

    prefix: str
    owner: OwnerRef


@dataclass(frozen=True, slots=True)
class OwnerView:
    """What the diagnosis saw of one finalizer's owner."""

    finalizer: str
    owner: OwnerRef | None  # None: no owner known (not built-in, not mapped)
    state: str  # ALIVE, GONE or UNKNOWN
    gone_since: datetime | None = None  # GONE: since when (None: not known)


def lease_state(lease: LeaseFacts, now: datetime) -> tuple[str, datetime | None]:
    """ALIVE, or GONE and since when, judged as client-go's leader election does, on the
    reader's clock only: a lease is held while the reader has seen its (renewTime,
    resourceVersion) unchanged for no longer than twice its duration — counted from the
    read that saw it change, or from the first read (a first sight counts as held, as in
    client-go). No holder (released): gone, since an unknown time."""
    if lease.renewed is None or not lease.holder:
        return GONE, None
    since = lease.unchanged_since or now  # no memory: read once, now
    if now - since <= timedelta(seconds=lease.duration_s * 2):
        return ALIVE, None
    return GONE, since


def owner_of(finalizer: str, mapping: tuple[FinalizerOwner, ...]) -> OwnerRef | None:
    """The policy's entry with the longest matching prefix, else the built-in lease."""
    matches = [m for m in mapping if finalizer.startswith(m.prefix)]
    if matches:
        return max(matches, key=lambda m: len(m.prefix)).owner
    known = BUILT_IN.get(finalizer)
    return OwnerRef(LEASE, *known[1]) if known else None


def view(finalizer: str, facts: Facts, mapping: tuple[FinalizerOwner, ...]) -> OwnerView:
    """Alive, gone (since when) or unknown: the owner of `finalizer` as the bundle shows it."""
    owner = owner_of(finalizer, mapping)
    if owner is None:
        return OwnerView(finalizer, None, UNKNOWN)
    key = (owner.namespace, owner.name)
    seen_gone = facts.owners_gone_since.get((owner.kind, *key))
    if owner.kind == LEASE:
        lease = facts.leases.get(key)
        if lease is None:
            return OwnerView(finalizer, owner, GONE if seen_gone else UNKNOWN, seen_gone)
        state, since = lease_state(lease, facts.now)
        return OwnerView(finalizer, owner, state, since or (seen_gone if state == GONE else None))
    deployment = facts.deployments.get(key)
    if deployment is None:
        return OwnerView(finalizer, owner, GONE if seen_gone else UNKNOWN, seen_gone)
    if deployment.available >= 1:
        return OwnerView(finalizer, owner, ALIVE)
    return OwnerView(finalizer, owner, GONE, deployment.unavailable_since or seen_gone)


def views(facts: Facts, mapping: tuple[FinalizerOwner, ...]) -> tuple[OwnerView, ...]:
    return tuple(view(name, facts, mapping) for name in facts.pod.finalizers)


def owner_gone_for(
    finalizer: str, owners: tuple[OwnerView, ...], gone_s: float | None, now: datetime
) -> Verdict:
    """With `spec.finalizerOwnerGoneSeconds` set: is the finalizer's owner gone for longer?
    Alive → wait; unknown, or gone since an unknown time, or not long enough → not yet."""
    if gone_s is None:
        return SAFE
    setting = f"spec.finalizerOwnerGoneSeconds is {human(gone_s)}"
    seen = next((o for o in owners if o.finalizer == finalizer), None)
    if seen is None or seen.owner is None:
        return refuse(
            f"the owner of finalizer {finalizer} is not known ({setting}: map its prefix in "
            "spec.finalizerOwners)"
        )
    if seen.state == ALIVE:
        return refuse(f"{seen.owner} serving finalizer {finalizer} is alive: waiting for it")
    if seen.state == UNKNOWN:
        return refuse(f"{seen.owner} was not read: whether it is gone is not known")
    if seen.gone_since is None:
        return refuse(f"{seen.owner} seems gone since an unknown time ({setting})")
    gone = (now - seen.gone_since).total_seconds()
    if gone <= gone_s:
        return refuse(
            f"{seen.owner} gone for {human(gone)}, not yet longer than {human(gone_s)} ({setting})"
        )
    return SAFE


def waiting_for(
    finalizers: tuple[str, ...],
    owners: tuple[OwnerView, ...],
    allowlist: tuple[str, ...],
    gone_s: float | None,
    now: datetime,
) -> str | None:
    """`status.waitingFor` of a pod whose allowlisted finalizer waits for its owner (with
    `spec.finalizerOwnerGoneSeconds` set); None when none does."""
    for name in finalizers:
        if name in allowlist:
            verdict = owner_gone_for(name, owners, gone_s, now)
            if not verdict:
                return f"the finalizer's owner: {verdict.reason}"
    return None


def _lease_words(owner: str, key: tuple[str, str], lease: LeaseFacts | None, now: datetime) -> str:
    name = f"{key[0]}/{key[1]}"
    if lease is None:
        return (
            f"its leader lease {name} was not read: whether it runs is not known here "
            "(`unstick snapshot` captures it)"
        )
    if lease.renewed is None or not lease.holder:
        return f"its leader lease {name} has no holder: {owner} seems not to be running"
    state, _ = lease_state(lease, now)
    since = lease.unchanged_since or now
    unchanged = human(max((now - since).total_seconds(), 0.0))
    window = human(lease.duration_s * 2)
    theirs = (
        f"its renewTime says {human(max((now - lease.renewed).total_seconds(), 0.0))} ago by "
        "its holder's clock"
    )
    if state == ALIVE and lease.change_seen:
        return (
            f"its leader lease {name} was seen renewed {unchanged} ago by {lease.holder} (its "
            "renewTime or resourceVersion changed between two reads, timed on this reader's "
            "clock): it is alive — wait for it, or read its log for why it does not remove "
            "the finalizer"
        )
    if state == ALIVE:
        return (
            f"its leader lease {name} held by {lease.holder} was first read {unchanged} ago "
            f"and has not changed since; it counts as held until seen unchanged for {window} "
            f"on this reader's clock, as client-go's leader election judges ({theirs}): "
            "wait for it — a single read (`unstick snapshot`) cannot tell more"
        )
    return (
        f"its leader lease {name} held by {lease.holder} has not changed for {unchanged} on "
        f"this reader's clock, more than {window} (twice its duration; {theirs}): {owner} "
        "seems gone — nothing removes the finalizer until it is back"
    )


def _since(at: datetime | None, now: datetime) -> str:
    if at is None:
        return ""
    stamp = at.isoformat().replace("+00:00", "Z")
    return f" since {stamp} ({human((now - at).total_seconds())})"


def _mapped_words(seen: OwnerView, facts: Facts) -> str:
    owner = seen.owner
    assert owner is not None
    head = f"finalizer {seen.finalizer} is served by the {owner} (spec.finalizerOwners)"
    key = (owner.namespace, owner.name)
    if seen.state == UNKNOWN:
        return f"{head}: it was not read: whether it runs is not known here"
    found = (facts.leases if owner.kind == LEASE else facts.deployments).get(key)
    if found is None:
        return (
            f"{head}: it does not exist (seen missing{_since(seen.gone_since, facts.now)}): "
            "nothing removes the finalizer until it is back"
        )
    if isinstance(found, LeaseFacts):
        words = _lease_words("its owner", key, found, facts.now)
        return f"{head}: {words.removeprefix('its leader ')}"
    counts = f"{found.available} of {found.replicas} replicas available"
    if seen.state == ALIVE:
        return f"{head}: {counts}: it is alive — wait for it, or read its log"
    return (
        f"{head}: {counts}{_since(seen.gone_since, facts.now)}: it seems gone — nothing "
        "removes the finalizer until it is back"
    )


def finalizer_evidence(facts: Facts, mapping: tuple[FinalizerOwner, ...] = ()) -> list[Evidence]:
    """One line per finalizer: its owner and whether that owner seems present."""
    out = []
    for name in facts.pod.finalizers:
        mapped = any(name.startswith(m.prefix) for m in mapping)
        known = BUILT_IN.get(name)
        if mapped:
            words = _mapped_words(view(name, facts, mapping), facts)
        elif known is not None:
            owner, key = known
            words = f"finalizer {name} is removed by {owner}; " + _lease_words(
                owner, key, facts.leases.get(key), facts.now
            )
        else:
            domain = name.split("/", 1)[0] if "/" in name else name
            words = (
                f"finalizer {name} is not a built-in one: the controller that added it "
                f"({domain}) removes it; if that controller was uninstalled, nothing will"
            )
        out.append(Evidence("finalizer", words))
    return out
