"""A node-step request the agent refused as a whole, against a real API server (the test
plays the agent as test_agent_channel.py does): refused `stale` (it reached the
agent too old), nothing ran, so the controller asks again after a backoff — never a failed
action, never `Failed` — and the re-asked steps are carried out; refused for a safety
reason (`forged`, `unsafe`) it is not asked again: the refusal stays on record and the pod
ends `Failed` when a probe after the answer shows the steps still needed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.agent import agent_running, node_under, watching
from tests.support.controller import (
    Controller,
    Objects,
    agent_probe,
    utc_now,
    write_as_agent,
)
from tests.support.controller import policy_spec as spec
from unstick.agent.loop import Agent

pytestmark = pytest.mark.envtest

POLICY = "t-stale"


POLICIES = {POLICY: spec(probeMaxAgeSeconds=60)}
# The old flow on purpose, run with --no-node-round-trip: a probe request, then the
# controller's spec.nodeSteps (what an agent of the previous release answers; supported
# for one more release, docs/upgrading.md). The round trip: test_node_round_trip.py.
CONTROLLER_ARGS = ("--no-node-round-trip",)


def _steps_requested(
    objects: Objects, namespace: str, make_node: Any, root: Path | None = None
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A stuck pod whose probe shows an empty volume dir left: the controller hands
    rmdir-stale to the agent. Returns (pod, its Remediation, the stale dir). With `root`
    (a kubelet root for a real agent) the dir is made there and the probe names the root."""
    node = objects.ready_node(make_node)
    pod = objects.stuck_pod(namespace, node, remediate=POLICY)
    kubelet = root or Path("/var/lib/kubelet")
    stale = kubelet / "pods" / pod["uid"] / "volumes" / "kubernetes.io~empty-dir" / "cache"
    rem = objects.remediation_when(
        namespace, pod, timeout=60, what="a probe request", spec_has="probeRequestedAt"
    )
    probe = agent_probe(node, [{"path": str(stale), "empty": True}], pod["uid"])
    if root is not None:
        stale.mkdir(parents=True)
        probe["kubeletRoot"] = str(root)
    write_as_agent(objects, namespace, rem, {"probe": probe})
    rem = objects.remediation_when(
        namespace, pod, timeout=30, what="node steps for the agent", spec_has="nodeSteps"
    )
    return pod, rem, str(stale)


def _probe_after(
    objects: Objects,
    namespace: str,
    pod: dict[str, Any],
    rem: dict[str, Any],
    after: tuple[str, str],
    volume_dirs: list[dict[str, Any]],
) -> None:
    """Wait for the probe the controller asks for after `after` (a time, and what happened
    then) and answer it, as the agent, with these volume dirs."""
    done, what = after
    objects.remediation_when(
        namespace,
        pod,
        lambda r: r["spec"]["probeRequestedAt"] > done,
        timeout=30,
        what=f"a probe request after {what}",
    )
    probe = agent_probe(rem["spec"]["nodeName"], volume_dirs, pod["uid"])
    write_as_agent(objects, namespace, rem, {"probe": probe})


def _refuse(
    objects: Objects,
    namespace: str,
    rem: dict[str, Any],
    stale: str,
    reason: str,
    message: str = "",
) -> str:
    """The agent's answer to a request refused as a whole (handler._run_steps)."""
    done = str(utc_now())
    refused = {
        "action": "rmdir-stale",
        "target": stale,
        "result": "refused",
        "message": message or f"refused: {reason}",
        "time": done,
    }
    entry = {
        "action": "node-steps",
        "reason": reason,
        "message": message or f"refused: {reason}",
        "time": done,
        "by": "agent",
    }
    status = {"nodeActions": [refused], "nodeStepsDoneAt": done, "nodeRefusals": [entry]}
    write_as_agent(objects, namespace, rem, status)
    return done


@pytest.mark.parametrize(
    ("reason", "message", "word"),
    [
        ("stale", "spec.nodeStepsRequestedAt: the request is 130s old", "stale"),
        ("policy_forbids", "rate limit: this node's budget (10 per minute ...", "busy"),
    ],
)
def test_a_request_refused_as_stale_or_busy_is_asked_again_and_carried_out(
    controller: Controller,
    objects: Objects,
    namespace: str,
    make_node: Any,
    reason: str,
    message: str,
    word: str,
) -> None:
    pod, rem, stale = _steps_requested(objects, namespace, make_node)
    first = rem["spec"]["nodeStepsRequestedAt"]
    _refuse(objects, namespace, rem, stale, reason, message)

    rem = objects.remediation_when(
        namespace,
        pod,
        lambda r: r["spec"]["nodeStepsRequestedAt"] != first,
        timeout=60,
        what="the same steps asked again",
    )
    assert [s["action"] for s in rem["spec"]["nodeSteps"]] == ["rmdir-stale"]
    assert rem["status"]["phase"] == "Remediating"
    results = {(a["action"], a["result"]) for a in rem["status"]["actions"]}
    assert ("rmdir-stale", "refused") in results and ("rmdir-stale", "failed") not in results

    # The agent runs the re-asked steps; a probe after them shows nothing left.
    done = utc_now()
    ran = {"action": "rmdir-stale", "target": stale, "result": "succeeded", "message": "ok"}
    write_as_agent(
        objects, namespace, rem, {"nodeActions": [{**ran, "time": done}], "nodeStepsDoneAt": done}
    )
    _probe_after(objects, namespace, pod, rem, (done, "the node steps"), [])
    status = objects.remediation_when(
        namespace, pod, timeout=60, what="Resolved", phase="Resolved"
    )["status"]
    recorded = [(a["action"], a["result"], a["by"]) for a in status["actions"]]
    assert ("rmdir-stale", "succeeded", "agent") in recorded
    assert not [a for a in recorded if a[1] == "failed"], recorded
    asked_again = f"uid={pod['uid']} cause=StaleVolumeDirs action=rmdir-stale result=asked-again"
    assert f"{asked_again}-after-{word}-refusal-1" in controller.log()
    labels = {"action": "rmdir-stale", "cause": "StaleVolumeDirs"}
    assert controller.sample("unstick_remediations_total", **labels, result="failed") == 0


