"""Why is this pod stuck? docs/design.md §1-2, evaluated in order; the first matching rule
wins.

final-delete → node → containers → volumes → kubelet. This module holds the order and the
API-only rules (0 NotStuck, 1 FinalizerBlocked, 2 NodeGone, 3 NodeUnreachable: the pod and
its Node object decide them); rules 4-9, what the pod's node shows, are
`unstick.core.rules.node`'s. Node-side rules (5-9) need a fresh probe of the pod's node;
without one only the API form of rule 4 can match and everything else is Unknown: node
state is never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from unstick.core.durations import human
from unstick.core.evidence import Evidence
from unstick.core.model.facts import Facts, NodeFacts
from unstick.core.model.node_facts import PodMount
from unstick.core.model.probe import FrozenCgroup, HungMount, VolumeDir
from unstick.core.rules.fencing import Fencing, fencing
from unstick.core.rules.finalizer_owners import OwnerView, finalizer_evidence, views
from unstick.core.rules.node import NodeView, on_the_node
from unstick.core.rules.settings import DiagnosisSettings
from unstick.core.vocabulary import Cause


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The cause plus everything the planner and the executors' re-checks need."""

    namespace: str
    name: str
    uid: str
    node: str | None
    now: datetime
    cause: Cause
    stuck: bool
    overdue_seconds: float | None  # None: no deletionTimestamp
    evidence: tuple[Evidence, ...]
    fenced: bool | None  # None: no Node object; True: proof from a trusted source (§10)
    probe_fresh: bool  # a fresh probe of the pod's node was used
    kubelet_root: str | None  # from the fresh probe
    mounts: tuple[PodMount, ...] = ()  # deepest first
    volume_dirs: tuple[VolumeDir, ...] = ()  # deepest first
    running_containers: tuple[str, ...] = ()
    nothing_left: bool = False  # a fresh probe shows nothing of the pod on the node
    finalizers: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    # When the pod's node, not Ready, will have been so for nodeLostAfter (rule 3 then
    # matches); None: the node is Ready, already lost, or unknown. Nothing changes about
    # the Node at that moment, so whoever re-diagnoses on changes must wake up then.
    node_lost_at: datetime | None = None
    frozen_cgroups: tuple[FrozenCgroup, ...] = ()  # ContainerFrozen: the pod's frozen cgroups
    hung_mounts: tuple[HungMount, ...] = ()  # HungMount: the pod's hung mounts
    holders_unknown: bool = False  # HungMount: the holder scan or the runtime was blind
    finalizer_owners: tuple[OwnerView, ...] = ()  # each finalizer's owner: alive, gone, unknown
    fenced_by: tuple[str, ...] = ()  # the fencing sources whose proof holds (docs/fencing.md)

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _fenced_words(fenced: Fencing, settings: DiagnosisSettings) -> str:
    """The node line's end: fenced (by what), or NOT fenced (which sources were trusted)."""
    if fenced.proofs:
        if [p.source.value for p in fenced.proofs] == ["outOfServiceTaint"]:
            return "fenced: taint node.kubernetes.io/out-of-service is present"
        return "fenced by " + ", ".join(dict.fromkeys(p.source.value for p in fenced.proofs))
    return (
        "NOT fenced: no proof it is off from the sources the policy trusts "
        f"(fencingEvidence: {settings.fencing.words()}); silence is not proof"
    )


def _node_lost(
    node: NodeFacts, facts: Facts, settings: DiagnosisSettings, fenced: Fencing
) -> tuple[bool, str]:
    """(is the node lost for >= nodeLostAfter, what to say about its Ready state)."""
    ready = node.ready
    if ready is not None and ready.status == "True":
        return False, ""
    since = (ready.last_transition if ready is not None else None) or node.created
    what = "no Ready condition"
    if ready is not None:
        what = f"Ready={ready.status}" + (f" ({ready.reason})" if ready.reason else "")
    if since is None:
        return False, f"node {node.name} has {what} since an unknown time: not counted as lost"
    lost = (facts.now - since).total_seconds()
    words = _fenced_words(fenced, settings)
    message = f"node {node.name} has {what} for {human(lost)} (since {_iso(since)}); {words}"
    if lost >= settings.node_lost_after_s:
        return True, message
    return False, f"{message}; under nodeLostAfter {human(settings.node_lost_after_s)}"


def _node_lost_at(facts: Facts, settings: DiagnosisSettings) -> datetime | None:
    """When the pod's node will count as lost, if it is not Ready and not lost yet."""
    node = facts.node
    if node is None or (node.ready is not None and node.ready.status == "True"):
        return None
    since = (node.ready.last_transition if node.ready is not None else None) or node.created
    if since is None:
        return None
    at = since + timedelta(seconds=settings.node_lost_after_s)
    return at if at > facts.now else None


