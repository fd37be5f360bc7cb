"""The controller's half of the agent channel, against a real API server. The test plays
the node agent: it writes `status.probe`, `status.nodeActions` and `status.nodeStepsDoneAt`
on the Remediation exactly as the agent does (a JSON merge patch of its own keys); no
kubelet or mounts are involved (that side is tested in tests/agent/)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from controller_support import GROUP, VERSION, Controller, Objects, await_, crds_installed
from controller_support import policy_spec as spec

from unstick.devcluster import ControlPlane

pytestmark = pytest.mark.envtest

POLICY = "t-agent"


@pytest.fixture(scope="module")
def setup(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Controller, Objects]]:
    with crds_installed(control_plane):
        objects = Objects(control_plane)
        before = objects.replace_policy(POLICY, spec(probeMaxAgeSeconds=30))
        ctl = Controller(control_plane, tmp_path_factory.mktemp("agentch") / "controller.log")
        try:
            ctl.start()
            await_(lambda: objects.policy_valid(POLICY) == "True", 30, "policy valid")
            yield ctl, objects
        finally:
            ctl.stop()
            print(ctl.log()[-4000:])
            objects.replace_policy(POLICY, before)
            objects.api_client.close()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _probe(node: str, volume_dirs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeName": node,
        "probedAt": _now(),
        "kubeletRoot": "/var/lib/kubelet",
        "kubeletHealthy": True,
        "registeredPlugins": [],
        "mountinfo": "",
        "volumeDirs": volume_dirs,
        "holders": [],
        "containers": [],
    }


def _as_agent(objects: Objects, namespace: str, rem: dict[str, Any], status: Any) -> None:
    objects.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "remediations", rem["metadata"]["name"], {"status": status}
    )


def _ready(objects: Objects, node: str) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "test",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    objects.core.patch_node_status(node, {"status": {"conditions": [condition]}})


def test_probe_request_node_steps_then_force_delete(
    setup: tuple[Controller, Objects], namespace: str, make_node: Any
) -> None:
    controller, objects = setup
    node = make_node(kubelet=False)
    _ready(objects, node)
    pod = objects.pod(namespace, node, remediate=POLICY)
    objects.core.delete_namespaced_pod(pod["name"], namespace)

    # Node state unknown: the controller asks the agent for a probe and waits.
    rem = await_(
        lambda: (
            (r := objects.remediation(namespace, pod))
            and (r.get("spec") or {}).get("probeRequestedAt")
            and (r.get("status") or {}).get("phase") == "WaitingForAgent"
            and r
        ),
        60,
        "a probe request",
    )
    assert rem["status"]["cause"] == "Unknown"
    assert rem["metadata"]["labels"]["unstick.dev/node"] == node

    # The agent's probe: an empty volume dir of the pod is left → rmdir-stale on the node.
    stale = f"/var/lib/kubelet/pods/{pod['uid']}/volumes/kubernetes.io~empty-dir/cache"
    _as_agent(objects, namespace, rem, {"probe": _probe(node, [{"path": stale, "empty": True}])})
    rem = await_(
        lambda: (r := objects.remediation(namespace, pod)) and r["spec"].get("nodeSteps") and r,
        30,
        "node steps for the agent",
    )
    assert rem["status"]["cause"] == "StaleVolumeDirs"
    assert [(s["action"], s["target"]) for s in rem["spec"]["nodeSteps"]] == [
        ("rmdir-stale", stale)
    ]
    requested = rem["spec"]["nodeStepsRequestedAt"]

    # The agent ran them and says so; the controller asks for a probe taken after them.
    done = _now()
    result = {
        "action": "rmdir-stale",
        "target": stale,
        "result": "succeeded",
        "message": "removed empty dir",
        "time": done,
    }
    _as_agent(objects, namespace, rem, {"nodeActions": [result], "nodeStepsDoneAt": done})
    await_(
        lambda: (
            (r := objects.remediation(namespace, pod))
            and r["spec"]["probeRequestedAt"] > requested
            and r
        ),
        30,
        "a new probe request after the node steps",
    )
    assert objects.read_pod(namespace, pod["name"]) is not None

    # A fresh probe shows nothing of the pod left: KubeletNotProgressing → force-delete.
    _as_agent(objects, namespace, rem, {"probe": _probe(node, [])})
    await_(lambda: objects.read_pod(namespace, pod["name"]) is None, 60, "force-delete")
    status = await_(
        lambda: (s := objects.status(namespace, pod)).get("phase") == "Resolved" and s,
        30,
        "Resolved",
    )
    recorded = [(a["action"], a["result"], a["by"]) for a in status["actions"]]
    assert ("rmdir-stale", "succeeded", "agent") in recorded
    assert ("force-delete", "succeeded", "controller") in recorded
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
