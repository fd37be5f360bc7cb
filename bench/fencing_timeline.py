"""The pure part of `python -m bench.fencing`: what one read of the cluster says about each
step of a node's power-off and return, and the timeline assembled from the reads (the
first read that showed each step, its time since the power-off and the load then).

A read is the `items` of one `kubectl get -n <ns> pods,volumeattachments,nodes -o json`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
SHUTDOWN = "node.cloudprovider.kubernetes.io/shutdown"

#: The steps from the power-off to the replacement Ready, in the order they should happen.
DOWN = (
    "not_ready",  # the Node's Ready condition is no longer True
    "proof",  # the cloud node lifecycle controller's shutdown taint is on it
    "out_of_service",  # node.kubernetes.io/out-of-service is on it
    "old_pod_deleting",  # the old pod has a deletionTimestamp (evicted, or deleted)
    "old_pod_gone",  # no pod with the old pod's uid
    "detached",  # no VolumeAttachment of the PV to the node
    "scheduled",  # a pod of another uid has a node
    "attached",  # the PV attached (VolumeAttachment status.attached) to another node
    "ready",  # that pod Ready
)
#: The steps from the power-on to the node usable again.
UP = (
    "node_ready",  # Ready=True
    "shutdown_taint_removed",
    "out_of_service_removed",
    "schedulable",  # not cordoned, no NoSchedule/NoExecute taint at all
)


@dataclass(frozen=True)
class Subject:
    """What the timeline is about: the worker, the pod's PV and the old pod's uid."""

    node: str
    pv: str
    old_uid: str


def _kind(items: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [i for i in items if i.get("kind") == kind]


def _taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def _has_taint(node: Mapping[str, Any], key: str) -> bool:
    return any(t.get("key") == key for t in _taints(node))


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _the_node(items: list[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    for node in _kind(items, "Node"):
        if node["metadata"]["name"] == name:
            return node
    raise ValueError(f"node {name} is not in the read")


def down_facts(items: list[Mapping[str, Any]], s: Subject) -> dict[str, bool]:
    """Which steps of DOWN one read shows."""
    node = _the_node(items, s.node)
    pods = _kind(items, "Pod")
    old = [p for p in pods if p["metadata"]["uid"] == s.old_uid]
    new = [p for p in pods if p["metadata"]["uid"] != s.old_uid and p["spec"].get("nodeName")]
    vas = [
        va
        for va in _kind(items, "VolumeAttachment")
        if va["spec"]["source"].get("persistentVolumeName") == s.pv
    ]
    return {
        "not_ready": not _condition(node, "Ready"),
        "proof": _has_taint(node, SHUTDOWN),
        "out_of_service": _has_taint(node, OUT_OF_SERVICE),
        "old_pod_deleting": not old or bool(old[0]["metadata"].get("deletionTimestamp")),
        "old_pod_gone": not old,
        "detached": not any(va["spec"]["nodeName"] == s.node for va in vas),
        "scheduled": bool(new),
        "attached": any(
            va["spec"]["nodeName"] != s.node and (va.get("status") or {}).get("attached")
            for va in vas
        ),
        "ready": any(
            _condition(p, "Ready") and not p["metadata"].get("deletionTimestamp") for p in new
        ),
    }


def up_facts(items: list[Mapping[str, Any]], s: Subject) -> dict[str, bool]:
    """Which steps of UP one read shows."""
    node = _the_node(items, s.node)
    blocking = [t for t in _taints(node) if t.get("effect") in ("NoSchedule", "NoExecute")]
    return {
        "node_ready": _condition(node, "Ready"),
        "shutdown_taint_removed": not _has_taint(node, SHUTDOWN),
        "out_of_service_removed": not _has_taint(node, OUT_OF_SERVICE),
        "schedulable": not (node.get("spec") or {}).get("unschedulable") and not blocking,
    }


@dataclass
class Timeline:
    """The first read that showed each step: seconds since the start and the 1-min load."""

    steps: tuple[str, ...]
    seen: dict[str, dict[str, float]]
    reads: int = 0

    @classmethod
    def of(cls, steps: tuple[str, ...]) -> Timeline:
        return cls(steps, {})

    def add(self, facts: Mapping[str, bool], at_s: float, load: float) -> None:
        self.reads += 1
        for step in self.steps:
            if facts.get(step) and step not in self.seen:
                self.seen[step] = {"s": round(at_s, 1), "load_1min": round(load, 2)}

    def done(self, last: str) -> bool:
        return last in self.seen

    def report(self, cap_s: float) -> dict[str, Any]:
        """Each step's time, or `not within <cap> s`; in the order of `steps`."""
        never = f"not within {cap_s:.0f} s"
        return {step: self.seen.get(step, never) for step in self.steps}


def follow(
    read: Callable[[], list[Mapping[str, Any]]],
    facts: Callable[[list[Mapping[str, Any]]], dict[str, bool]],
    timeline: Timeline,
    *,
    last: str,
    cap_s: float,
    clock: Callable[[], float],
    load: Callable[[], float],
) -> Timeline:
    """Reads until `last` is seen or `cap_s` passed (time from `clock`, started at 0 by
    the caller: the power-off or power-on); each read's facts added to `timeline`."""
    while not timeline.done(last) and clock() < cap_s:
        items = read()
        timeline.add(facts(items), clock(), load())
    return timeline
