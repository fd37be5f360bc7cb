"""The node-level actions `taint-out-of-service` and `untaint-out-of-service` (design.md
§10, docs/fencing.md): when may unstick put the out-of-service taint on a node, and when
may it take it off again. Pure: the controller's adapter (controller/fencing/) reads the
cluster live, records, and writes what is decided here.

Kubernetes' non-graceful node shutdown: with `node.kubernetes.io/out-of-service` on a
node (effect NoExecute, value `nodeshutdown`, as the Kubernetes docs apply it), PodGC
force-deletes the node's terminating pods and the attach/detach controller detaches their
volumes at once. Applied to a node that still runs, it is split brain; left on a node that
came back, it evicts whatever lands there. So:

- **taint** only a NotReady node that carries no out-of-service taint yet, on proof from a
  source the policy trusts other than the taint itself (core/rules/fencing.py; silence is
  never proof), not while FenceAgentsRemediation or SelfNodeRemediation manage the node
  (their records since its last Ready: they taint or delete its pods themselves — unstick
  does not race them), never while more than `maxNotReadyPercent` of the nodes are
  NotReady (a zone or control-plane outage is not a node failure), never beyond
  `maxFencedNodes` nodes carrying unstick's taint (counting taints on their way), and at
  most `maxFencedNodes` taints per `BUDGET_WINDOW_S` (its own budget, rebuilt from the
  records);
- **untaint** only unstick's own taint — the NoExecute out-of-service taint whose
  `timeAdded` is the one unstick's annotation on the Node names; any other (an admin's, or
  one re-applied by anyone) is never removed — and only once the node is Ready and a live
  read shows no pod of it Terminating (but the taint's own evictions since it was Ready
  again: its kubelet's) and no VolumeAttachment of it. A taint held longer
  than `fencedTaintMaxSeconds` is reported (the alert `UnstickNodeFencedTooLong`), never
  removed on a timer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from unstick.core.model.facts import OUT_OF_SERVICE_TAINT, NodeFacts
from unstick.core.model.snapshot import parse_node
from unstick.core.rules.fencing import Fencing, FencingSource, Proof

#: The taint as the Kubernetes docs for non-graceful node shutdown apply it.
OUT_OF_SERVICE_VALUE = "nodeshutdown"
OUT_OF_SERVICE_EFFECT = "NoExecute"
#: Annotation on the Node: unstick applied the taint, on what evidence (JSON, `Applied`).
APPLIED_ANNOTATION = "unstick.dev/out-of-service"
#: The taint budget: at most `maxFencedNodes` taints applied within this window.
BUDGET_WINDOW_S = 600.0

DEFAULT_MAX_FENCED_NODES = 1
#: NodeHealthCheck's default minHealthy is 51%: remediation stops once more than 49% of
#: the nodes are unhealthy; kube-controller-manager's node lifecycle controller stops its
#: own evictions in a zone at 55% NotReady (--unhealthy-zone-threshold). 49 keeps unstick
#: below both: when half the cluster is NotReady, the cause is not the nodes.
DEFAULT_MAX_NOT_READY_PERCENT = 49
#: An hour: a node powered off and repaired (or replaced) is back well within it; a taint
#: held longer means a human must decide (repair the node, or delete its Node object).
DEFAULT_FENCED_TAINT_MAX_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class OutOfServiceGuards:
    """The policy's `maxFencedNodes`, `maxNotReadyPercent`, `fencedTaintMaxSeconds`."""

    max_fenced_nodes: int = DEFAULT_MAX_FENCED_NODES
    max_not_ready_percent: int = DEFAULT_MAX_NOT_READY_PERCENT
    fenced_taint_max_seconds: float = DEFAULT_FENCED_TAINT_MAX_SECONDS


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str
    time_added: str | None  # as written (compared as written: it identifies unstick's)

    def entry(self) -> dict[str, str]:
        out = {"key": self.key, "value": self.value, "effect": self.effect}
        if self.time_added is not None:
            out["timeAdded"] = self.time_added
        return out