def diagnose(facts: Facts, settings: DiagnosisSettings | None = None) -> Diagnosis:
    """Diagnose one pod; `facts.now` (the bundle's capturedAt) is "now"."""
    settings = settings or DiagnosisSettings()
    pod = facts.pod
    ev: list[Evidence] = []
    overdue: float | None = None
    if pod.deletion_timestamp is not None:
        overdue = (facts.now - pod.deletion_timestamp).total_seconds()
    stuck = overdue is not None and overdue > settings.slack_s
    fenced = fencing(facts, settings.fencing)
    cause, view = _decide(facts, settings, overdue, stuck, ev, fenced=fenced)
    if stuck and pod.disruption is not None:  # who set out to delete it: evidence only
        ev.append(
            Evidence("deletion", f"the pod was deleted as a disruption: {pod.disruption.words()}")
        )
    return Diagnosis(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        node=pod.node_name,
        now=facts.now,
        cause=cause,
        stuck=stuck,
        overdue_seconds=overdue,
        evidence=tuple(ev),
        fenced=None if facts.node is None else fenced.fenced,
        probe_fresh=view.probe_fresh,
        kubelet_root=view.kubelet_root,
        mounts=view.mounts,
        volume_dirs=view.volume_dirs,
        running_containers=view.running_containers,
        nothing_left=view.nothing_left,
        finalizers=pod.finalizers,
        annotations=pod.annotations,
        node_lost_at=_node_lost_at(facts, settings),
        frozen_cgroups=view.frozen_cgroups,
        hung_mounts=view.hung_mounts,
        holders_unknown=view.holders_unknown,
        finalizer_owners=views(facts, settings.finalizer_owners),
        fenced_by=tuple(dict.fromkeys(p.source.value for p in fenced.proofs)),
    )


def _decide(
    facts: Facts,
    settings: DiagnosisSettings,
    overdue: float | None,
    stuck: bool,
    ev: list[Evidence],
    *,
    fenced: Fencing,
) -> tuple[Cause, NodeView]:
    pod = facts.pod
    none = NodeView()
    # 0. NotStuck
    if pod.deletion_timestamp is None or overdue is None:
        ev.append(Evidence("deletion", "pod has no deletionTimestamp: it is not being deleted"))
        return Cause.NotStuck, none
    when = f"{human(overdue)} ago" if overdue >= 0 else f"in {human(overdue)}"
    ev.append(
        Evidence(
            "deletion",
            f"deletionTimestamp {_iso(pod.deletion_timestamp)} (delete time + grace period) is "
            f"{when}; stuck after {human(settings.slack_s)} of slack",
        )
    )
    if not stuck:
        return Cause.NotStuck, none

    # 1. FinalizerBlocked
    finalizers = ", ".join(pod.finalizers)
    if pod.finalizers and pod.deletion_grace_period_seconds == 0:
        ev.append(
            Evidence(
                "finalizer",
                "deletionGracePeriodSeconds is 0 (the final delete was issued); "
                f"finalizers keep the object: {finalizers}",
            )
        )
        ev.extend(finalizer_evidence(facts, settings.finalizer_owners))
        return Cause.FinalizerBlocked, none
    if pod.finalizers and pod.node_name is None:
        ev.append(
            Evidence("finalizer", f"pod is on no node; finalizers keep the object: {finalizers}")
        )
        ev.extend(finalizer_evidence(facts, settings.finalizer_owners))
        return Cause.FinalizerBlocked, none

    # 2. NodeGone
    if pod.node_name is not None and facts.node is None:
        ev.append(Evidence("node", f"node {pod.node_name} does not exist (no Node object)"))
        return Cause.NodeGone, none

    # 3. NodeUnreachable
    if facts.node is not None:
        lost, message = _node_lost(facts.node, facts, settings, fenced)
        if message:
            ev.append(Evidence("node", message))
        if lost:
            # the proofs, each naming its source, object and time; what proves nothing
            ev.extend(
                Evidence("fencing", f"fenced by {p.source.value}: {p.message}")
                for p in fenced.proofs
            )
            ev.extend(Evidence("fencing", n) for n in fenced.notes)
            seen = pod.kubelet_saw_delete_words()  # since 1.33: evidence only
            if seen is not None:
                ev.append(Evidence("kubelet", seen))
            return Cause.NodeUnreachable, none

    # 3a (ContainerFrozen), 3b (HungMount), 4-9. What the pod's node shows
    return on_the_node(facts, settings.probe_max_age_s, ev)
