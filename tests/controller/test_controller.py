"""The controller against a real kube-apiserver + etcd (+ kwok), run as `unstick controller`
in a subprocess. A pod on a node without kubelet stays Terminating for real: the stuck pod."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support import audit_log
from tests.support.audit_log import Match, received_at
from tests.support.controller import (
    USER_AGENT_PREFIX,
    Controller,
    Objects,
    controller_pod_writes,
    policy_spec,
)
from unstick.controller.deciding.decision import RATE_LIMITED
from unstick.core.remediation import pod_label
from unstick.kube import actions
from unstick.kube.client import ClientSettings, Kube

pytestmark = pytest.mark.envtest

POLICIES = {
    "default": policy_spec(),  # pods that did not name a policy take their timing from it
    "t-remediate": policy_spec(),
    "t-dryrun": policy_spec(dryRun=True),
    "t-allow-fin": policy_spec(finalizerAllowlist=["example.com/keep"]),
    # 10 per minute on a node only: the cluster-wide window is shared by every policy and
    # the strictest limit in it holds (design.md §3 invariant 6), so a cluster limit of 10
    # would hold back the next tests' pods (other policies, other nodes) for up to a minute
    "t-ratelimited": policy_spec(rateLimits={"clusterPerMinute": 1000, "nodePerMinute": 10}),
}


def _actions(status: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [a for a in status.get("actions") or [] if a.get("action") == action]


def test_node_gone_opted_in_pod_is_force_deleted(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    pod = objects.stuck_pod(
        namespace, make_node(kubelet=False), remediate="t-remediate", node_gone=True
    )
    objects.pod_gone(namespace, pod, timeout=60, what="force-delete")
    # Its node's incident tells its story (docs/incidents.md), found by the pod's name.
    incident = objects.remediation_when(
        namespace,
        pod,
        incident=True,
        timeout=30,
        what="the node incident Resolved",
        phase="Resolved",
    )
    status = incident["status"]
    assert status["cause"] == "NodeGone" and incident["spec"]["incident"] == "NodeGone"
    assert status["podCount"] == status["podsGone"] == 1
    entry = objects.incident_entry(namespace, pod)
    assert (entry["action"], entry["result"], entry["name"]) == (
        "force-delete",
        "succeeded",
        pod["name"],
    )
    assert entry.get("goneAt") and entry.get("time")
    assert objects.remediation(namespace, pod) is None  # no per-pod record besides
    deletes = [e for e in controller_pod_writes(controller.cp, namespace) if e["verb"] == "delete"]
    assert len(deletes) == 1

    def reasons() -> list[str]:
        events = objects.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={incident['metadata']['name']}"
        ).items
        return sorted(e.reason for e in events)

    wait_until(lambda: len(reasons()) >= 2, timeout=30, what="the incident's two Events")
    assert reasons() == ["IncidentResolved", "StuckNodeGone"]
    assert (
        controller.sample(
            "unstick_remediations_total",
            action="force-delete",
            cause="NodeGone",
            result="succeeded",
        )
        >= 1
    )
    assert controller.sample("unstick_time_to_resolution_seconds_count") >= 1
    assert controller.sample("unstick_detection_lag_seconds_count") >= 1
    lag = controller.sample("unstick_detection_lag_seconds_sum")
    ttr = controller.sample("unstick_time_to_resolution_seconds_sum")
    print(f"detection lag {lag:.2f}s, deletionTimestamp → gone {ttr:.2f}s (grace 1s, slack 1s)")


def test_not_opted_in_pod_is_observed_only(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    pod = objects.stuck_pod(namespace, make_node(kubelet=False), remediate=None, node_gone=True)
    status = objects.remediation_when(
        namespace, pod, timeout=60, what="Remediation observing", phase="Observing"
    )["status"]
    assert status["cause"] == "NodeGone"
    assert status["optedIn"] is False
    assert objects.read_pod(namespace, pod["name"]) is not None
    assert controller_pod_writes(controller.cp, namespace) == []
    events = objects.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod['name']}"
    ).items
    assert [e.reason for e in events] == ["StuckNodeGone"]
    assert controller.sample("unstick_stuck_pods", namespace=namespace, cause="NodeGone") == 1


def test_dry_run_counts_and_changes_nothing(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    pod = objects.stuck_pod(
        namespace, make_node(kubelet=False), remediate="t-dryrun", node_gone=True
    )
    status = objects.remediation_when(
        namespace, pod, timeout=60, what="Remediation DryRun", phase="DryRun"
    )["status"]
    assert [a["result"] for a in _actions(status, "force-delete")] == ["dry_run"]
    assert objects.read_pod(namespace, pod["name"]) is not None
    assert controller_pod_writes(controller.cp, namespace) == []
    assert (
        controller.sample(
            "unstick_remediations_total", action="force-delete", cause="NodeGone", result="dry_run"
        )
        >= 1
    )


def _set_not_ready(objects: Objects, node: str) -> None:
    long_ago = "2020-01-01T00:00:00Z"
    objects.core.patch_node_status(
        node,
        {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "KubeletStoppedPosting",
                        "message": "test: node lost",
                        "lastHeartbeatTime": long_ago,
                        "lastTransitionTime": long_ago,
                    }
                ]
            }
        },
    )


def test_unreachable_node_only_after_out_of_service_taint(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    node = make_node(kubelet=False)
    _set_not_ready(objects, node)
    pod = objects.stuck_pod(namespace, node, remediate="t-remediate")
    status = objects.remediation_when(
        namespace, pod, timeout=60, what="diagnosis NodeUnreachable", cause="NodeUnreachable"
    )["status"]
    objects.remediation_when(namespace, pod, timeout=30, what="observing", phase="Observing")
    assert "force-delete" in [r["action"] for r in status.get("refused") or []]
    assert objects.read_pod(namespace, pod["name"]) is not None
    assert controller_pod_writes(controller.cp, namespace) == []

    taint = {
        "key": "node.kubernetes.io/out-of-service",
        "value": "nodeshutdown",
        "effect": "NoExecute",
    }
    objects.core.patch_node(node, {"spec": {"taints": [taint]}})
    objects.pod_gone(namespace, pod, timeout=60, what="force-delete (fenced)")


def test_finalizer_removed_only_when_allowlisted(
    controller: Controller, objects: Objects, namespace: str
) -> None:
    # Unscheduled pods are deleted at once (grace 0): only the finalizers keep them.
    allowed = objects.pod(namespace, None, remediate="t-allow-fin", finalizers=["example.com/keep"])
    foreign = objects.pod(
        namespace, None, remediate="t-allow-fin", finalizers=["example.com/other"]
    )
    for pod in (allowed, foreign):
        objects.core.delete_namespaced_pod(pod["name"], namespace)
    objects.pod_gone(namespace, allowed, timeout=60, what="finalizer removal")
    status = objects.remediation_when(
        namespace, foreign, timeout=60, what="foreign finalizer observed", phase="Observing"
    )["status"]
    assert status["cause"] == "FinalizerBlocked"
    left = objects.read_pod(namespace, foreign["name"])
    assert left is not None and left.metadata.finalizers == ["example.com/other"]
    writes = controller_pod_writes(controller.cp, namespace)
    assert [(w["verb"], w["objectRef"]["name"]) for w in writes] == [("patch", allowed["name"])]


def test_no_writes_for_healthy_pods_and_pods_within_grace(
    controller: Controller, objects: Objects, namespace: str, make_node: Any, kwok: Any
) -> None:
    served = make_node(kubelet=True)
    lost = make_node(kubelet=False)
    running = [objects.pod(namespace, served, remediate="t-remediate") for _ in range(20)]
    wait_until(
        lambda: all(
            (p := objects.read_pod(namespace, r["name"])) and p.status.phase == "Running"
            for r in running
        ),
        timeout=90,
        what="kwok runs the healthy pods",
    )
    within = objects.stuck_pod(namespace, lost, remediate="t-remediate", grace=3600)
    # A later stuck pod, seen through the same ordered watch, proves the controller saw
    # everything before it.
    marker = objects.stuck_pod(namespace, make_node(kubelet=False), remediate=None, node_gone=True)
    objects.remediation_when(namespace, marker, timeout=60, what="marker", phase="Observing")
    assert objects.remediation(namespace, within) is None
    assert controller_pod_writes(controller.cp, namespace) == []


def test_restart_does_not_act_twice(
    control_plane: ControlPlane,
    controller: Controller,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
) -> None:
    # force-delete succeeds, then a foreign finalizer keeps the pod: it stays stuck.
    pod = objects.stuck_pod(
        namespace,
        make_node(kubelet=False),
        remediate="t-remediate",
        finalizers=["example.com/other"],
        node_gone=True,
    )
    objects.remediation_when(
        namespace,
        pod,
        timeout=60,
        what="FinalizerBlocked after the force-delete",
        cause="FinalizerBlocked",
    )
    controller.stop()
    second = Controller(control_plane, tmp_path / "second.log")
    try:
        second.start()
        wait_until(
            lambda: (
                second.sample("unstick_stuck_pods", namespace=namespace, cause="FinalizerBlocked")
                == 1
            ),
            timeout=60,
            what="the restarted controller to diagnose the pod",
        )
        deletes = [
            e for e in controller_pod_writes(control_plane, namespace) if e["verb"] == "delete"
        ]
        assert len(deletes) == 1
        # The force-delete is on record in the node incident (the pod's own record, made
        # when it stayed, is FinalizerBlocked), and was not done again.
        entry = objects.incident_entry(namespace, pod)
        assert (entry.get("action"), entry.get("result")) == ("force-delete", "succeeded")
        assert _actions(objects.status(namespace, pod), "force-delete") == []
    finally:
        second.stop()
        print(second.log()[-3000:])
        controller.start()  # back for the rest of the module


def test_rate_limit_holds_under_200_stuck_pods(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    node = make_node(kubelet=False)
    pods = [objects.pod(namespace, node, remediate="t-ratelimited") for _ in range(200)]
    objects.core.delete_node(node)
    objects.core.delete_collection_namespaced_pod(namespace)
    names = {p["name"] for p in pods}

    def deletes() -> list[dict[str, Any]]:
        return [
            e
            for e in controller_pod_writes(controller.cp, namespace)
            if e["verb"] == "delete" and e["objectRef"].get("name") in names
        ]

    wait_until(lambda: len(deletes()) >= 10, timeout=60, what="the first minute's deletes")
    # The node's budget is spent; a pod of another node is not held back by it.
    other = objects.stuck_pod(
        namespace, make_node(kubelet=False), remediate="t-remediate", node_gone=True
    )
    objects.pod_gone(namespace, other, timeout=60, what="the other node's pod")
    other_deleted = [
        received_at(e)
        for e in controller_pod_writes(controller.cp, namespace)
        if e["verb"] == "delete" and e["objectRef"].get("name") == other["name"]
    ]
    wait_until(
        lambda: len(deletes()) >= 11,
        timeout=150,
        what="the window to move on and more deletes to happen",
    )
    times = sorted(received_at(e) for e in deletes())
    assert len(other_deleted) == 1 and other_deleted[0] < times[10], (other_deleted, times)
    # Budget: 10 per minute, a sliding window: no 60 s window holds more than 10 deletes
    # (the 11th comes only once the first has left the window). The audit log times a
    # request's completion, the budget its decision: 1 s of slack for that.
    for i, start in enumerate(times):
        in_window = [t for t in times[i:] if t - start < 59.0]
        assert len(in_window) <= 10, (start, in_window)
    waiting = [p for p in pods if objects.read_pod(namespace, p["name"]) is not None]
    assert len(waiting) >= 150  # the rest wait for budget; none is dropped:
    incident = objects.remediation_when(
        namespace,
        waiting[0],
        lambda i: (
            (i.get("status") or {}).get("podCount", 0) >= len(waiting)
            and i["status"].get("waitingFor") == RATE_LIMITED
        ),
        incident=True,
        timeout=30,
        what="the waiting pods listed in their node's incident, waiting for the budget",
    )
    listed = {e["uid"]: e for e in incident["status"]["pods"]}
    assert all(p["uid"] in listed for p in waiting)
    print(f"rate limit: {len(times)} deletes in {times[-1] - times[0]:.1f}s")


def test_watch_recovers_after_api_server_restart(
    control_plane: ControlPlane,
    controller: Controller,
    objects: Objects,
    namespace: str,
    make_node: Any,
) -> None:
    control_plane.restart_apiserver()
    pod = objects.stuck_pod(
        namespace, make_node(kubelet=False), remediate="t-remediate", node_gone=True
    )
    objects.pod_gone(namespace, pod, timeout=120, what="force-delete after the API server restart")
    assert controller.alive()


def test_schema_rejects_invalid_policy(objects: Objects) -> None:
    with pytest.raises(ApiException) as err:
        objects.create_policy("t-invalid", policy_spec(actions=["explode"], slackSeconds=-1))
    assert err.value.status == 422
    assert "explode" in str(err.value.body)


def test_a_deleted_nodes_pods_share_one_incident_and_cost_one_delete_each(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """design.md §3 still holds for each pod (fresh Node read, UID and resourceVersion
    preconditions), but a node's outage is one record and two Events, not one per pod:
    each opted-in pod costs its DELETE and nothing else. A pod that stays (not opted in)
    keeps its own record and Event."""
    nodes = [make_node(kubelet=False) for _ in range(2)]
    per_node = 8  # within the default cap of 10 actions per node per minute
    pods = {
        n: [objects.pod(namespace, n, remediate="t-remediate") for _ in range(per_node)]
        for n in nodes
    }
    watched = objects.pod(namespace, nodes[0])  # not opted in: observed, stays
    for n in nodes:
        objects.core.delete_node(n)
    opted = [p for ps in pods.values() for p in ps]
    for p in [*opted, watched]:
        objects.core.delete_namespaced_pod(p["name"], namespace)
    wait_until(
        lambda: all(objects.read_pod(namespace, p["name"]) is None for p in opted),
        timeout=60,
        what="every opted-in pod force-deleted",
    )
    incidents = {}
    for node, ps in pods.items():
        inc = wait_until(
            lambda ps=ps: (
                (i := objects.incident(namespace, ps[0]))
                and (i.get("status") or {}).get("podsGone") == len(ps)
                and i
            ),
            timeout=30,
            what=f"the incident of {node} with all its pods gone",
        )
        assert inc["spec"] == {"nodeName": node, "incident": "NodeGone", "dryRun": False}
        assert inc["status"]["phase"] == "Resolved"
        assert {e["uid"] for e in inc["status"]["pods"]} == {p["uid"] for p in ps}
        assert {(e["action"], e["result"]) for e in inc["status"]["pods"]} == {
            ("force-delete", "succeeded")
        }
        for p in ps:  # each pod's story is found by its name
            assert [r["metadata"]["name"] for r in objects.records_of(namespace, p["name"])] == [
                inc["metadata"]["name"]
            ]
        incidents[node] = inc["metadata"]["name"]
    # the pod that stays has its own record (observing) and its own Event
    status = objects.remediation_when(
        namespace, watched, timeout=30, what="the not-opted-in pod observed", phase="Observing"
    )["status"]
    assert status["cause"] == "NodeGone" and objects.incident(namespace, watched) is None

    requests = audit_log.requests(controller.cp, by=USER_AGENT_PREFIX)
    for p in opted:
        about_pod = [e["verb"] for e in requests if Match(resource="pods", name=p["name"])(e)]
        assert about_pod == ["delete"], (p["name"], about_pod)
    events = objects.core.list_namespaced_event(namespace).items
    about = {e.involved_object.name for e in events}
    assert not about & {p["name"] for p in opted}  # no Event per force-deleted pod
    assert set(incidents.values()) <= about and watched["name"] in about
    created = Match(verbs={"create"}, resource="remediations", namespace=namespace)
    creates = [e for e in requests if created(e)]
    assert len(creates) == 3  # two incidents and the watched pod's record
    out = subprocess.run(
        [
            str(controller.cp.bin_dir / "kubectl"),
            f"--kubeconfig={controller.cp.kubeconfig}",
            "get",
            "remediations",
            "-A",
            "-l",
            pod_label(opted[0]["name"]),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    print(out)
    assert incidents[nodes[0]] in out and "NodeGone" in out and "Resolved" in out


def test_a_delete_decided_from_an_older_version_of_the_pod_is_refused(
    control_plane: ControlPlane, objects: Objects, namespace: str, make_node: Any
) -> None:
    """The incident path reads no pod before its DELETE: the resourceVersion it decided
    from is a precondition, so a pod changed meanwhile (an owner opting out, a finalizer
    added) is not deleted on stale facts."""
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    try:
        pod = objects.pod(namespace, make_node(kubelet=False), remediate="t-remediate")
        seen = kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod['name']}") or {}
        version = seen["metadata"]["resourceVersion"]
        objects.core.patch_namespaced_pod(
            pod["name"],
            namespace,
            {"metadata": {"annotations": {"unstick.dev/remediate": "false"}}},
        )
        stale = actions.force_delete(kube, namespace, pod["name"], pod["uid"], version)
        assert stale.result == "conflict" and objects.read_pod(namespace, pod["name"]) is not None
        now = kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod['name']}") or {}
        fresh = actions.force_delete(
            kube, namespace, pod["name"], pod["uid"], now["metadata"]["resourceVersion"]
        )
        assert fresh.result == "succeeded" and objects.read_pod(namespace, pod["name"]) is None
    finally:
        kube.close()


def test_pods_of_a_node_already_fenced_go_into_its_incident(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """NodeUnreachable with the out-of-service taint when the pods become stuck: force-
    deleted (fenced), recorded in one NodeUnreachable incident, the taint re-read fresh."""
    node = make_node(kubelet=False)
    _set_not_ready(objects, node)
    taint = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown"}
    objects.core.patch_node(node, {"spec": {"taints": [{**taint, "effect": "NoExecute"}]}})
    pods = [objects.pod(namespace, node, remediate="t-remediate") for _ in range(3)]
    for p in pods:
        objects.core.delete_namespaced_pod(p["name"], namespace)
    wait_until(
        lambda: all(objects.read_pod(namespace, p["name"]) is None for p in pods),
        timeout=60,
        what="the fenced node's pods force-deleted",
    )
    incident = objects.remediation_when(
        namespace,
        pods[0],
        incident=True,
        timeout=30,
        what="the NodeUnreachable incident with its pods gone",
        podsGone=len(pods),
    )
    assert incident["spec"]["incident"] == "NodeUnreachable"
    assert "fenced" in " ".join(e["message"] for e in incident["status"]["evidence"])
    assert all(objects.remediation(namespace, p) is None for p in pods)