def out_of_service_taint(time_added: str) -> Taint:
    """The taint unstick applies, stamped with `time_added` (RFC 3339, seconds)."""
    return Taint(OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE, OUT_OF_SERVICE_EFFECT, time_added)


@dataclass(frozen=True, slots=True)
class Applied:
    """unstick's annotation on the Node: it applied the taint stamped `time_added`, on the
    evidence of `source` (`obj`, true since `evidence_time`), recorded in `record`."""

    time_added: str
    source: str
    obj: str  # the evidence's object (`taint KEY`, `FenceAgentsRemediation NS/NAME`)
    evidence_time: str | None
    record: str  # namespace/name of the node incident

    def to_json(self) -> str:
        return json.dumps(
            {
                "timeAdded": self.time_added,
                "source": self.source,
                "object": self.obj,
                "evidenceTime": self.evidence_time,
                "record": self.record,
            },
            sort_keys=True,
        )

    @staticmethod
    def parse(text: object) -> Applied | None:
        """None for anything that is not an annotation unstick wrote (no taint is then
        unstick's: an unreadable mark never makes a taint removable)."""
        if not isinstance(text, str):
            return None
        try:
            raw = json.loads(text)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        fields = [raw.get(k) for k in ("timeAdded", "source", "object", "record")]
        evidence_time = raw.get("evidenceTime")
        if not all(isinstance(v, str) and v for v in fields):
            return None
        if evidence_time is not None and not isinstance(evidence_time, str):
            return None
        time_added, source, obj, record = (str(v) for v in fields)
        return Applied(time_added, source, obj, evidence_time, record)


@dataclass(frozen=True, slots=True)
class NodeState:
    """A Node as read: its facts, its out-of-service taints, unstick's mark."""

    facts: NodeFacts
    resource_version: str
    taints: tuple[Taint, ...]  # every taint of the node, as read
    applied: Applied | None  # unstick's annotation (None: absent or unreadable)

    @property
    def name(self) -> str:
        return self.facts.name

    @property
    def ready(self) -> bool:
        return self.facts.ready is not None and self.facts.ready.status == "True"

    @property
    def out_of_service(self) -> tuple[Taint, ...]:
        return tuple(t for t in self.taints if t.key == OUT_OF_SERVICE_TAINT)

    @property
    def unstick_taint(self) -> Taint | None:
        """The out-of-service taint unstick applied: NoExecute and stamped with the time
        its annotation names. Anything else — no annotation, another effect, another
        time (re-applied by someone) — is not unstick's."""
        if self.applied is None:
            return None
        for t in self.out_of_service:
            if t.effect == OUT_OF_SERVICE_EFFECT and t.time_added == self.applied.time_added:
                return t
        return None


def node_state(obj: Mapping[str, object]) -> NodeState:
    """A Node object as the API returns it (FieldError naming the field otherwise)."""
    facts = parse_node(obj)
    meta = obj.get("metadata")
    spec = obj.get("spec")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = spec if isinstance(spec, Mapping) else {}
    taints = []
    for raw in spec.get("taints") or []:
        if isinstance(raw, Mapping):
            added = raw.get("timeAdded")
            taints.append(
                Taint(
                    str(raw.get("key") or ""),
                    str(raw.get("value") or ""),
                    str(raw.get("effect") or ""),
                    added if isinstance(added, str) else None,
                )
            )
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    return NodeState(
        facts,
        str(meta.get("resourceVersion") or ""),
        tuple(taints),
        Applied.parse(annotations.get(APPLIED_ANNOTATION)),
    )


@dataclass(frozen=True, slots=True)
class Manager:
    """A FenceAgentsRemediation or SelfNodeRemediation for the node: `kind ns/name`,
    created at `created` (None: not known)."""

    name: str
    created: datetime | None


