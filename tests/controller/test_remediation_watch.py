"""The controller's Remediation watch (controller/records/watch.py: the project's list+watch,
not Kopf's): what its sink hands over on events and relists; against a real API server it
relists after a 410 Gone and keeps delivering; and the real controller, whose first
Remediation watch is answered 410 (fail point `remediation-watch`), relists and still
acts on the agent's answer."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import (
    GROUP,
    VERSION,
    Controller,
    Objects,
    agent_probe,
    write_as_agent,
)
from tests.support.controller import policy_spec as spec
from tests.support.remediations import remediation
from tests.support.watches import StaleFirstList
from unstick.controller.records.watch import RecordSink, RemediationWatch
from unstick.kube.client import ClientSettings

POLICY = "t-record-watch"
POLICIES = {POLICY: spec(probeMaxAgeSeconds=60)}
#: The controller's first Remediation watch is answered 410 Gone (controller/failpoints.py).
CONTROLLER_ENV = {"UNSTICK_TEST_FAILPOINTS": "remediation-watch=fail@1"}


def _record(name: str, version: str, uid: str = "uid-1", **status: Any) -> dict[str, Any]:
    meta = {"namespace": "ns", "name": name, "resourceVersion": version, "managedFields": [{}]}
    return {"metadata": meta, "spec": {"podUID": uid}, "status": status}


class Seen:
    """What a watch handed over: (name, version or None, deleted)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str | None, bool]] = []
        self.objects: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, obj: dict[str, Any], deleted: bool) -> None:
        meta = obj["metadata"]
        with self.lock:
            self.items.append((meta["name"], meta.get("resourceVersion"), deleted))
            self.objects.append(obj)

    def has(self, item: tuple[str, str | None, bool]) -> bool:
        with self.lock:
            return item in self.items


# --- the sink (no API server) ---------------------------------------------------------


def test_events_are_handed_over_without_managed_fields() -> None:
    seen = Seen()
    sink = RecordSink(seen)
    sink.changed("ADDED", _record("a", "1"))
    sink.changed("MODIFIED", _record("a", "2", phase="Remediating"))
    sink.changed("DELETED", _record("a", "3"))
    assert seen.items == [("a", "1", False), ("a", "2", False), ("a", "3", True)]
    assert all("managedFields" not in o["metadata"] for o in seen.objects)
    assert seen.objects[1]["status"] == {"phase": "Remediating"}
    assert sink.size() == 0


def test_a_relist_hands_over_only_what_changed_and_what_went() -> None:
    """A relist (after a 410, or a reconnect) hands over the records whose version is new
    to the watch, and — as deleted, a stub with the pod uid — those known before and not
    listed again (deleted while the watch was down); an unchanged record is not handed
    over again."""
    seen = Seen()
    sink = RecordSink(seen)
    for relist in ([_record("a", "1"), _record("b", "1")], [_record("a", "1"), _record("c", "5")]):
        sink.relist_begin()
        for obj in relist:
            sink.listed(obj)
        sink.relist_end()
    assert seen.items == [("a", "1", False), ("b", "1", False), ("c", "5", False), ("b", "1", True)]
    assert seen.objects[-1]["spec"] == {"podUID": "uid-1"}
    assert sink.size() == 2


# --- against the real API server --------------------------------------------------------


@pytest.mark.envtest
def test_the_watch_relists_after_410_and_keeps_delivering(
    control_plane: ControlPlane, objects: Objects, namespace: str
) -> None:
    """The first list reports resourceVersion "1": the real API server answers the watch
    from it 410 Gone; the loop relists and follows the records from then on."""
    body = remediation("p", "uid-p", "n1", name="p-before")
    objects.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "remediations", body)
    seen = Seen()
    kube = StaleFirstList(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    watch = RemediationWatch(kube, (namespace,), seen, watch_timeout_s=5)
    watch.start()
    try:
        loop = watch.loops[0]
        wait_until(lambda: loop.stats.lists >= 2, timeout=30, what="a relist after 410")
        assert loop.stats.expired >= 1 and watch.synced()
        # listed twice, handed over once: its version did not change
        assert [i[2] for i in seen.items if i[0] == "p-before"] == [False]
        after = remediation("q", "uid-q", "n1", name="q-after")
        objects.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "remediations", after
        )
        write_as_agent(objects, namespace, after, {"nodeStepsDoneAt": "2026-01-01T00:00:00Z"})
        objects.custom.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "remediations", "p-before"
        )
        wait_until(
            lambda: any(i[0] == "p-before" and i[2] for i in seen.items),
            timeout=30,
            what="the deletion",
        )
        with seen.lock:
            q = [o for o in seen.objects if o["metadata"]["name"] == "q-after"]
        assert q and (q[-1].get("status") or {}).get("nodeStepsDoneAt")
        assert all("managedFields" not in o["metadata"] for o in q)
    finally:
        watch.stop()
    assert not any(loop._thread.is_alive() for loop in watch.loops)


@pytest.mark.envtest
def test_the_controller_relists_after_410_and_acts_on_the_agents_answer(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """After the relist, the agent's probe (nothing of the pod left on its node) reaches
    the controller through its Remediation watch: it decides KubeletNotProgressing,
    force-deletes the pod and marks the record Resolved."""
    wait_until(
        lambda: "remediation watch: resourceVersion expired (410 Gone)" in controller.log(),
        timeout=30,
        what="the relist",
    )
    node = objects.ready_node(make_node)
    pod = objects.stuck_pod(namespace, node, remediate=POLICY)
    rem = objects.remediation_when(namespace, pod, timeout=60, what="the pod's record")
    write_as_agent(objects, namespace, rem, {"probe": agent_probe(node, [], pod["uid"])})
    objects.pod_gone(namespace, pod, timeout=60, what="force-delete")
    status = objects.remediation_when(
        namespace, pod, timeout=30, what="Resolved", phase="Resolved"
    )["status"]
    assert status["cause"] == "KubeletNotProgressing"
    assert controller.alive()


def test_no_kopf_handler_for_remediations() -> None:
    """Kopf keeps the lifecycle, the probes and the policy handlers (design.md §5)."""
    from unstick.controller.operator import build_registry

    registry = build_registry()
    selectors = [h.selector for h in registry._watching.get_all_handlers()]
    watched = {s.any_name or s.plural for s in selectors if s is not None}
    assert watched == {"remediationpolicies"}
