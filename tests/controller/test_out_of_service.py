"""taint-out-of-service / untaint-out-of-service (docs/fencing.md) on a real kube-apiserver,
every request made with the chart's own RBAC (tests/support/chart_rbac.py: the controller's
ServiceAccount token, the ClusterRole rendered with the policy listing both actions). Only
the test that writes FAR records needs the real FAR v0.7.0 CRD (`medik8s` of
tests/controller/conftest.py: skipped without ../shared/thirdparty); the others run
without it (the policy still names FAR's namespace; a CRD not installed is no record). The
passes run in this process (`OutOfService.run_once`, one at a time: no waiting for a
period), but the crash test, which runs the real controller and SIGKILLs it between the
record and the act.

The NotReady nodes are written as the node lifecycle controller writes them (Ready
Unknown since ten minutes ago) and the cloud provider's proof as its node lifecycle
controller sets it (the taint node.cloudprovider.kubernetes.io/shutdown)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devcluster import ControlPlane
from devcluster.process import Process, wait_until
from tests.controller import test_fencing_records as fencing
from tests.controller.conftest import FAR_NS  # the fixtures: `far_namespace`, `medik8s`
from tests.support.chart_rbac import controller_kubeconfig
from tests.support.controller import (
    Controller,
    Objects,
    node_ready,
    node_unknown,
    policy_spec,
)
from unstick.commands.status import gather, render
from unstick.controller import failpoints
from unstick.controller.deciding.policies import PolicyBook
from unstick.controller.incidents.out_of_service import OutOfService
from unstick.controller.records.events import EventQueue
from unstick.core.model.facts import CLOUD_SHUTDOWN_TAINT, OUT_OF_SERVICE_TAINT
from unstick.core.policy.out_of_service import APPLIED_ANNOTATION, node_state
from unstick.kube.client import ClientSettings, Kube

pytestmark = pytest.mark.envtest

_far = fencing._far

NS = f"t-oos-{uuid.uuid4().hex[:6]}"  # the controller's namespace: its taint records
ACTIONS = ["observe", "taint-out-of-service", "untaint-out-of-service"]
SPEC = policy_spec(
    actions=ACTIONS,
    fencingEvidence=["cloudShutdown", "fenceAgentsRemediation"],
    fenceAgentsRemediationNamespaces=[FAR_NS],
    maxNotReadyPercent=100,
)
POLICIES = {"default": SPEC}
SETS = (
    "policy.actions={observe,taint-out-of-service,untaint-out-of-service}",
    f"policy.fenceAgentsRemediationNamespaces={{{FAR_NS}}}",
)


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def chart_kube(
    control_plane: ControlPlane, far_namespace: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kube]:
    """Unstick's client as the chart's controller ServiceAccount (release in NS; its Role
    to read FARs in FAR's namespace)."""
    admin = far_namespace
    admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
    path = tmp_path_factory.mktemp("rbac") / "kubeconfig"
    try:
        with controller_kubeconfig(control_plane, NS, path, *SETS) as kubeconfig:
            kube = Kube(ClientSettings(kubeconfig=str(kubeconfig)))
            yield kube
            kube.close()
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{NS}")


@pytest.fixture
def run_pass(
    chart_kube: Kube, control_plane: ControlPlane, objects: Objects
) -> Iterator[Callable[..., Any]]:
    """One pass of the node-level actions under `default` = SPEC with `overrides` (the
    CRDs installed by `objects`); the records it wrote are deleted at the end."""
    queues: list[EventQueue] = []

    def run(kube: Kube = chart_kube, **overrides: Any) -> OutOfService:
        book = PolicyBook()
        assert book.update("default", {"spec": {**SPEC, **overrides}}) is None
        events = EventQueue(kube)
        queues.append(events)
        oos = OutOfService(kube, book, lambda: kube.list_all("/api/v1/nodes"), events, namespace=NS)
        oos.run_once()
        return oos

    try:
        yield run
    finally:
        for events in queues:
            events.close()
        control_plane.kubectl("delete", "remediations", "--all", "-n", NS, check=False)


def _lost(core: Any, make_node: Any, *, proof: bool = True) -> str:
    """A node NotReady (Ready Unknown) since ten minutes ago; with `proof`, the cloud
    provider says its instance is shut down."""
    node = make_node(kubelet=False)
    node_unknown(core, node, _iso(datetime.now(UTC) - timedelta(minutes=10)))
    if proof:
        _add_taint(core, node, {"key": CLOUD_SHUTDOWN_TAINT, "effect": "NoSchedule"})
    return node


def _add_taint(core: Any, node: str, taint: dict[str, Any]) -> None:
    taints = core.read_node(node).to_dict()["spec"].get("taints") or []
    now = _iso(datetime.now(UTC))
    keep = [
        {"key": t["key"], "value": t.get("value"), "effect": t["effect"],
         **({"timeAdded": _iso(t["time_added"])} if t.get("time_added") else {})}
        for t in taints
    ]  # fmt: skip
    core.patch_node(node, {"spec": {"taints": [*keep, {"timeAdded": now, **taint}]}})


def _state(kube: Kube, node: str) -> Any:
    obj = kube.get(f"/api/v1/nodes/{node}")
    assert obj is not None
    return node_state(obj)


def _records(kube: Kube, node: str) -> list[dict[str, Any]]:
    items = kube.list_all(
        f"/apis/unstick.dev/v1alpha1/namespaces/{NS}/remediations",
        {"labelSelector": f"unstick.dev/node={node}"},
    )
    return sorted(items, key=lambda r: r["metadata"]["creationTimestamp"])


def _oos(kube: Kube, node: str) -> list[Any]:
    return list(_state(kube, node).out_of_service)


def test_a_notready_node_without_proof_is_never_tainted(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any
) -> None:
    node = _lost(core_api, make_node, proof=False)
    oos = run_pass()
    run_pass()
    assert _oos(chart_kube, node) == [] and _records(chart_kube, node) == []
    assert "no proof that node" in oos.said[node] and "silence is not proof" in oos.said[node]


def test_proven_off_tainted_with_its_evidence_and_untainted_only_once_nothing_is_left(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any, objects: Objects,
    namespace: str,
) -> None:  # fmt: skip
    node = _lost(core_api, make_node)
    pod = objects.stuck_pod(namespace, node)  # stays Terminating: no kubelet
    run_pass()
    state = _state(chart_kube, node)
    [taint] = state.out_of_service
    assert (taint.value, taint.effect) == ("nodeshutdown", "NoExecute")
    assert state.unstick_taint == taint and state.applied is not None
    mark = json.loads(core_api.read_node(node).metadata.annotations[APPLIED_ANNOTATION])
    assert mark["source"] == "cloudShutdown"
    assert mark["object"] == f"taint {CLOUD_SHUTDOWN_TAINT}" and mark["evidenceTime"]
    [record] = _records(chart_kube, node)
    assert mark["record"] == f"{NS}/{record['metadata']['name']}"
    assert record["spec"]["incident"] == "NodeOutOfService"
    assert record["status"]["phase"] == "Remediating"
    [act] = record["status"]["actions"]
    assert (act["action"], act["result"]) == ("taint-out-of-service", "succeeded")
    screen = render(gather(chart_kube, time.time()), wide=True)  # `unstick status`
    assert f"  {node}: out-of-service taint applied by unstick" in screen, screen
    assert f"evidence: taint {CLOUD_SHUTDOWN_TAINT} is present" in screen, screen

    # back: Ready, the cloud's taint gone; a pod of it still Terminating, an attachment left
    node_ready(objects, node)
    core_api.patch_node(node, {"spec": {"taints": [taint.entry()]}})
    attachment = f"csi-{uuid.uuid4().hex}"
    storage = client.StorageV1Api(objects.api_client)
    storage.create_volume_attachment(
        {"metadata": {"name": attachment},
         "spec": {"attacher": "t.example.com", "nodeName": node,
                  "source": {"persistentVolumeName": "pv-t"}}}
    )  # fmt: skip
    try:
        run_pass()
        assert _oos(chart_kube, node) == [taint]
        waiting = _records(chart_kube, node)[0]["status"]["waitingFor"]
        assert f"pod {namespace}/{pod['name']} Terminating" in waiting, waiting
        assert f"VolumeAttachment {attachment}" in waiting, waiting
        core_api.delete_namespaced_pod(pod["name"], namespace, grace_period_seconds=0)
        run_pass()
        assert _oos(chart_kube, node) == [taint]
        assert "pod" not in _records(chart_kube, node)[0]["status"]["waitingFor"]
    finally:
        storage.delete_volume_attachment(attachment)
    run_pass()
    state = _state(chart_kube, node)
    assert state.out_of_service == () and state.applied is None
    [record] = _records(chart_kube, node)
    assert record["status"]["phase"] == "Resolved"
    last = record["status"]["actions"][-1]
    assert (last["action"], last["result"]) == ("untaint-out-of-service", "succeeded")


def _deletion_asked(core: Any, namespace: str, name: str) -> datetime:
    meta = core.read_namespaced_pod(name, namespace).metadata
    return meta.deletion_timestamp - timedelta(seconds=meta.deletion_grace_period_seconds or 0)


def _evicted_by_the_taint(core: Any, namespace: str, name: str) -> None:
    """What the taint manager does before it deletes a pod: a True DisruptionTarget."""
    core.patch_namespaced_pod_status(name, namespace, {"status": {"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
         "message": "Taint manager: deleting due to NoExecute taint"}]}})  # fmt: skip


