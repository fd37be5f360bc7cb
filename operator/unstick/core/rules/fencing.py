"""Is the pod's node fenced? Proof that it is off, from the sources the policy trusts
(docs/design.md §10, docs/fencing.md).

A node that does not answer may still run its pods (a partition looks exactly like a dead
node), so a NodeUnreachable pod is force-deleted only when its node is *fenced*: proven
off (or cut off from its storage) by a source the policy lists in `fencingEvidence`:

- `outOfServiceTaint`: the taint `node.kubernetes.io/out-of-service` (an admin's word, or an
  operator's that fenced the node);
- `cloudShutdown`: the taint `node.cloudprovider.kubernetes.io/shutdown`, set by the cloud
  node lifecycle controller of k8s.io/cloud-provider while the provider says the instance
  is shut down;
- `fenceAgentsRemediation`: a medik8s FenceAgentsRemediation for the node, in a namespace
  the policy names, whose condition `FenceAgentActionSucceeded` is True since after the
  node's last Ready transition (a success of an earlier incident proves nothing now);
- `selfNodeRemediation`: a medik8s SelfNodeRemediation for the node whose
  `status.timeAssumedRebooted` has passed by the reader's clock (and lies after the node's
  last Ready transition, for the same reason).

Silence (no heartbeat, no Lease renewal, no probe) is never proof. Each proof names its
source, the object and its time; a record that is there but proves nothing says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from unstick.core.model.facts import (
    CLOUD_SHUTDOWN_TAINT,
    OUT_OF_SERVICE_TAINT,
    Facts,
    FenceAgentsRemediationFacts,
    NodeFacts,
    SelfNodeRemediationFacts,
)


class FencingSource(StrEnum):
    """The words of the policy's `fencingEvidence`, in the order they are looked at."""

    OUT_OF_SERVICE_TAINT = "outOfServiceTaint"
    CLOUD_SHUTDOWN = "cloudShutdown"
    FENCE_AGENTS_REMEDIATION = "fenceAgentsRemediation"
    SELF_NODE_REMEDIATION = "selfNodeRemediation"


#: The policy's default: only the out-of-service taint counts.
DEFAULT_SOURCES: frozenset[FencingSource] = frozenset({FencingSource.OUT_OF_SERVICE_TAINT})


@dataclass(frozen=True, slots=True)
class FencingSettings:
    """The policy's `fencingEvidence` and `fenceAgentsRemediationNamespaces`."""

    sources: frozenset[FencingSource] = DEFAULT_SOURCES
    #: namespaces FenceAgentsRemediations are read from (none: none is read)
    far_namespaces: tuple[str, ...] = ()

    def trusts(self, source: FencingSource) -> bool:
        return source in self.sources

    @property
    def reads_far(self) -> bool:
        """Are FenceAgentsRemediations read at all (listed, and a namespace named)?"""
        return self.trusts(FencingSource.FENCE_AGENTS_REMEDIATION) and bool(self.far_namespaces)

    @property
    def reads_snr(self) -> bool:
        return self.trusts(FencingSource.SELF_NODE_REMEDIATION)

    def words(self) -> str:
        return ", ".join(s.value for s in FencingSource if s in self.sources) or "none"


@dataclass(frozen=True, slots=True)
class Proof:
    """One piece of evidence that the node is off: its source and what says so."""

    source: FencingSource
    message: str
    object: str = ""  # what says so: `taint KEY`, `FenceAgentsRemediation NS/NAME`, ...
    at: datetime | None = None  # since when it says so (None: not known)


