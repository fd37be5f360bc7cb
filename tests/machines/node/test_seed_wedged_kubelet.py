"""The wedged kubelet on the real node (DESIGN §2 rule 9, invariant 8; §3 restart-kubelet):
the real kubelet's pod worker stops making progress (the kubelet is SIGSTOPped), the pod's
containers are stopped through containerd (nothing of the pod runs, nothing is mounted:
the pod has no volumes at all), and the pod is deleted. Nothing finalises it.

unstick, running as the chart's pods, diagnoses KubeletNotProgressing from a fresh probe
(no running container, no mount, no volume dir, the runtime answered); the `default`
policy, patched for the test, permits `restart-kubelet` (and not `force-delete`, which the
plan puts first and which would end the pod without fixing the node) and has a long
nodeLostAfter, so NodeUnreachable (rule 3) cannot win while the stopped kubelet lets the
Node go NotReady. The evidence says what the kubelet itself reports: nothing on its
/metrics (it is stopped), and no status of the pod since the delete (observedGeneration).
The agent runs the chart's restart command, which asks the node's
kubelet supervisor (devcluster.node: the "service manager") to restart the
kubelet; the restarted kubelet finalises the pod and the Node is Ready again. A second
wedge within the hour: restart-kubelet is refused ("at most once per hour") and the
harness resumes the kubelet itself."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.node import RealNode
from devcluster.node_containerd import ctr
from devcluster.node_images import NodeImages
from devcluster.process import wait_until

from .support import (
    Release,
    busybox_pod,
    component_pod,
    counter,
    eventually,
    pod_exists,
    remediation_for,
    scrape,
    wait_running,
)

pytestmark = pytest.mark.node

POLICY = "/apis/unstick.dev/v1alpha1/remediationpolicies/default"
CAUSE = "KubeletNotProgressing"


@pytest.fixture
def restart_policy(unstick_release: Release, node_control_plane: ControlPlane) -> Iterator[None]:
    """The chart's `default` policy permitting restart-kubelet (not force-delete), with a
    nodeLostAfter of an hour; restored afterwards."""
    cp = node_control_plane
    before = cp.request("GET", POLICY)["spec"]
    _set_policy(cp, actions=["observe", "restart-kubelet"], nodeLostAfterSeconds=3600)
    try:
        yield
    finally:
        _set_policy(
            cp, actions=before["actions"], nodeLostAfterSeconds=before["nodeLostAfterSeconds"]
        )


def _set_policy(cp: ControlPlane, **spec: Any) -> None:
    """Change the policy, then wait until the controller has the change: it takes a policy
    in from its watch and then writes the Valid condition naming the generation it took
    (observedGeneration). Before, a pod wedged right after the PUT could be decided on the
    policy as it was (restart-kubelet "not permitted by policy") on a busy machine."""
    policy = cp.request("GET", POLICY)
    policy["spec"].update(spec)
    generation = cp.request("PUT", POLICY, policy)["metadata"]["generation"]
    wait_until(
        lambda: _observed(cp) >= generation,
        timeout=60,
        what=f"the controller's Valid condition of the policy's generation {generation}",
    )


def _observed(cp: ControlPlane) -> int:
    """The generation of the policy the controller last took in and found valid (0: none)."""
    conditions = (cp.request("GET", POLICY).get("status") or {}).get("conditions") or []
    for c in conditions:
        if c.get("type") == "Valid" and c.get("status") == "True":
            return int(c.get("observedGeneration") or 0)
    return 0


@pytest.fixture
def kubelet_back(real_node: RealNode) -> Iterator[None]:
    """Whatever happens: the kubelet runs (not stopped) and the Node is Ready afterwards."""
    try:
        yield
    finally:
        pid = real_node.kubelet_pid()
        if pid is not None and _state(pid) == "T":
            real_node.signal_kubelet(signal.SIGCONT)
        if real_node.kubelet is None or real_node.kubelet_pid() is None:
            real_node.stop_kubelet()
            real_node.start_kubelet()
        real_node.wait_ready(timeout=90)


@pytest.fixture
def opted_in(node_namespace: str, core: Any) -> str:
    """The test's namespace, opted in as a whole (label unstick.dev/remediate=true)."""
    core.patch_namespace(
        node_namespace, {"metadata": {"labels": {"unstick.dev/remediate": "true"}}}
    )
    return node_namespace