def test_the_taints_own_evictions_after_the_node_is_ready_again_do_not_hold_it(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any, objects: Objects,
    namespace: str,
) -> None:  # fmt: skip
    """Once the node is back, the NoExecute taint evicts every pod bound to it by name that
    does not tolerate it, each time its owner makes it again (the fencing benchmark's CSI
    node plugin): a pod of the node is nearly always Terminating. Those are its kubelet's
    to finish; the removal waits for every other Terminating pod — the incident's, and one
    deleted by anybody else after the node was Ready."""
    node = _lost(core_api, make_node)
    early = objects.stuck_pod(namespace, node)  # the incident's: deleted while down
    run_pass()
    [taint] = _oos(chart_kube, node)
    ready = _deletion_asked(core_api, namespace, early["name"]) + timedelta(seconds=1)
    core_api.patch_node_status(node, {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
         "lastHeartbeatTime": _iso(ready), "lastTransitionTime": _iso(ready)}]}})  # fmt: skip
    core_api.patch_node(node, {"spec": {"taints": [taint.entry()]}})  # the cloud's taint off
    wait_until(lambda: datetime.now(UTC) >= ready + timedelta(seconds=1), timeout=5,
               what="the clock past the node's Ready")  # fmt: skip
    later = objects.pod(namespace, node)  # evicted by the taint once the node is back
    _evicted_by_the_taint(core_api, namespace, later["name"])
    core_api.delete_namespaced_pod(later["name"], namespace)
    other = objects.stuck_pod(namespace, node)  # deleted by somebody else since
    for pod in (later, other):
        assert _deletion_asked(core_api, namespace, pod["name"]) > ready
    run_pass()
    assert _oos(chart_kube, node) == [taint]
    waiting = _records(chart_kube, node)[0]["status"]["waitingFor"]
    for held in (early, other):
        assert f"pod {namespace}/{held['name']} Terminating" in waiting, waiting
    assert later["name"] not in waiting, waiting
    for held in (early, other):
        core_api.delete_namespaced_pod(held["name"], namespace, grace_period_seconds=0)
    run_pass()
    assert _oos(chart_kube, node) == [] and _state(chart_kube, node).applied is None
    [record] = _records(chart_kube, node)
    last = record["status"]["actions"][-1]
    assert (last["action"], last["result"]) == ("untaint-out-of-service", "succeeded")
    assert f"its kubelet's to finish: pod {namespace}/{later['name']}" in last["message"], last
    assert core_api.read_namespaced_pod(later["name"], namespace).metadata.deletion_timestamp