@dataclass(frozen=True, slots=True)
class Cluster:
    """What the guards count, from a live read of the Nodes and of unstick's records."""

    nodes: int
    not_ready: int
    #: nodes carrying unstick's taint, and nodes whose taint is on record as being applied
    fenced: frozenset[str]
    #: when the taints on record were applied (or decided), epoch seconds
    recent_taints: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class TaintVerdict:
    act: bool
    reason: str
    proof: Proof | None = None
    retry_at: float | None = None  # the budget: room again then
    dry_run: bool = False
    #: a node proven off (or managed by FAR/SNR) that unstick does not taint: worth an Event
    notable: bool = False


def _managing(node: NodeState, managers: tuple[Manager, ...]) -> tuple[Manager, ...]:
    """The records of this incident (since the node's last Ready transition)."""
    since = node.facts.last_ready_transition
    return tuple(m for m in managers if m.created is None or since is None or m.created > since)


def decide_taint(
    node: NodeState,
    fencing: Fencing,
    managers: tuple[Manager, ...],
    cluster: Cluster,
    guards: OutOfServiceGuards,
    *,
    permitted: bool,
    dry_run: bool,
    now: float,
) -> TaintVerdict:
    """May unstick taint `node` now? Each guard that refuses says why."""
    name = node.name
    if not permitted:
        return TaintVerdict(False, "the policy default does not list taint-out-of-service")
    if node.ready:
        return TaintVerdict(False, f"node {name} is Ready")
    if node.out_of_service:
        return TaintVerdict(False, f"node {name} already carries {OUT_OF_SERVICE_TAINT}")
    managing = _managing(node, managers)
    if managing:
        return TaintVerdict(
            False,
            notable=True,
            reason=f"{', '.join(m.name for m in managing)} manages node {name}'s recovery (it "
            "applies the out-of-service taint or deletes the node's pods itself once it "
            "has fenced the node): unstick does not race it",
        )
    proofs = [p for p in fencing.proofs if p.source is not FencingSource.OUT_OF_SERVICE_TAINT]
    if not proofs:
        notes = "; ".join(fencing.notes)
        return TaintVerdict(
            False,
            f"no proof that node {name} is off from the sources the policy trusts "
            "(silence is not proof)" + (f"; {notes}" if notes else ""),
        )
    proof = proofs[0]
    if cluster.not_ready * 100 > guards.max_not_ready_percent * cluster.nodes:
        return TaintVerdict(
            False,
            proof=proof,
            notable=True,
            reason=f"{cluster.not_ready} of {cluster.nodes} nodes are NotReady, more than "
            f"maxNotReadyPercent ({guards.max_not_ready_percent}%): a zone or control-plane "
            "outage is not a node failure",
        )
    others = sorted(cluster.fenced - {name})
    if len(others) >= guards.max_fenced_nodes:
        return TaintVerdict(
            False,
            proof=proof,
            notable=True,
            reason=f"{len(others)} node(s) already carry unstick's out-of-service taint "
            f"({', '.join(others[:5]) or 'none'}); maxFencedNodes is {guards.max_fenced_nodes}",
        )
    recent = sorted(t for t in cluster.recent_taints if now - t < BUDGET_WINDOW_S)
    if len(recent) >= guards.max_fenced_nodes:
        return TaintVerdict(
            False,
            proof=proof,
            notable=True,
            reason=f"the taint budget is spent ({len(recent)} taint(s) in the last "
            f"{BUDGET_WINDOW_S:.0f} s, maxFencedNodes is {guards.max_fenced_nodes})",
            retry_at=recent[-guards.max_fenced_nodes] + BUDGET_WINDOW_S,
        )
    if dry_run:
        return TaintVerdict(False, f"dry run: would taint node {name}", proof, dry_run=True)
    return TaintVerdict(True, f"node {name} is NotReady and {proof.message}", proof)


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What a live read (never a cache) finds of the node: its pods that are Terminating
    and the VolumeAttachments that name it; `evicted_at`: of those, the ones the taint
    manager evicted (a True `DisruptionTarget` condition, reason `DeletionByTaintManager`),
    with when their deletion was asked for (deletionTimestamp less its grace period)."""

    terminating_pods: tuple[str, ...] = ()
    attachments: tuple[str, ...] = ()
    evicted_at: Mapping[str, datetime] = field(default_factory=dict)

    def holding(self, ready_since: datetime | None) -> tuple[str, ...]:
        """The Terminating pods the taint waits for: all but the taint's own evictions
        since the node was Ready again (`ready_since`). A pod bound to the node by name (a
        StatefulSet's or a static pod's, with no toleration) is evicted by the NoExecute
        taint each time it is made again: waiting for none of them to be Terminating would
        wait on the taint itself, for ever. Such a pod is its running kubelet's to finish,
        and the taint clears nothing for it (PodGC force-deletes only on a NotReady node).
        Any other Terminating pod — the incident's, one deleted by anybody else, one whose
        time is not known — holds the taint."""
        return tuple(
            p
            for p in self.terminating_pods
            if ready_since is None or p not in self.evicted_at or self.evicted_at[p] <= ready_since
        )


@dataclass(frozen=True, slots=True)
class UntaintVerdict:
    act: bool
    reason: str
    too_long: bool = False  # held longer than fencedTaintMaxSeconds: the alert
    clear_mark: bool = False  # the annotation describes no taint any more: remove it
    held_s: float | None = None


def held_seconds(node: NodeState, now: datetime) -> float | None:
    """How long unstick's taint has been on the node (None: it carries none)."""
    taint = node.unstick_taint
    if taint is None or taint.time_added is None:
        return None
    try:
        added = datetime.fromisoformat(taint.time_added.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (now - added).total_seconds())