@pytest.mark.parametrize("reason", ["forged", "unsafe"])
def test_a_request_refused_for_safety_is_not_asked_again(
    controller: Controller, objects: Objects, namespace: str, make_node: Any, reason: str
) -> None:
    pod, rem, stale = _steps_requested(objects, namespace, make_node)
    first = rem["spec"]["nodeStepsRequestedAt"]
    done = _refuse(objects, namespace, rem, stale, reason)

    # Judged, as any answer, by a probe taken after it: the dir is still there.
    _probe_after(
        objects, namespace, pod, rem, (done, "the refusal"), [{"path": stale, "empty": True}]
    )
    status = objects.remediation_when(namespace, pod, timeout=30, what="Failed", phase="Failed")[
        "status"
    ]
    rem = objects.remediation(namespace, pod)
    assert rem is not None
    assert rem["spec"]["nodeStepsRequestedAt"] == first, "a refusal for safety was re-asked"
    (entry,) = status["nodeRefusals"]
    assert entry["reason"] == reason
    assert ("rmdir-stale", "refused") in {(a["action"], a["result"]) for a in status["actions"]}


# --- with the real agent: a request that reached it too old (the agent was down) ---------


@contextmanager
def _agent(control_plane: ControlPlane, node: str, root: Path, tmp: Path) -> Iterator[Agent]:
    """The real agent loop of `node` (kubelet root `root`, the mount table an empty file),
    in a thread; shut down and joined at the end."""
    # the real /proc: a complete cgroup scan (no process of the pod runs here)
    settings = node_under(tmp, node, kubelet_root=str(root), max_request_age_s=AGE_S)
    with agent_running(settings, watching(control_plane.kubeconfig)) as agent:
        yield agent


AGE_S = 2.0  # the agent's --max-request-age here


def test_the_real_agent_refuses_a_request_it_missed_and_runs_the_one_asked_again(
    control_plane: ControlPlane,
    controller: Controller,
    objects: Objects,
    namespace: str,
    make_node: Any,
    tmp_path: Path,
) -> None:
    # The agent is down: the probe it took before (as it writes it), then the steps.
    root = tmp_path / "kubelet"
    pod, rem, stale_dir = _steps_requested(objects, namespace, make_node, root)
    node, stale = rem["spec"]["nodeName"], Path(stale_dir)
    first = rem["spec"]["nodeStepsRequestedAt"]
    older = datetime.fromisoformat(first.replace("Z", "+00:00")) + timedelta(seconds=AGE_S)
    wait_until(
        lambda: datetime.now(UTC) > older,
        timeout=30,
        what="the request older than --max-request-age",
    )

    with _agent(control_plane, node, root, tmp_path):
        # its list brings the missed request: refused stale, nothing done on the node
        status = wait_until(
            lambda: (s := objects.status(namespace, pod)).get("nodeRefusals") and s,
            timeout=30,
            what="the agent's refusal",
        )
        assert status["nodeRefusals"][-1]["action"] == "node-steps"
        assert status["nodeRefusals"][-1]["reason"] == "stale"
        assert status["nodeActions"][0]["result"] == "refused"
        # the controller asks again; the agent gets it fresh and runs it
        status = wait_until(
            lambda: (
                (s := objects.status(namespace, pod))
                and any(a.get("result") == "succeeded" for a in s.get("nodeActions") or [])
                and s
            ),
            timeout=60,
            what="the steps asked again and run",
        )
    assert not stale.exists()
    rem = objects.remediation(namespace, pod)
    assert rem is not None and rem["spec"]["nodeStepsRequestedAt"] != first
    assert status.get("phase") != "Failed"
    results = {(a["action"], a["result"]) for a in status.get("actions") or []}
    assert ("rmdir-stale", "failed") not in results
    asked_again = f"uid={pod['uid']} cause=StaleVolumeDirs action=rmdir-stale result=asked-again"
    assert f"{asked_again}-after-stale-refusal-1" in controller.log()
