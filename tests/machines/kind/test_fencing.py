"""Fencing from a real proof source (design.md §10, docs/fencing.md): the upstream cloud
node lifecycle controller of k8s.io/cloud-provider, run beside the kind cluster with a
provider whose instances are the cluster's podman containers (tests/machines/kind/cloud.py).

A worker powered off (`podman stop --time 0`) goes NotReady, the cloud controller manager
taints it `node.cloudprovider.kubernetes.io/shutdown`, and with `cloudShutdown` in the
policy's `fencingEvidence` unstick force-deletes the pod stuck there, its evidence naming
the source and the Node. A worker paused (a partition: still running, only silent) gets no
such taint and its pod is only observed. Each worker is started again (unpaused) and Ready
before the test ends: the suite's cluster is left as it was.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster.process import Process, wait_until
from unstick.core.policy.out_of_service import APPLIED_ANNOTATION as APPLIED

from . import cloud
from .support import NAMESPACE, Kind, podman
from .test_kind import busybox_pod

pytestmark = [pytest.mark.kind, pytest.mark.timeout(900)]
log = logging.getLogger(__name__)

OPT_IN = {"unstick.dev/remediate": "true"}


@pytest.fixture(scope="module")
def ccm(kind: Kind) -> Iterator[Process]:
    """The cloud controller manager beside the cluster (skipped, saying why, without it)."""
    missing = cloud.unavailable()
    if missing:
        pytest.skip(missing)
    with cloud.cloud_controller_manager(kind) as proc:
        yield proc


@pytest.fixture
def cloud_proof(kind: Kind) -> Iterator[None]:
    """The default policy trusts cloudShutdown too (as an admin would patch it); its
    fencingEvidence restored afterwards (null: the field was not set)."""
    before = kind.get("remediationpolicy", "default")["spec"].get("fencingEvidence")
    patch = {"spec": {"fencingEvidence": ["outOfServiceTaint", "cloudShutdown"]}}
    kind.kubectl("patch", "remediationpolicy", "default", "--type=merge", "-p", json.dumps(patch))
    try:
        yield
    finally:
        restore = {"spec": {"fencingEvidence": before}}
        kind.kubectl(
            "patch", "remediationpolicy", "default", "--type=merge", "-p", json.dumps(restore)
        )


def pod_on(kind: Kind, namespaces: list[str], ns: str, node: str) -> str:
    """A running busybox pod `p` on `node` in a new opted-in namespace; its UID."""
    namespaces.append(ns)
    kind.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": OPT_IN}}
    )
    kind.apply(busybox_pod(kind, "p", ns, node))
    kind.kubectl("wait", "--for=condition=Ready", "pod/p", "-n", ns, "--timeout=120s")
    uid: str = kind.pods(ns)[0]["metadata"]["uid"]
    return uid


def records_of_p(kind: Kind, ns: str) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """The records of pod `p`, each as (its status, p's force-delete in it or None): the
    pod's own Remediation (the force-delete among `status.actions` that succeeded or found
    the pod gone), and its node's incident (docs/incidents.md) once that has p's result
    (an entry of `status.pods` with `goneAt`; it says "deleting" until the DELETE's result
    replaces it). Which of the two carries the force-delete depends on how the controller
    met the pod (in make test-matrix's v1.37.2 run, not the incident first expected)."""
    for rem in kind.remediations(ns):
        status: dict[str, Any] = rem.get("status") or {}
        for q in status.get("pods", []):
            if q.get("name") == "p" and q.get("goneAt"):
                yield status, q
        if rem["spec"].get("podName") == "p":
            done = (
                a for a in status.get("actions", [])
                if a.get("action") == "force-delete" and a.get("result") in ("succeeded", "gone")
            )  # fmt: skip
            yield status, next(done, None)


def record(kind: Kind, ns: str, cause: str) -> dict[str, Any] | None:
    """The status of a record of pod `p` that says `cause`."""
    return next((s for s, _ in records_of_p(kind, ns) if s.get("cause") == cause), None)


def force_deleted(kind: Kind, ns: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the record's status, p's force-delete in it) once a NodeUnreachable record of `p`
    has the force-delete's result."""
    return next(
        ((s, done) for s, done in records_of_p(kind, ns)
         if s.get("cause") == "NodeUnreachable" and done is not None),
        None,
    )  # fmt: skip


def messages(status: dict[str, Any]) -> list[str]:
    return [e["message"] for e in status.get("evidence", [])]


def ready(kind: Kind, node: str) -> bool:
    return kind.ready(kind.get("node", node))


def power_off(kind: Kind, ccm: Process, node: str) -> float:
    """The worker's container stopped at once (`podman stop --time 0`: the kubelet and the
    pods' processes die, as at a power cut), its Node NotReady, then the cloud node
    lifecycle controller's shutdown taint on it; when that was seen (time.monotonic())."""
    start = time.monotonic()
    podman("stop", "--time", "0", node)
    wait_until(lambda: not ready(kind, node), timeout=180, what=f"{node} NotReady")
    not_ready = time.monotonic()
    taint = wait_until(
        lambda: cloud.shutdown_taint(kind.get("node", node)),
        timeout=120,
        what=f"the shutdown taint on {node}",
        process=ccm,
    )
    proven = time.monotonic()
    log.info(
        "powered off: NotReady after %.1f s, shutdown taint %.1f s later (%s)",
        not_ready - start, proven - not_ready, taint,
    )  # fmt: skip
    return proven


def power_on(kind: Kind, node: str) -> float:
    """The worker's container started again (`podman start`; kind's entrypoint rewrites
    its configuration if its IP changed), its Node Ready (if not, what the node says) and
    unstick's pods Ready again; when the Node was seen Ready (time.monotonic())."""
    podman("start", node, check=False)
    try:
        wait_until(lambda: ready(kind, node), timeout=240, what=f"{node} Ready again")
    except TimeoutError as e:
        state = podman("inspect", "--format", "{{.State.Status}}", node, check=False)
        journal = podman("exec", node, "journalctl", "-u", "kubelet", "-n", "20", check=False)
        raise TimeoutError(f"{e}\ncontainer {state.strip()}; kubelet:\n{journal}") from e
    back = time.monotonic()
    wait_until(lambda: unstick_back(kind), timeout=240, what="unstick's pods Ready on every node")
    return back


def unstick_back(kind: Kind) -> bool:
    """The agent Ready on the 3 nodes and both controller replicas Ready (a replica evicted
    from a tainted node waits, by the chart's required anti-affinity, for that node)."""
    agents = kind.get("daemonset", "unstick-agent", "-n", NAMESPACE)["status"]
    controllers = kind.pods(NAMESPACE, "-l", "app.kubernetes.io/component=controller")
    return agents.get("numberReady") == 3 and sum(map(pod_ready, controllers)) == 2


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def test_paused_worker_is_not_proven_off(
    kind: Kind, quick_policy: None, cloud_proof: None, ccm: Process, namespaces: list[str]
) -> None:
    """Paused (partitioned, still running): the provider says so, no shutdown taint, and
    the pod is only observed even though the policy trusts cloudShutdown."""
    node = kind.worker_without_controller()
    pod_on(kind, namespaces, "kind-cloud-paused", node)
    since = len(cloud.log(ccm))
    podman("pause", node)
    try:
        wait_until(lambda: not ready(kind, node), timeout=180, what=f"{node} NotReady")
        kind.kubectl("delete", "pod", "p", "-n", "kind-cloud-paused", "--wait=false")
        # the lifecycle controller asked about the NotReady node and was told: paused
        wait_until(
            lambda: cloud.answered(ccm, node, "paused", since),
            timeout=60,
            what=f"the cloud controller manager to look at {node}",
            process=ccm,
        )
        status = wait_until(
            lambda: record(kind, "kind-cloud-paused", "NodeUnreachable"),
            timeout=120,
            what="the unreachable pod observed",
        )
        assert status is not None  # (wait_until returns the first true answer)
        log.info("paused worker, evidence: %s", messages(status))
        assert [p["action"] for p in status["plan"]] == ["observe"], status
        assert any("NOT fenced" in m for m in messages(status)), status
        assert cloud.shutdown_taint(kind.get("node", node)) is None
        assert [p["metadata"]["name"] for p in kind.pods("kind-cloud-paused")] == ["p"]
    finally:
        podman("unpause", node, check=False)
        wait_until(lambda: ready(kind, node), timeout=180, what=f"{node} Ready again")
    # back, its kubelet finishes the deleted pod
    wait_until(lambda: not kind.pods("kind-cloud-paused"), timeout=120, what="the pod gone")


def test_powered_off_worker_is_proven_off_by_the_cloud(
    kind: Kind, quick_policy: None, cloud_proof: None, ccm: Process, namespaces: list[str]
) -> None:
    """Powered off (the container stopped, no grace): NotReady, the shutdown taint from the
    cloud node lifecycle controller, and the stuck pod force-deleted on that proof. Started
    again: Ready, and the controller takes its taint off."""
    node = kind.worker_without_controller()
    ns = "kind-cloud-off"
    uid = pod_on(kind, namespaces, ns, node)
    try:
        tainted = power_off(kind, ccm, node)
        kind.kubectl("delete", "pod", "p", "-n", ns, "--wait=false")
        wait_until(
            lambda: not kind.pods(ns),
            timeout=120,
            what="the powered-off worker's pod force-deleted",
        )
        log.info("pod force-deleted %.1f s after the taint", time.monotonic() - tainted)
        try:
            found = wait_until(
                lambda: force_deleted(kind, ns), timeout=60, what="the pod's force-delete on record"
            )
        except TimeoutError:  # say what is on record instead
            records = kind.remediations(ns)
            raise AssertionError(f"no force-delete of p on record: {records}") from None
        assert found is not None  # (wait_until returns the first true answer)
        status, act = found
        log.info("powered-off worker, record: %s", status)
        assert (act["action"], act["result"]) == ("force-delete", "succeeded"), act
        if "goneAt" in act:  # an incident's entry: decided before the pod went
            assert act["time"] <= act["goneAt"], act
        said = messages(status)
        # the Node, since when it is not Ready, and the source (the cloud's taint carries no
        # timeAdded: cloud-provider sets none on a NoSchedule taint)
        node_line = f"node {node} has Ready=Unknown (NodeStatusUnknown) for "
        assert any(
            m.startswith(node_line) and "(since " in m and m.endswith("fenced by cloudShutdown")
            for m in said
        ), said
        proof = f"fenced by cloudShutdown: taint {cloud.SHUTDOWN_TAINT} is present"
        assert any(m.startswith(proof) for m in said), said
        assert uid not in {p["metadata"]["uid"] for p in kind.pods(ns)}
    finally:
        back = power_on(kind, node)
    # the lifecycle controller removes its taint from a Ready node
    wait_until(
        lambda: cloud.shutdown_taint(kind.get("node", node)) is None,
        timeout=60,
        what=f"the shutdown taint off {node}",
        process=ccm,
    )
    log.info("shutdown taint off %.1f s after Ready again", time.monotonic() - back)


OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
TAINT_ACTIONS = ["taint-out-of-service", "untaint-out-of-service"]


@pytest.fixture
def taint_actions(kind: Kind) -> Iterator[None]:
    """The default policy lists taint-out-of-service and untaint-out-of-service, and the
    controller may patch nodes — what the chart grants when its policy lists them
    (templates/controller-rbac.yaml), granted here by a ClusterRole of the test's own, as
    an admin writing the policy outside the chart would. All undone afterwards."""
    actions = kind.get("remediationpolicy", "default")["spec"]["actions"]
    sa = kind.leader_pod()["spec"]["serviceAccountName"]
    name = "kind-fencing-node-patch"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}],
    }
    kind.apply(role, binding)
    patch = {"spec": {"actions": [*actions, *TAINT_ACTIONS]}}
    try:
        kind.kubectl(
            "patch", "remediationpolicy", "default", "--type=merge", "-p", json.dumps(patch)
        )
        yield
    finally:
        restore = {"spec": {"actions": actions}}
        kind.kubectl(
            "patch", "remediationpolicy", "default", "--type=merge", "-p", json.dumps(restore)
        )
        kind.kubectl("delete", "clusterrolebinding,clusterrole", name, "--ignore-not-found")