def decide_untaint(
    node: NodeState,
    leftovers: Leftovers | None,
    guards: OutOfServiceGuards,
    *,
    permitted: bool,
    now: datetime,
) -> UntaintVerdict:
    """May unstick remove its taint from `node` now? `leftovers`: the live read (None:
    not read)."""
    name = node.name
    if node.applied is None:
        return UntaintVerdict(False, f"node {name} carries no taint unstick applied")
    if node.unstick_taint is None:
        if node.out_of_service:
            why = "its out-of-service taint is not the one unstick applied (re-applied by "
            why += "someone): never removed by unstick"
        else:
            why = "its out-of-service taint was removed by someone else"
        return UntaintVerdict(False, f"node {name}: {why}", clear_mark=True)
    held = held_seconds(node, now)
    too_long = held is not None and held > guards.fenced_taint_max_seconds

    def keep(why: str) -> UntaintVerdict:
        return UntaintVerdict(False, why, too_long=too_long, held_s=held)

    if not permitted:
        return keep("the policy default does not list untaint-out-of-service")
    if not node.ready:
        return keep(f"node {name} is not Ready: the taint stays")
    if leftovers is None:
        return keep(f"node {name}'s pods and attachments were not read")
    # The Ready condition's own time, not last_ready_transition's fallback to the Node's
    # creation: a condition without one excuses no pod.
    ready = node.facts.ready
    ready_since = ready.last_transition if ready is not None else None
    holding = leftovers.holding(ready_since)
    if holding or leftovers.attachments:
        left = [f"pod {p} Terminating" for p in holding[:5]]
        left += [f"VolumeAttachment {a}" for a in leftovers.attachments[:5]]
        return keep(f"node {name} is Ready but still has {', '.join(left)}")
    reason = (
        f"node {name} is Ready again, and a live read shows no pod of it Terminating and "
        "no VolumeAttachment of it"
    )
    later = [p for p in leftovers.terminating_pods if p not in holding]
    if later:
        since = ready_since.strftime("%Y-%m-%dT%H:%M:%SZ") if ready_since else "?"
        reason = (
            f"node {name} is Ready again (since {since}), and a live read shows no pod of it "
            f"Terminating but the taint's own evictions since, and no VolumeAttachment of it "
            f"(its kubelet's to finish: {', '.join(f'pod {p}' for p in later[:5])})"
        )
    return UntaintVerdict(True, reason, too_long=too_long, held_s=held)
