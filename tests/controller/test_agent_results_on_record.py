"""Every node act's result reaches the Remediation's `status.actions` for good, whatever the
interleaving of the agent's answers, the controller's passes and writes, and a crash
between them (on a real API server, with the real controller process).

The agent keeps only its latest answer in `status.nodeActions`: its answer to the next
request takes the place of the one before. The case of the kind suite's
`test_orphaned_mount_on_a_worker` (a tmpfs left in a pod's emptyDir): the agent unmounts it
(run 1: `unmount` succeeded), the probe after it shows the volume dirs left
(StaleVolumeDirs), the controller asks for `rmdir-stale` (run 2). The controller records
run 1 in the pass that asks for run 2; the agent answers run 2 at once. Found on the
controller of 15:38 (its status write after the request bound to a version): when run 2's
answer landed before that write, the write met 409, nothing was written, and the pass
decided again from a record that held only run 2's answer — the unmount was on record
nowhere (7 of 8 runs of the first test here, with that controller's code).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import (
    GROUP,
    VERSION,
    Controller,
    Objects,
    agent_probe,
    controller_started,
    node_ready,
    utc_now,
)
from tests.support.controller import policy_spec as spec

pytestmark = pytest.mark.envtest

POLICY = "t-results"
FAILPOINTS = "UNSTICK_TEST_FAILPOINTS"


POLICIES = {POLICY: spec(probeMaxAgeSeconds=30)}
# The old flow on purpose, run with --no-node-round-trip: a probe request, then the
# controller's spec.nodeSteps (what an agent of the previous release answers; supported
# for one more release, docs/upgrading.md). The round trip: test_node_round_trip.py.
CONTROLLER_ARGS = ("--no-node-round-trip",)


@pytest.fixture
def controller(
    control_plane: ControlPlane, objects: Objects, tmp_path: Path
) -> Iterator[Controller]:
    with controller_started(
        control_plane, objects, tmp_path / "ctl.log", valid=[POLICY], extra_args=CONTROLLER_ARGS
    ) as c:
        yield c


class Node:
    """What the agent of one node reports about one pod: a tmpfs left mounted in its
    emptyDir `data` (`left`), its volume dirs, and the results of the steps it is asked
    for (the unmount succeeds; an rmdir-stale fails, so the controller asks again), as in
    the kind suite's case. The emptyDir's dirs still hold `left` after the unmount, so the
    rmdir asked for is the empty projected dir's."""

    def __init__(self, name: str, uid: str) -> None:
        self.name, self.uid = name, uid
        base = f"/var/lib/kubelet/pods/{uid}/volumes"
        self.left = f"{base}/kubernetes.io~empty-dir/data/left"
        # the emptyDir's dirs hold `left`; the projected volume's is empty
        self.dirs = [f"{base}/kubernetes.io~empty-dir", f"{base}/kubernetes.io~empty-dir/data"]
        self.empty = f"{base}/kubernetes.io~projected"
        self.mounted = True

    def probe(self) -> dict[str, Any]:
        dirs = [
            *({"path": d, "empty": False} for d in self.dirs),
            {"path": self.empty, "empty": True},
        ]
        probe = agent_probe(self.name, dirs, self.uid)
        if self.mounted:
            probe["mountinfo"] = (
                "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
                f"1300 22 0:99 / {self.left} rw,relatime shared:1300 - tmpfs unstick-seed rw\n"
            )
        return probe

    def run(self, steps: list[dict[str, Any]]) -> dict[str, Any]:
        """The agent's answer to a node-steps request (agent/handler.py `_run_steps`): the
        results up to the first failed or refused step, nodeStepsDoneAt and a probe taken
        after them, in one merge patch."""
        results = []
        for step in steps:
            unmount = step["action"] == "unmount" and self.mounted
            self.mounted = self.mounted and not unmount
            result, message = ("succeeded", "unmounted") if unmount else ("failed", "not empty")
            results.append({**step, "result": result, "message": message, "time": utc_now()})
            if result == "failed":
                break
        for r in results:
            r.pop("reason", None)
        return {"nodeActions": results, "nodeStepsDoneAt": utc_now(), "probe": self.probe()}


class QuickAgent:
    """Plays the node agent at once, from its own watch of the namespace's Remediations:
    a probe request gets a probe, a node-steps request its answer (`Node.run`)."""

    def __init__(self, objects: Objects, namespace: str, node: Node) -> None:
        self.objects, self.namespace, self.node = objects, namespace, node
        self.runs: list[dict[str, Any]] = []
        self.served: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="quick-agent", daemon=True)

    def __enter__(self) -> QuickAgent:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()

    def _watch(self) -> None:
        api = self.objects.custom
        while not self.stop.is_set():
            for event in watch.Watch().stream(
                api.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                "remediations",
                timeout_seconds=1,
            ):
                self._answer(event["object"])

    def _answer(self, rem: dict[str, Any]) -> None:
        name = rem["metadata"]["name"]
        spec_ = rem.get("spec") or {}
        steps_at, probe_at = spec_.get("nodeStepsRequestedAt"), spec_.get("probeRequestedAt")
        if steps_at and f"steps {steps_at}" not in self.served:
            self.served.add(f"steps {steps_at}")
            self.runs.append(self.node.run(spec_.get("nodeSteps") or []))
            _patch(self.objects, self.namespace, name, self.runs[-1])
        elif probe_at and f"probe {probe_at}" not in self.served:
            self.served.add(f"probe {probe_at}")
            _patch(self.objects, self.namespace, name, {"probe": self.node.probe()})


def _patch(objects: Objects, namespace: str, name: str, status: dict[str, Any]) -> None:
    body = {"status": status}
    objects.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "remediations", name, body
    )


def _done(status: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(a["action"], a["target"], a["result"]) for a in status.get("actions") or []}


