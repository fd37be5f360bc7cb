"""The controller's half of the agent channel, against a real API server. The test plays
the node agent: it writes `status.probe`, `status.nodeActions` and `status.nodeStepsDoneAt`
on the Remediation exactly as the agent does (a JSON merge patch of its own keys); no
kubelet or mounts are involved (that side is tested in tests/agent/)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from devcluster.process import wait_until
from tests.support.controller import (
    GROUP,
    VERSION,
    Controller,
    Objects,
    agent_probe,
    utc_now,
    write_as_agent,
)
from tests.support.controller import policy_spec as spec
from tests.support.remediations import remediation
from unstick.core.remediation import parse_time

pytestmark = pytest.mark.envtest

POLICY = "t-agent"


POLICIES = {POLICY: spec(probeMaxAgeSeconds=30)}
# The old flow on purpose, run with --no-node-round-trip: a probe request, then the
# controller's spec.nodeSteps (what an agent of the previous release answers; supported
# for one more release, docs/upgrading.md). The round trip: test_node_round_trip.py.
CONTROLLER_ARGS = ("--no-node-round-trip",)
KUBELET_FINISH_S = 3.0  # the test controller's --kubelet-finish-seconds (tests/support)


def test_probe_request_node_steps_then_force_delete(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    node = objects.ready_node(make_node)
    pod = objects.stuck_pod(namespace, node, remediate=POLICY)

    # Node state unknown: the controller asks the agent for a probe and waits.
    rem = objects.remediation_when(
        namespace,
        pod,
        lambda r: (r.get("spec") or {}).get("probeRequestedAt"),
        timeout=60,
        what="a probe request",
        phase="WaitingForAgent",
    )
    assert rem["status"]["cause"] == "Unknown"
    assert rem["metadata"]["labels"]["unstick.dev/node"] == node

    # The agent's probe: an empty volume dir of the pod is left → rmdir-stale on the node.
    stale = f"/var/lib/kubelet/pods/{pod['uid']}/volumes/kubernetes.io~empty-dir/cache"
    write_as_agent(
        objects,
        namespace,
        rem,
        {"probe": agent_probe(node, [{"path": stale, "empty": True}], pod["uid"])},
    )
    # The request (spec.nodeSteps) is written first, the pass's status (its cause) right
    # after it: a read in between sees the steps with the cause still Unknown. Wait for
    # both writes, not for the first.
    rem = objects.remediation_when(
        namespace,
        pod,
        timeout=30,
        what="node steps for the agent, and the pass that decided them on record",
        cause="StaleVolumeDirs",
        spec_has="nodeSteps",
    )
    assert rem["status"]["cause"] == "StaleVolumeDirs"
    assert [(s["action"], s["target"]) for s in rem["spec"]["nodeSteps"]] == [
        ("rmdir-stale", stale)
    ]
    requested = rem["spec"]["nodeStepsRequestedAt"]

    # The agent ran them and says so; the controller asks for a probe taken after them.
    done = utc_now()
    result = {
        "action": "rmdir-stale",
        "target": stale,
        "result": "succeeded",
        "message": "removed empty dir",
        "time": done,
    }
    write_as_agent(objects, namespace, rem, {"nodeActions": [result], "nodeStepsDoneAt": done})
    objects.remediation_when(
        namespace,
        pod,
        lambda r: r["spec"]["probeRequestedAt"] > requested,
        timeout=30,
        what="a new probe request after the node steps",
    )
    assert objects.read_pod(namespace, pod["name"]) is not None

    # A fresh probe shows nothing of the pod left: KubeletNotProgressing. The kubelet gets
    # --kubelet-finish-seconds (3 s here) after the node steps were done to finish the pod
    # itself, then force-delete. (`waitingFor` says so only while that window is open: on a
    # busy machine it may be over before the pass that decides on this probe, so the
    # record's times are checked instead of a state that may never be shown.)
    write_as_agent(objects, namespace, rem, {"probe": agent_probe(node, [], pod["uid"])})
    objects.pod_gone(namespace, pod, timeout=60, what="force-delete")
    status = objects.remediation_when(
        namespace, pod, timeout=30, what="Resolved", phase="Resolved"
    )["status"]
    recorded = [(a["action"], a["result"], a["by"]) for a in status["actions"]]
    assert ("rmdir-stale", "succeeded", "agent") in recorded
    assert ("force-delete", "succeeded", "controller") in recorded
    deleted_at = max(
        parse_time(a["time"]) for a in status["actions"] if a["action"] == "force-delete"
    )
    assert deleted_at >= parse_time(done) + KUBELET_FINISH_S, (done, status["actions"])
    assert status["cause"] == "KubeletNotProgressing"
    assert (
        controller.sample(
            "unstick_remediations_total",
            action="rmdir-stale",
            cause="StaleVolumeDirs",
            result="succeeded",
        )
        == 1
    )


# --- the trust boundary (design.md §3 invariant 7): forged and replayed records ---------------

OTHER_UID = "0badf00d-0000-4000-8000-000000000000"


def _running(objects: Objects, namespace: str, name: str) -> None:
    """pod.status says its container runs (as a kubelet would report)."""
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "containerStatuses": [
            {
                "name": "app",
                "ready": True,
                "restartCount": 0,
                "image": "registry.example/app:1",
                "imageID": "",
                "state": {"running": {"startedAt": started}},
            }
        ]
    }
    objects.core.patch_namespaced_pod_status(name, namespace, {"status": status})


def _forge(
    objects: Objects, namespace: str, name: str, spec: dict[str, Any], status: dict[str, Any]
) -> None:
    body = remediation(spec["podName"], spec["podUID"], spec["nodeName"], name=name)
    objects.record(namespace, body, status)


def _get_rem(objects: Objects, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return dict(
            objects.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "remediations", name
            )
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_forged_record_at_the_pods_name_is_refused_and_its_probe_never_used(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """Issue item 1: someone pre-creates the pod's Remediation name with another pod UID and
    a probe of that UID that shows nothing left. Before, the controller read the record by
    name, took the probe's empty container list over the API's running container →
    KubeletNotProgressing → force-delete of a running pod (split-brain)."""
    from unstick.core.remediation import alternate_name, remediation_name

    node = objects.ready_node(make_node)
    pod = objects.pod(namespace, node, remediate=POLICY, finalizers=["example.com/hold"])
    _running(objects, namespace, pod["name"])
    name = remediation_name(pod["name"], pod["uid"])
    forged_probe = agent_probe(node, [], OTHER_UID)
    _forge(
        objects,
        namespace,
        name,
        {"podName": pod["name"], "podUID": OTHER_UID, "nodeName": node},
        {"probe": forged_probe, "phase": "Remediating", "cause": "NodeGone"},
    )
    objects.core.delete_namespaced_pod(pod["name"], namespace)

    forged = wait_until(
        lambda: (
            (r := _get_rem(objects, namespace, name))
            and (r.get("status") or {}).get("phase") == "Refused"
            and r
        ),
        timeout=60,
        what="the forged record marked Refused",
    )
    (refusal,) = forged["status"]["refusals"]
    assert refusal["reason"] == "forged" and "spec.podUID" in refusal["message"], refusal
    genuine = wait_until(
        lambda: (
            (r := _get_rem(objects, namespace, alternate_name(pod["name"], pod["uid"])))
            and (r.get("status") or {}).get("cause")
            and r
        ),
        timeout=60,
        what="the pod's own record at the alternate name",
    )
    assert genuine["spec"]["podUID"] == pod["uid"]
    assert genuine["status"]["cause"] == "ContainersStillRunning", genuine["status"]
    assert objects.read_pod(namespace, pod["name"]) is not None, "a running pod was deleted"
    assert controller.sample("unstick_refusals_total", reason="forged") >= 1
    objects.core.patch_namespaced_pod(pod["name"], namespace, {"metadata": {"finalizers": None}})


def test_a_probe_in_the_record_before_the_controller_asked_is_not_used(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """A record with the pod's identity, written ahead with a probe that says nothing is
    left (a replayed or planted answer): the controller never asked for it, so it is not
    used."""
    from unstick.core.remediation import remediation_name

    node = objects.ready_node(make_node)
    pod = objects.pod(namespace, node, remediate=POLICY, finalizers=["example.com/hold"])
    _running(objects, namespace, pod["name"])
    name = remediation_name(pod["name"], pod["uid"])
    planted = agent_probe(node, [], pod["uid"])
    _forge(
        objects,
        namespace,
        name,
        {"podName": pod["name"], "podUID": pod["uid"], "nodeName": node},
        {"probe": planted},
    )
    objects.core.delete_namespaced_pod(pod["name"], namespace)
    rem = wait_until(
        lambda: (
            (r := _get_rem(objects, namespace, name)) and (r.get("status") or {}).get("cause") and r
        ),
        timeout=60,
        what="the controller's diagnosis",
    )
    # Had the planted probe been believed, its empty container list would have overridden
    # the API's running container: KubeletNotProgressing → force-delete.
    assert rem["status"]["cause"] == "ContainersStillRunning", rem["status"]
    assert not [a for a in rem["status"].get("actions") or [] if a["action"] == "force-delete"]
    assert objects.read_pod(namespace, pod["name"]) is not None, "a running pod was deleted"
    objects.core.patch_namespaced_pod(pod["name"], namespace, {"metadata": {"finalizers": None}})


def test_a_forged_record_of_no_stuck_pod_does_not_stay_on_display(
    controller: Controller, objects: Objects, namespace: str
) -> None:
    """Issue item 7: a record for a pod that does not exist, dressed up as "NodeGone
    Remediating", is marked Refused with the reason."""
    _forge(
        objects,
        namespace,
        "ghost-12345678",
        {"podName": "ghost", "podUID": OTHER_UID, "nodeName": "nowhere"},
        {"phase": "Remediating", "cause": "NodeGone"},
    )
    status = wait_until(
        lambda: (
            ((_get_rem(objects, namespace, "ghost-12345678") or {}).get("status") or {})
            if ((_get_rem(objects, namespace, "ghost-12345678") or {}).get("status") or {}).get(
                "phase"
            )
            == "Refused"
            else None
        ),
        timeout=60,
        what="the forged record marked Refused",
    )
    assert "no pod 'ghost'" in status["refusals"][0]["message"], status