@pytest.fixture
def node_lifecycle(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Process]:
    """kube-controller-manager (bin/, v1.36) running only its node lifecycle controller,
    with short grace periods: a node whose kubelet never posts status goes Ready Unknown
    within seconds, written by the real controller."""
    argv = [
        str(control_plane.bin_dir / "kube-controller-manager"),
        f"--kubeconfig={control_plane.kubeconfig}",
        "--controllers=node-lifecycle-controller",
        "--leader-elect=false",
        "--secure-port=0",
        "--node-monitor-period=1s",
        "--node-monitor-grace-period=3s",
        "--node-startup-grace-period=3s",
        "--v=2",
    ]
    process = Process("kube-controller-manager", argv, tmp_path / "kcm.log").start()
    try:
        yield process
    finally:
        process.stop()
        print(process.log_tail(40))


def test_the_node_lifecycle_controllers_notready_is_tainted_only_with_proof(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any, node_lifecycle: Process
) -> None:
    proven, silent = make_node(kubelet=False), make_node(kubelet=False)
    _add_taint(core_api, proven, {"key": CLOUD_SHUTDOWN_TAINT, "effect": "NoSchedule"})

    def unknown(node: str) -> bool:
        ready = _state(chart_kube, node).facts.ready
        return ready is not None and ready.status == "Unknown"

    wait_until(
        lambda: unknown(proven) and unknown(silent),
        timeout=60,
        what="the node lifecycle controller marking both nodes Ready Unknown",
        process=node_lifecycle,
    )
    oos = run_pass()
    assert [t.effect for t in _oos(chart_kube, proven)] == ["NoExecute"]
    assert _oos(chart_kube, silent) == [] and _records(chart_kube, silent) == []
    assert "silence is not proof" in oos.said[silent]