def _stuck_pod(objects: Objects, namespace: str, make_node: Any) -> tuple[dict[str, Any], Node]:
    name = make_node(kubelet=False)
    node_ready(objects, name)
    pod = objects.stuck_pod(namespace, name, remediate=POLICY)
    return pod, Node(name, pod["uid"])


def _resolved(objects: Objects, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The kubelet's final delete (played here), then the record Resolved."""
    objects.core.delete_namespaced_pod(pod["name"], namespace, grace_period_seconds=0)
    return dict(
        objects.remediation_when(
            namespace, pod, timeout=30, what="the record Resolved", phase="Resolved"
        )["status"]
    )


def test_the_unmount_stays_on_record_when_the_next_answer_comes_at_once(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    pod, node = _stuck_pod(objects, namespace, make_node)
    unmounted = ("unmount", node.left, "succeeded")
    rmdir = ("rmdir-stale", node.empty, "failed")
    with QuickAgent(objects, namespace, node) as agent:
        # run 2's answer recorded: run 1's must be there too
        status = wait_until(
            lambda: rmdir in _done(s := objects.status(namespace, pod)) and s,
            timeout=60,
            what="the second run's answer recorded",
        )
        assert [r["nodeActions"][0]["action"] for r in agent.runs] == ["unmount", "rmdir-stale"]
        assert unmounted in _done(status), status
        assert unmounted in _done(_resolved(objects, namespace, pod))


def _rem(objects: Objects, namespace: str, pod: dict[str, Any], key: str, after: str = "") -> Any:
    """The record once its spec holds `key` newer than `after`."""
    return objects.remediation_when(
        namespace,
        pod,
        lambda r: str((r.get("spec") or {}).get(key) or "") > after,
        timeout=60,
        what=f"spec.{key} in the record",
    )


def test_a_controller_killed_right_after_the_next_request_lost_no_result(
    control_plane: ControlPlane,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
) -> None:
    """SIGKILLed right after the request that follows the unmount (fail point
    `node-steps-requested`, 2nd time): the agent answers that request (its answer takes the
    unmount's place in nodeActions) while no controller runs; the next controller records
    what it finds. The unmount is on record: it was recorded before the request."""
    pod, node = _stuck_pod(objects, namespace, make_node)
    kill = {FAILPOINTS: "node-steps-requested=kill@2"}
    with controller_started(
        control_plane,
        objects,
        tmp_path / "killed.log",
        valid=[POLICY],
        env=kill,
        extra_args=CONTROLLER_ARGS,
    ) as first:
        rem = _rem(objects, namespace, pod, "probeRequestedAt")
        _patch(objects, namespace, rem["metadata"]["name"], {"probe": node.probe()})
        rem = _rem(objects, namespace, pod, "nodeStepsRequestedAt")
        run1 = rem["spec"]["nodeStepsRequestedAt"]
        _patch(objects, namespace, rem["metadata"]["name"], node.run(rem["spec"]["nodeSteps"]))
        rem = _rem(objects, namespace, pod, "nodeStepsRequestedAt", after=run1)
        wait_until(
            lambda: not first.alive(), timeout=30, what="the controller killed at its fail point"
        )
        assert "fail point node-steps-requested reached (2): SIGKILL" in first.log()
    # the emptyDir's dirs still hold `left` (the mount point): only the empty dir's rmdir
    # is planned (the planner refuses an rmdir of a dir the probe saw non-empty)
    assert [(s["action"], s["target"]) for s in rem["spec"]["nodeSteps"]] == [
        ("rmdir-stale", node.empty)
    ]
    _patch(objects, namespace, rem["metadata"]["name"], node.run(rem["spec"]["nodeSteps"]))

    rmdir = ("rmdir-stale", node.empty, "failed")
    with controller_started(
        control_plane, objects, tmp_path / "next.log", valid=[POLICY], extra_args=CONTROLLER_ARGS
    ):
        status = wait_until(
            lambda: rmdir in _done(s := objects.status(namespace, pod)) and s,
            timeout=60,
            what="the second run's answer recorded by the next controller",
        )
        assert ("unmount", node.left, "succeeded") in _done(status), status
        assert ("unmount", node.left, "succeeded") in _done(_resolved(objects, namespace, pod))


def test_an_unanswered_request_is_not_replaced_by_other_steps(
    controller: Controller, objects: Objects, namespace: str, make_node: Any
) -> None:
    """A probe shows other steps needed while the agent has not answered the request yet
    (it may be running it): the request stays, so its answer is not overwritten by the
    next one's before a pass saw it."""
    pod, node = _stuck_pod(objects, namespace, make_node)
    name = _rem(objects, namespace, pod, "probeRequestedAt")["metadata"]["name"]
    _patch(objects, namespace, name, {"probe": node.probe()})
    rem = _rem(objects, namespace, pod, "nodeStepsRequestedAt")
    first, steps = rem["spec"]["nodeStepsRequestedAt"], rem["spec"]["nodeSteps"]
    node.mounted = False  # the agent is at it: a probe of the node meanwhile
    _patch(objects, namespace, name, {"probe": node.probe()})
    rem = objects.remediation_when(
        namespace, pod, timeout=30, what="the pass on the newer probe", cause="StaleVolumeDirs"
    )
    assert rem["spec"]["nodeStepsRequestedAt"] == first, "an unanswered request was replaced"

    node.mounted = True  # its answer to the first request: the unmount
    _patch(objects, namespace, name, node.run(steps))
    unmounted = ("unmount", node.left, "succeeded")
    wait_until(
        lambda: unmounted in _done(objects.status(namespace, pod)),
        timeout=30,
        what="the unmount recorded",
    )
    assert unmounted in _done(_resolved(objects, namespace, pod))