def test_a_second_record_of_a_stuck_pod_is_refused(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """A record with a stuck pod's identity under another name, dressed up as "NodeGone
    Remediating" with a probe showing nothing left: not the pod's record (the controller
    keeps that one), marked Refused; its probe is never used."""
    from unstick.core.remediation import remediation_name

    node = objects.ready_node(make_node)
    pod = objects.pod(namespace, node, remediate=POLICY, finalizers=["example.com/hold"])
    _running(objects, namespace, pod["name"])
    objects.core.delete_namespaced_pod(pod["name"], namespace)
    own = remediation_name(pod["name"], pod["uid"])
    wait_until(
        lambda: ((_get_rem(objects, namespace, own) or {}).get("status") or {}).get("cause"),
        timeout=60,
        what="the pod's own record",
    )
    _forge(
        objects,
        namespace,
        "evil-copy",
        {"podName": pod["name"], "podUID": pod["uid"], "nodeName": node},
        {
            "phase": "Remediating",
            "cause": "NodeGone",
            "probe": agent_probe(node, [], pod["uid"]),
        },
    )
    status = wait_until(
        lambda: (
            (s := (_get_rem(objects, namespace, "evil-copy") or {}).get("status") or {})
            and s.get("phase") == "Refused"
            and s
        ),
        timeout=60,
        what="the second record marked Refused",
    )
    assert "a second record" in status["refusals"][0]["message"], status
    mine = (_get_rem(objects, namespace, own) or {}).get("status") or {}
    assert mine.get("cause") == "ContainersStillRunning", mine
    assert objects.read_pod(namespace, pod["name"]) is not None, "a running pod was deleted"
    assert controller.sample("unstick_refusals_total", reason="forged") >= 1
    objects.core.patch_namespaced_pod(pod["name"], namespace, {"metadata": {"finalizers": None}})