def out_of_service(node: dict[str, Any]) -> dict[str, Any] | None:
    taints: list[dict[str, Any]] = node.get("spec", {}).get("taints") or []
    return next((t for t in taints if t["key"] == OUT_OF_SERVICE), None)


def test_powered_off_worker_tainted_out_of_service_then_untainted(
    kind: Kind,
    quick_policy: None,
    cloud_proof: None,
    taint_actions: None,
    ccm: Process,
    namespaces: list[str],
) -> None:
    """With taint-out-of-service permitted, the powered-off worker's cloud proof makes
    unstick apply `node.kubernetes.io/out-of-service` (its annotation naming the proof):
    Kubernetes then evicts and force-deletes the pod there. Started again and Ready, with
    nothing of it left Terminating, unstick removes its taint."""
    node = kind.worker_without_controller()
    ns = "kind-cloud-oos"
    pod_on(kind, namespaces, ns, node)
    try:
        try:
            proven = power_off(kind, ccm, node)
            taint = wait_until(
                lambda: out_of_service(kind.get("node", node)),
                timeout=120,
                what=f"unstick's out-of-service taint on {node}",
            )
            tainted = time.monotonic()
            assert taint is not None  # (wait_until returns the first true answer)
            assert (taint["effect"], taint.get("value")) == ("NoExecute", "nodeshutdown"), taint
            mark = json.loads(kind.get("node", node)["metadata"]["annotations"][APPLIED])
            assert mark["source"] == "cloudShutdown", mark
            assert mark["object"] == f"taint {cloud.SHUTDOWN_TAINT}", mark
            assert mark["timeAdded"] == taint["timeAdded"], (mark, taint)
            log.info("unstick's mark on the node: %s", mark)
            # Kubernetes' non-graceful node shutdown: evicted, then force-deleted by PodGC
            wait_until(lambda: not kind.pods(ns), timeout=180, what="the pod gone")
            log.info(
                "out-of-service: unstick's taint %.1f s after the proof, pod gone %.1f s later",
                tainted - proven, time.monotonic() - tainted,
            )  # fmt: skip
        finally:
            back = power_on(kind, node)
        wait_until(
            lambda: out_of_service(kind.get("node", node)) is None,
            timeout=120,
            what=f"unstick's out-of-service taint removed from {node}",
        )
        log.info("untainted %.1f s after Ready", time.monotonic() - back)
        assert APPLIED not in (kind.get("node", node)["metadata"].get("annotations") or {})
        selector = f"unstick.dev/incident=nodeoutofservice,unstick.dev/node={node}"
        records = kind.get("remediations", "-n", NAMESPACE, "-l", selector)["items"]
        log.info("out-of-service record: %s", [r.get("status") for r in records])
        assert [r["status"]["phase"] for r in records] == ["Resolved"], records
        done = [(a["action"], a["result"]) for a in records[0]["status"]["actions"]]
        assert ("taint-out-of-service", "succeeded") in done, done
        assert ("untaint-out-of-service", "succeeded") in done, done
    finally:
        # the node as it was, also on failure: no taint of this test left on it (the
        # policy's actions are restored by the fixture). The record stays: the admission
        # policy lets no one but the controller delete one (the audit trail).
        kind.kubectl("taint", "node", node, f"{OUT_OF_SERVICE}-", check=False)
        kind.kubectl("annotate", "node", node, f"{APPLIED}-", check=False)