def test_two_of_three_nodes_down_at_most_max_fenced_nodes_tainted(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any
) -> None:
    down = [_lost(core_api, make_node), _lost(core_api, make_node)]
    make_node(kubelet=False)  # the third, never NotReady
    oos = run_pass()
    run_pass()
    tainted = [n for n in down if _oos(chart_kube, n)]
    assert len(tainted) == 1
    [held] = [n for n in down if n not in tainted]
    assert "maxFencedNodes is 1" in oos.said[held], oos.said
    assert _records(chart_kube, held) == []


def test_too_many_notready_nodes_none_tainted(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any
) -> None:
    down = [_lost(core_api, make_node), _lost(core_api, make_node)]
    make_node(kubelet=False)
    states = [node_state(o) for o in chart_kube.list_all("/api/v1/nodes")]
    share = 100 * sum(1 for s in states if not s.ready) // len(states)  # >= 2 of 3 (66%)
    oos = run_pass(maxNotReadyPercent=share - 1, maxFencedNodes=3)
    for node in down:
        assert _oos(chart_kube, node) == [] and _records(chart_kube, node) == []
        assert "a zone or control-plane outage is not a node failure" in oos.said[node]


def test_far_records_that_prove_nothing_or_manage_the_node(
    run_pass: Any, chart_kube: Kube, medik8s: Kube, core_api: Any, make_node: Any
) -> None:
    far_only = {"fencingEvidence": ["fenceAgentsRemediation"]}
    other = f"t-other-{uuid.uuid4().hex[:6]}"  # a namespace the policy does not name
    medik8s.request("POST", "/api/v1/namespaces", body={"metadata": {"name": other}})
    try:
        unnamed = _lost(core_api, make_node, proof=False)
        now = datetime.now(UTC)
        medik8s.request(
            "POST",
            f"/apis/fence-agents-remediation.medik8s.io/v1alpha1/namespaces/{other}/fenceagentsremediations",
            body={"apiVersion": "fence-agents-remediation.medik8s.io/v1alpha1",
                  "kind": "FenceAgentsRemediation", "metadata": {"name": unnamed},
                  "spec": {"agent": "fence_ipmilan"}},
        )  # fmt: skip
        # a fence of an earlier incident: created and succeeded before the last Ready
        earlier = make_node(kubelet=False)
        _far(medik8s, earlier, now - timedelta(hours=1))
        node_unknown(core_api, earlier, _iso(datetime.now(UTC) + timedelta(seconds=1)))
        oos = run_pass(**far_only)
        for node in (unnamed, earlier):
            assert _oos(chart_kube, node) == [] and _records(chart_kube, node) == []
        assert "no proof that node" in oos.said[unnamed], oos.said[unnamed]
        assert "predates the node's last Ready transition" in oos.said[earlier]

        # a FAR of this incident manages the node: not raced, even with the cloud's proof
        managed = _lost(core_api, make_node)
        far = _far(medik8s, managed, now)
        oos = run_pass()
        assert _oos(chart_kube, managed) == [] and _records(chart_kube, managed) == []
        said = oos.said[managed]
        assert f"FenceAgentsRemediation {FAR_NS}/{far['metadata']['name']}" in said, said
        assert "unstick does not race it" in said
        wait_until(
            lambda: any(
                e.reason == "OutOfServiceTaintNotApplied" and e.involved_object.name == managed
                for e in core_api.list_namespaced_event("default").items
            ),
            timeout=10,
            what="the Event on the node",
        )
    finally:
        medik8s.request("DELETE", f"/api/v1/namespaces/{other}")