def _state(host_pid: int) -> str:
    try:
        with open(f"/proc/{host_pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return ""


def bare_pod(name: str, image: str, node: str) -> dict[str, Any]:
    """A pod with no volumes at all: nothing of it is mounted on the node."""
    pod = busybox_pod(name, image, node, memory_volume=False)
    pod["spec"]["automountServiceAccountToken"] = False
    return pod


def wedge(node: RealNode, core: Any, namespace: str, name: str, uid: str) -> int:
    """Stop the kubelet, stop the pod's containers (sandbox too) through containerd, delete
    the pod; returns the stopped kubelet's PID."""
    pid = node.signal_kubelet(signal.SIGSTOP)
    s = node.containerd_settings
    ids = ctr(s, "containers", "list", "-q", f'labels."io.kubernetes.pod.uid"=={uid}').split()
    assert len(ids) >= 2, f"the pod's container and sandbox in containerd: {ids}"
    for cid in ids:
        ctr(s, "tasks", "kill", "--signal", "SIGKILL", cid)

    def stopped() -> bool:
        tasks = _tasks(node)
        return all(tasks.get(cid, "STOPPED") == "STOPPED" for cid in ids)

    wait_until(stopped, timeout=30, what=f"the containers of {name} stopped")
    core.delete_namespaced_pod(name, namespace)
    return pid


def _tasks(node: RealNode) -> dict[str, str]:
    """containerd's tasks: id → status."""
    lines = ctr(node.containerd_settings, "tasks", "list").splitlines()[1:]
    return {line.split()[0]: line.split()[-1] for line in lines if line.strip()}


# -- what to read back -------------------------------------------------------------------


def _with_node_action(cp: ControlPlane, ns: str, uid: str, action: str) -> dict[str, Any] | None:
    """The pod's Remediation once the agent has reported `action` and the controller's pass
    is on record (its cause: with --node-round-trip its first status write comes after the
    agent's answer, design.md §3 "The node path in one round trip")."""
    rem = remediation_for(cp, ns, uid)
    status = (rem or {}).get("status") or {}
    if not any(a.get("action") == action for a in status.get("nodeActions") or []):
        return None
    return rem if status.get("cause") else None


def wait_node_action(
    cp: ControlPlane, node: RealNode, ns: str, uid: str, what: str
) -> dict[str, Any]:
    """`_with_node_action` for restart-kubelet, awaited; on a timeout the error carries the
    Remediation and what unstick's pods logged (read from the node: `kubectl logs` needs
    the kubelet, which is stopped)."""
    try:
        rem: dict[str, Any] = wait_until(
            lambda: _with_node_action(cp, ns, uid, "restart-kubelet"), timeout=120, what=what
        )
    except TimeoutError as e:
        rem = remediation_for(cp, ns, uid) or {}
        raise TimeoutError(f"{e}\nRemediation: {rem}\n{container_logs(node)}") from None
    return rem


def container_logs(node: RealNode, tail: int = 40) -> str:
    """The last lines of unstick's containers' logs, from the kubelet's pod log dir."""
    out = []
    for path in sorted(
        (node.workdir / "kubelet-conf" / "pod-logs").glob("unstick-system_*/*/*.log")
    ):
        lines = path.read_text(errors="replace").splitlines()[-tail:]
        out.append(f"--- {path.parent.parent.name}/{path.parent.name}\n" + "\n".join(lines))
    return "\n".join(out)


def _deleters(cp: ControlPlane, ns: str, name: str, since: int) -> list[tuple[str, str, int]]:
    """(user, user agent, HTTP code) of every DELETE of the pod in the audit log since
    event number `since`."""
    out = []
    for i, event in enumerate(cp.audit_events()):
        ref = event.get("objectRef") or {}
        if i < since or event.get("verb") != "delete" or ref.get("resource") != "pods":
            continue
        if ref.get("namespace") == ns and ref.get("name") == name and not ref.get("subresource"):
            code = (event.get("responseStatus") or {}).get("code", 0)
            out.append((event["user"]["username"], event.get("userAgent", ""), code))
    return out


def klog_pid(line: str) -> int:
    """The PID in a klog header (`I1122 18:24:58.621122     419 file.go:1] ...`), 0 if none."""
    found = re.match(r"[IWEF]\d{4} [\d:.]+\s+(\d+) ", line)
    return int(found[1]) if found else 0


def controller_metrics(release: Release) -> str:
    ip = component_pod(release, "controller")["status"]["podIP"]
    text: str = eventually(lambda: scrape(f"http://{ip}:9100/metrics"), 30, "controller /metrics")
    return text


def kubelet_says(status: dict[str, Any], probe: dict[str, Any]) -> None:
    """The evidence says what the kubelet itself reports (docs/compatibility.md): the
    stopped kubelet answers nothing on its /metrics (the probe's kubeletPods, read with the
    agent's token, has no counts and says why), and it never wrote the deleted pod's status
    (the 1.37 kubelet's status.observedGeneration is still the pod's generation before the
    delete, which raised it from 1 to 2)."""
    said = [e["message"] for e in status.get("evidence") or [] if e.get("kind") == "kubelet"]
    print("the kubelet's evidence:", *said, sep="\n  ")
    counts = probe.get("kubeletPods") or {}
    assert counts.get("working") is None and "did not answer" in counts.get("unread", ""), counts
    unknown = "the kubelet's own pod-worker counts are unknown: the kubelet's https://"
    assert any(m.startswith(unknown) and "/metrics did not answer" in m for m in said), said
    unseen = (
        "the kubelet has not written the pod's status since the delete "
        "(status.observedGeneration 1, metadata.generation 2)"
    )
    # With the round trip (the default) the controller's diagnosis on record is the one on
    # the agent's probe after its restart-kubelet, by when the new kubelet may have written
    # the pod's status: then it says so (the agent planned on its own probe before it).
    saw = "the kubelet saw the delete (status.observedGeneration 2, metadata.generation 2)"
    assert any(m.startswith((unseen, saw)) for m in said), said


def _restarts(metrics: str, result: str) -> float:
    return counter(
        metrics, "unstick_remediations_total", action="restart-kubelet", cause=CAUSE, result=result
    )


# -- the test ------------------------------------------------------------------------------


def test_wedged_kubelet_restarted_once_an_hour(
    real_node: RealNode,
    unstick_release: Release,
    node_control_plane: ControlPlane,
    node_images: NodeImages,
    core: Any,
    opted_in: str,
    restart_policy: None,
    kubelet_back: None,
) -> None:
    cp, ns, node = node_control_plane, opted_in, real_node
    began = time.monotonic()
    image, name = node_images.busybox.ref, node.settings.name
    uid = core.create_namespaced_pod(ns, bare_pod("wedged", image, name)).metadata.uid
    wait_running(core, ns, "wedged")
    pod_dir = node.kubelet_root / "pods" / uid
    print("the pod's dir:", sorted(str(p.relative_to(pod_dir)) for p in pod_dir.rglob("*")))
    audit_from = sum(1 for _ in cp.audit_events())
    log_from = len(node.log_text("kubelet"))
    before = controller_metrics(unstick_release)

    stopped = wedge(node, core, ns, "wedged", uid)
    rem = wait_node_action(cp, node, ns, uid, "the agent's restart-kubelet on record")
    status = rem["status"]
    print(f"restart-kubelet on record after {time.monotonic() - began:.1f} s")
    assert status["cause"] == CAUSE, status.get("evidence")
    # the plan: the controller's (status.plan), or on the round trip, once a pass has taken
    # the agent's answer (the kubelet's window: status.plan empty), the agent's own
    planned = status.get("plan") or (status.get("nodePlan") or {}).get("steps") or []
    assert [(p["action"], p["target"]) for p in planned] == [("restart-kubelet", name)], status
    refused = {r["action"]: r["reason"] for r in status.get("refused") or []}
    assert "not permitted by policy" in refused.get("force-delete", ""), refused
    (done,) = status["nodeActions"]
    assert done["result"] == "succeeded", done
    assert "kubelet restarted by its supervisor" in done["message"], done
    probe = status["probe"]
    print("probe:", {k: probe.get(k) for k in ("runtime", "holderScan", "kubeletHealthy")})
    assert probe.get("podUID") == uid and probe.get("nodeName") == name, probe
    kubelet_says(status, probe)

    # The kubelet came back (a new process), the Node is Ready, the pod finalised.
    wait_until(lambda: node.kubelet_pid() not in (None, stopped), timeout=30, what="new kubelet")
    wait_until(
        lambda: not pod_exists(core, ns, "wedged", uid), timeout=90, what="the pod finalised"
    )
    node.wait_ready(timeout=90)
    print(f"pod gone, node Ready after {time.monotonic() - began:.1f} s")
    deletes = _deleters(cp, ns, "wedged", audit_from)
    print("DELETEs of the pod (user, user agent, code):", deletes)
    last_user, last_agent, _ = [d for d in deletes if d[2] == 200][-1]
    assert (last_user, last_agent.split("/")[0]) == (f"system:node:{name}", "kubelet"), deletes
    log = node.log_text("kubelet")[log_from:]
    assert "kubelet-supervisor: restart requested" in log
    started = re.search(r"kubelet-supervisor: started kubelet pid (\d+)", log)
    assert started, "the supervisor never started a new kubelet"
    about_pod = [
        (klog_pid(line), line)
        for line in log[started.start() :].splitlines()
        if uid in line or f'"{ns}/wedged"' in line
    ]
    print(f"the kubelet's log on the pod after the restart (new kubelet pid {started[1]}):")
    print(*(f"  [{pid}] {line[:220]}" for pid, line in about_pod[:12]), sep="\n")
    removed = [pid for pid, line in about_pod if "SyncLoop REMOVE" in line]
    # Who finalised it (the audit log says a kubelet): the restarted one, when its log has
    # the pod's removal (the old one, woken by SIGCONT to get its SIGTERM, could in principle
    # have done it before it exited).
    print("finalised by the", "restarted kubelet" if removed else "kubelet before it exited")
    assert about_pod, "the kubelet's log never names the pod after the restart"
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.uid={uid}").items
    assert any(e.reason == f"Stuck{CAUSE}" and "restart-kubelet" in e.message for e in events), [
        (e.reason, e.message) for e in events
    ]
    after = controller_metrics(unstick_release)
    assert _restarts(after, "succeeded") == _restarts(before, "succeeded") + 1

    # A second wedge within the hour: refused; the harness resumes the kubelet itself.
    uid2 = core.create_namespaced_pod(ns, bare_pod("wedged-again", image, name)).metadata.uid
    wait_running(core, ns, "wedged-again")
    stopped = wedge(node, core, ns, "wedged-again", uid2)
    rem2 = wait_node_action(cp, node, ns, uid2, "the second restart-kubelet on record")
    (again,) = rem2["status"]["nodeActions"]
    assert again["result"] == "refused" and "at most once per hour" in again["message"], again
    assert node.kubelet_pid() == stopped and _state(stopped) == "T", "the kubelet was restarted"
    node.signal_kubelet(signal.SIGCONT)
    wait_until(
        lambda: not pod_exists(core, ns, "wedged-again", uid2), timeout=90, what="the pod gone"
    )
    node.wait_ready(timeout=90)
    refused_now = _restarts(controller_metrics(unstick_release), "refused")
    assert refused_now >= _restarts(before, "refused") + 1
    print(f"the whole test: {time.monotonic() - began:.1f} s")
