"""Helpers of the real-node suite: the helm release, pods on the node, waits."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from devcluster import ControlPlane
from devcluster.csi_seed import pod_exists
from devcluster.node import RealNode
from devcluster.process import wait_until
from unstick.core.remediation import node_results, steps_answered

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "unstick"
REMEDIATE = {"unstick.dev/remediate": "true"}


class Release:
    """`helm install` of the chart into the node's control plane."""

    def __init__(self, cp: ControlPlane, home: Path, namespace: str, name: str = "unstick"):
        self.cp = cp
        self.home = home
        self.namespace = namespace
        self.name = name
        self.env = {
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            "HOME": str(home),  # else the client's discovery cache goes to ./.kube
            "PATH": "/usr/bin:/bin",
        }

    def helm(self, *args: str, timeout: float = 180) -> str:
        proc = subprocess.run(
            [
                str(self.cp.bin_dir / "helm"),
                *args,
                f"--kubeconfig={self.cp.kubeconfig}",
                f"--namespace={self.namespace}",
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise AssertionError(f"helm {args[0]} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def install(self, chart: Path, values: Path) -> None:
        self.helm("install", self.name, str(chart), "--create-namespace", "-f", str(values))

    def pods(self, component: str | None = None) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.name}"
        if component:
            selector += f",app.kubernetes.io/component={component}"
        path = f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}"
        items: list[dict[str, Any]] = self.cp.request("GET", path)["items"]
        return items

    def wait_ready(self, node: RealNode, timeout: float = 150) -> None:
        def ready() -> bool:
            pods = self.pods()
            comps = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
            return comps >= {"controller", "agent"} and all(pod_ready(p) for p in pods)

        try:
            wait_until(ready, timeout=timeout, what="unstick's controller and agent pods Ready")
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.describe(node)}") from None

    def describe(self, node: RealNode) -> str:
        lines = []
        for pod in self.pods():
            status = pod.get("status", {})
            lines.append(
                f"{pod['metadata']['name']}: {status.get('phase')} "
                f"{status.get('containerStatuses')}"
            )
            lines.append(self.logs(pod["metadata"]["name"]))
        lines.append("kubelet:\n" + node.log_tail("kubelet", 30))
        return "\n".join(lines)

    def logs(self, pod: str, tail: int = 40) -> str:
        """`kubectl logs` of one of unstick's pods (or kubectl's error, e.g. when the pod
        is gone)."""
        proc = self.cp.kubectl("logs", "-n", self.namespace, pod, f"--tail={tail}", check=False)
        return proc.stdout + proc.stderr

    def uninstall(self, node: RealNode) -> None:
        try:
            self.helm("uninstall", self.name, "--wait", "--timeout=90s")
        finally:
            wait_until(lambda: not self.pods(), timeout=90, what="unstick's pods gone")


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def busybox_pod(
    name: str,
    image: str,
    node: str,
    *,
    command: str = "sleep 3600",
    annotations: dict[str, str] | None = None,
    memory_volume: bool = True,
) -> dict[str, Any]:
    """A busybox pod on `node` (bound directly) with a memory-backed emptyDir (a tmpfs the
    kubelet mounts and must unmount) at /data."""
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    spec: dict[str, Any] = {
        "nodeName": node,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if memory_volume:
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "data", "emptyDir": {"medium": "Memory"}}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def wait_running(core: Any, namespace: str, name: str, timeout: float = 60) -> Any:
    def running() -> Any:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == "Running" and pod.status.pod_ip else None

    return wait_until(running, timeout=timeout, what=f"pod {namespace}/{name} Running")


def wait_gone(core: Any, namespace: str, name: str, uid: str, timeout: float = 60) -> None:
    wait_until(
        lambda: not pod_exists(core, namespace, name, uid),
        timeout=timeout,
        what=f"pod {namespace}/{name} gone",
    )


def delete_pods_and_wait(core: Any, namespace: str, timeout: float = 60) -> None:
    """Delete every pod of the namespace and wait until the kubelet has finished them."""
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=1)
    wait_until(
        lambda: not core.list_namespaced_pod(namespace).items,
        timeout=timeout,
        what=f"the pods of {namespace} gone",
    )


def pod_mounts(node: RealNode, uid: str) -> list[str]:
    """The node's mountinfo lines under the pod's kubelet directory."""
    prefix = f"{node.kubelet_root}/pods/{uid}/"
    return [line for line in node.mountinfo().splitlines() if line.split()[4].startswith(prefix)]