@dataclass(frozen=True, slots=True)
class Fencing:
    """What the fencing sources say about one node: the proofs from trusted sources (the
    node is fenced when there is one), and notes on what was seen but proves nothing."""

    proofs: tuple[Proof, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def fenced(self) -> bool:
        return bool(self.proofs)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _taint(node: NodeFacts, key: str) -> str | None:
    """'taint KEY (added T)' when the node carries it, else None."""
    if key not in node.taints:
        return None
    added = node.taints_added.get(key)
    return f"taint {key} is present" + (f" (added {_iso(added)})" if added else "")


def _seen(
    source: FencingSource,
    what: str,
    settings: FencingSettings,
    proofs: list[Proof],
    notes: list[str],
    *,
    obj: str = "",
    at: datetime | None = None,
) -> None:
    if settings.trusts(source):
        proofs.append(Proof(source, what, obj, at))
    else:
        notes.append(f"{what}, but the policy does not list {source.value} in fencingEvidence")


def fencing(facts: Facts, settings: FencingSettings) -> Fencing:
    """The proofs that the pod's node is off, from the sources `settings` trusts."""
    if facts.node is None:
        return Fencing()
    return node_fencing(
        facts.node,
        facts.fence_agents_remediations,
        facts.self_node_remediations,
        facts.now,
        settings,
    )


def node_fencing(
    node: NodeFacts,
    fars: tuple[FenceAgentsRemediationFacts, ...],
    snrs: tuple[SelfNodeRemediationFacts, ...],
    now: datetime,
    settings: FencingSettings,
) -> Fencing:
    """The proofs that `node` is off, from the sources `settings` trusts (no pod needed:
    the node-level actions of core/policy/out_of_service.py ask this too)."""
    proofs: list[Proof] = []
    notes: list[str] = []
    for source, key in (
        (FencingSource.OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_TAINT),
        (FencingSource.CLOUD_SHUTDOWN, CLOUD_SHUTDOWN_TAINT),
    ):
        taint = _taint(node, key)
        if taint is not None:
            at = node.taints_added.get(key)
            _seen(source, taint, settings, proofs, notes, obj=f"taint {key}", at=at)
    since = node.last_ready_transition
    _far(fars, node, settings, since=since, proofs=proofs, notes=notes)
    _snr(snrs, now, node, settings, since=since, proofs=proofs, notes=notes)
    return Fencing(tuple(proofs), tuple(notes))


def _after(at: datetime, since: datetime | None) -> str | None:
    """Why `at` is no proof for the node's current state (None: it is after `since`)."""
    if since is None:
        return "the node's last Ready transition is not known"
    if at <= since:
        return f"it predates the node's last Ready transition ({_iso(since)})"
    return None


def _far(
    fars: tuple[FenceAgentsRemediationFacts, ...],
    node: NodeFacts,
    settings: FencingSettings,
    *,
    since: datetime | None,
    proofs: list[Proof],
    notes: list[str],
) -> None:
    for far in fars:
        if far.node != node.name or far.fence_succeeded_at is None:
            continue
        name = f"FenceAgentsRemediation {far.namespace}/{far.name}"
        what = (
            f"{name} says the fence action succeeded (FenceAgentActionSucceeded=True"
            + (f", {far.reason}" if far.reason else "")
            + f") at {_iso(far.fence_succeeded_at)}"
        )
        if far.namespace not in settings.far_namespaces:
            notes.append(
                f"{what}, but namespace {far.namespace} is not one the policy names in "
                "fenceAgentsRemediationNamespaces: not proof"
            )
            continue
        stale = _after(far.fence_succeeded_at, since)
        if stale is not None:
            notes.append(f"{what}, but {stale}: not proof")
            continue
        _seen(
            FencingSource.FENCE_AGENTS_REMEDIATION,
            what,
            settings,
            proofs,
            notes,
            obj=name,
            at=far.fence_succeeded_at,
        )


def _snr(
    snrs: tuple[SelfNodeRemediationFacts, ...],
    now: datetime,
    node: NodeFacts,
    settings: FencingSettings,
    *,
    since: datetime | None,
    proofs: list[Proof],
    notes: list[str],
) -> None:
    for snr in snrs:
        if snr.node != node.name or snr.assumed_rebooted is None:
            continue
        at = snr.assumed_rebooted
        name = f"SelfNodeRemediation {snr.namespace}/{snr.name}"
        if at > now:
            notes.append(
                f"{name} assumes the node rebooted at {_iso(at)}, which has not passed yet "
                f"(now {_iso(now)}): not proof yet"
            )
            continue
        what = f"{name} assumes the node rebooted by {_iso(at)} (timeAssumedRebooted has passed)"
        stale = _after(at, since)
        if stale is not None:
            notes.append(f"{what}, but {stale}: not proof")
            continue
        _seen(FencingSource.SELF_NODE_REMEDIATION, what, settings, proofs, notes, obj=name, at=at)