def test_the_node_ready_again_before_the_act_nothing_is_done(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any, objects: Objects,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    node = _lost(core_api, make_node)
    reached = failpoints.reached

    def back(point: str) -> None:  # the node comes back once the intent is on record
        if point == "taint-intent-durable":
            node_ready(objects, node)
        reached(point)

    monkeypatch.setattr(failpoints, "reached", back)
    run_pass()
    assert _oos(chart_kube, node) == []
    [record] = _records(chart_kube, node)
    assert record["status"]["phase"] == "Resolved"
    [act] = record["status"]["actions"]
    assert (act["action"], act["result"]) == ("taint-out-of-service", "refused")
    assert f"changed before acting: node {node} is Ready" in act["message"]


def test_a_taint_whose_record_is_gone_is_removed_with_its_intent_on_a_new_record(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any, objects: Objects,
    control_plane: ControlPlane,
) -> None:  # fmt: skip
    node = _lost(core_api, make_node)
    run_pass()
    [first] = _records(chart_kube, node)
    control_plane.kubectl("delete", "remediation", first["metadata"]["name"], "-n", NS)
    node_ready(objects, node)
    run_pass()
    assert _oos(chart_kube, node) == [] and _state(chart_kube, node).applied is None
    [record] = _records(chart_kube, node)
    assert [(a["action"], a["result"]) for a in record["status"]["actions"]] == [
        ("untaint-out-of-service", "succeeded")
    ]
    assert record["status"]["phase"] == "Resolved"
    assert "its record" in record["status"]["evidence"][0]["message"]


def test_without_rbac_to_patch_nodes_a_taint_is_tried_within_its_budget_only(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any, control_plane: ControlPlane,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The chart's RBAC rendered with its default policy (no taint action: no patch on
    nodes) while a policy written outside the chart lists taint-out-of-service."""
    node = _lost(core_api, make_node)
    path = tmp_path / "kubeconfig"
    with controller_kubeconfig(control_plane, NS, path, release="nopatch") as kubeconfig:
        kube = Kube(ClientSettings(kubeconfig=str(kubeconfig)))
        try:
            run_pass(kube=kube)
            oos = run_pass(kube=kube)
        finally:
            kube.close()
    assert _oos(chart_kube, node) == []
    [record] = _records(chart_kube, node)  # one try: the second pass found the budget spent
    [act] = record["status"]["actions"]
    assert (act["result"], record["status"]["phase"]) == ("failed", "Resolved")
    assert "(403)" in act["message"], act
    assert "the taint budget is spent" in oos.said[node], oos.said


def test_an_admins_taint_is_never_removed(
    run_pass: Any, chart_kube: Kube, core_api: Any, make_node: Any, objects: Objects
) -> None:
    admins = make_node(kubelet=False)
    node_ready(objects, admins)
    _add_taint(core_api, admins, {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown",
                                   "effect": "NoExecute"})  # fmt: skip
    # unstick's taint, re-applied by an admin (kubectl taint --overwrite: a new timeAdded)
    reapplied = _lost(core_api, make_node)
    run_pass()
    [ours] = _oos(chart_kube, reapplied)
    node_ready(objects, reapplied)
    later = _iso(datetime.now(UTC) + timedelta(seconds=5))
    core_api.patch_node(reapplied, {"spec": {"taints": [{**ours.entry(), "timeAdded": later}]}})
    run_pass()
    run_pass()
    assert [t.time_added for t in _oos(chart_kube, reapplied)] == [later]
    assert _state(chart_kube, reapplied).applied is None  # its mark named no taint any more
    assert len(_oos(chart_kube, admins)) == 1
    [record] = _records(chart_kube, reapplied)
    assert record["status"]["phase"] == "Resolved"
    assert record["status"]["actions"][-1]["result"] == "gone"


def test_a_crash_between_the_record_and_the_act_is_settled_by_looking(
    control_plane: ControlPlane, chart_kube: Kube, core_api: Any, make_node: Any,
    objects: Objects, tmp_path: Path,
) -> None:  # fmt: skip
    kubeconfig = tmp_path / "kubeconfig"
    with controller_kubeconfig(control_plane, NS, kubeconfig, *SETS):
        args = ("--kubeconfig", str(kubeconfig))
        env = {"POD_NAMESPACE": NS, "UNSTICK_TEST_FAILPOINTS": "taint-intent-durable=kill@1"}
        first = Controller(control_plane, tmp_path / "first.log", extra_args=args, env=env)
        second = Controller(control_plane, tmp_path / "second.log", extra_args=args,
                            env={"POD_NAMESPACE": NS})  # fmt: skip
        try:
            first.start()
            node = _lost(core_api, make_node)
            wait_until(lambda: not first.alive(), timeout=60, what="the kill at the intent")
            [record] = _records(chart_kube, node)
            assert record["status"]["actions"][-1]["result"] == "tainting"
            assert _oos(chart_kube, node) == []  # the act never happened
            second.start()
            wait_until(
                lambda: len(_records(chart_kube, node)) == 2 and _state(chart_kube, node).applied,
                timeout=60,
                what="settled, then tainted anew",
            )
            old, new = _records(chart_kube, node)
            assert old["status"]["phase"] == "Resolved"
            assert old["status"]["actions"][-1]["result"] == "withdrawn"
            assert "settled by looking" in old["status"]["actions"][-1]["message"]
            assert _state(chart_kube, node).applied.record == f"{NS}/{new['metadata']['name']}"
            assert len(_oos(chart_kube, node)) == 1
        finally:
            for ctl in (first, second):
                ctl.stop()
                print(ctl.log()[-3000:])
            control_plane.kubectl("delete", "remediations", "--all", "-n", NS, check=False)