def remediations(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.request(
        "GET", f"/apis/unstick.dev/v1alpha1/namespaces/{namespace}/remediations"
    )["items"]
    return items


def remediation_for(cp: ControlPlane, namespace: str, uid: str) -> dict[str, Any] | None:
    for item in remediations(cp, namespace):
        if item.get("spec", {}).get("podUID") == uid:
            return item
    return None


def resolved_with_answer(cp: ControlPlane, namespace: str, uid: str) -> dict[str, Any] | None:
    """The pod's Remediation once it is `Resolved` with the agent's answer to its latest
    node steps on record and recorded by the controller (each `status.nodeActions` entry in
    `status.actions`), else None. The kubelet may remove the pod before the agent has
    written its answer: the controller marks the record Resolved first and records the
    late answer when it lands (controller/records/pod_record.py), so a read in between sees
    Resolved without nodeActions."""
    rem = remediation_for(cp, namespace, uid)
    if rem is None:
        return None
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    if status.get("phase") != "Resolved" or not steps_answered(spec, status):
        return None

    def entries(items: list[Any]) -> set[tuple[Any, Any, Any]]:
        return {(a.get("action"), a.get("target"), a.get("result")) for a in items}

    # a mandate's results name the plan's step, not its target (node_results reads it)
    done = entries(status.get("actions") or [])
    return rem if entries(node_results(status)) <= done else None


def await_resolved_with_answer(
    cp: ControlPlane, namespace: str, uid: str, timeout: float = 60
) -> dict[str, Any]:
    """`resolved_with_answer`, awaited; on timeout the failure shows the record last read."""
    try:
        found: dict[str, Any] = wait_until(
            lambda: resolved_with_answer(cp, namespace, uid),
            timeout=timeout,
            what="the Remediation marked Resolved, with the agent's answer recorded",
        )
    except TimeoutError as exc:
        last = remediation_for(cp, namespace, uid)
        raise AssertionError(f"{exc}\nthe record: {last}") from None
    return found


def incident_entry(cp: ControlPlane, namespace: str, uid: str) -> dict[str, Any] | None:
    """(the node incident that lists pod `uid`, its line in status.pods), or None
    (docs/incidents.md)."""
    for item in remediations(cp, namespace):
        if not item.get("spec", {}).get("incident"):
            continue
        for entry in (item.get("status") or {}).get("pods") or []:
            if entry.get("uid") == uid:
                return {"incident": item, "entry": entry}
    return None


def scrape(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
    return body.decode()


def eventually(check: Any, timeout: float, what: str) -> Any:
    """`wait_until`, swallowing connection errors while waiting."""

    def attempt() -> Any:
        try:
            return check()
        except OSError:
            return None

    return wait_until(attempt, timeout=timeout, what=what)


def monotonic() -> float:
    return time.monotonic()


# -- clients other than the admin -------------------------------------------------------


def service_account_token(cp: ControlPlane, namespace: str, name: str) -> str:
    """A token for the ServiceAccount from the TokenRequest API (10 minutes)."""
    answer = cp.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 600}},
    )  # fmt: skip
    token: str = answer["status"]["token"]
    return token


def request_with_token(
    cp: ControlPlane, token: str, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, Any]]:
    """One request as the token's user: (HTTP status, JSON body), errors included."""
    import json
    import ssl
    import urllib.error

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{cp.url}{path}", data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    ctx = ssl.create_default_context(cafile=str(cp.certs.ca_cert))
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


# -- unstick's pods ------------------------------------------------------------------------


def component_pod(release: Release, component: str) -> dict[str, Any]:
    (pod,) = release.pods(component)
    return pod


def agent_metrics(release: Release) -> str:
    """The agent's /metrics, scraped from its pod (hostNetwork: the node's address)."""
    ip = component_pod(release, "agent")["status"]["podIP"]
    text: str = eventually(lambda: scrape(f"http://{ip}:9101/metrics"), 30, "agent /metrics")
    return text


def counter(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text exposition (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics.splitlines():
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{want}}}" if labels else name):
            return float(value)
    return 0.0


def pod_logs(release: Release, component: str, tail: int = 200) -> str:
    """`kubectl logs` of one of unstick's pods: the API server reads them from the real
    kubelet (the node's serving certificate is signed by the control plane's CA)."""
    name = component_pod(release, component)["metadata"]["name"]
    proc = release.cp.kubectl("logs", "-n", release.namespace, name, f"--tail={tail}")
    return proc.stdout
