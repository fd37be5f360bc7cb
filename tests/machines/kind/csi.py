"""The upstream csi-driver-host-path on one kind worker (docs/kind.md, "A StatefulSet
replacement blocked"): the objects its `deploy/kubernetes-*/hostpath/` manifests make
(devcluster.csi_upstream_objects, shared with the real-node suite), the plugin's
StatefulSet of one replica pinned to the worker, and a StatefulSet `db` of one replica
with a ReadWriteOnce claim on it.

One change from upstream: external-provisioner runs with `Topology=false`, so the PVs
carry no node affinity. With it (upstream's default) a hostpath PV is pinned to the
plugin's node and a replacement on another node is refused by the scheduler ("volume node
affinity conflict"): no attach is ever tried. Without it the control plane treats the
volume as a network disk any node may attach, as a cloud's disk in one zone: the
attach/detach controller refuses the second attach with its `Multi-Attach error` — the
case people meet. The data stays on the first worker (the replacement would fail at
NodeStage on the other; the test does not go that far)."""

from __future__ import annotations

from typing import Any

from devcluster.csi_upstream import (
    DRIVER,
    FIXED,
    NAMESPACE,
    RUNNER_RULES,
    SERVICE_ACCOUNT,
    SIDECARS,
    STATEFULSET,
    STORAGE_CLASS,
)
from devcluster.csi_upstream_objects import driver_objects, plugin_statefulset
from devcluster.process import wait_until
from unstick.controller.aftermath.watcher import MULTI_ATTACH

from .support import Kind, sample

PLUGIN_IMAGES = (f"csi-hostpath-{FIXED}", SIDECARS)
KUBELET_ROOT = "/var/lib/kubelet"
DATA_DIR = "/var/lib/csi-hostpath-data"


def unavailable(kind: Kind) -> str | None:
    """Why the driver cannot be deployed (its images not built), or None."""
    missing = [name for name in PLUGIN_IMAGES if name not in kind.images]
    if missing:
        return (
            f"{', '.join(missing)} not in bin/node-images.json: `make tools images` (docs/csi.md)"
        )
    return None


def install(kind: Kind, node: str) -> None:
    """The driver on `node` (its images loaded there at cluster setup); returns once the
    node's CSINode lists the driver and the plugin's containers are all ready."""
    kind.wait_loaded("csi")
    kind.apply(*(body for _, body in driver_objects(
        NAMESPACE, SERVICE_ACCOUNT, RUNNER_RULES, DRIVER, STORAGE_CLASS)))  # fmt: skip
    plugin = plugin_statefulset(
        name=STATEFULSET,
        namespace=NAMESPACE,
        service_account=SERVICE_ACCOUNT,
        driver=DRIVER,
        plugin_image=kind.images[PLUGIN_IMAGES[0]]["ref"],
        sidecars_image=kind.images[SIDECARS]["ref"],
        node=node,
        kubelet_root=KUBELET_ROOT,
        data_dir=DATA_DIR,
    )
    for container in plugin["spec"]["template"]["spec"]["containers"]:
        if container["name"] == "csi-provisioner":
            container["args"] = [
                "--feature-gates=Topology=false" if a.startswith("--feature-gates=") else a
                for a in container["args"]
            ]
    kind.apply(plugin)

    def ready() -> bool:
        csinode = kind.get("csinode", node)
        drivers = (csinode.get("spec") or {}).get("drivers") or []
        pods = kind.pods(NAMESPACE)
        statuses = [s for p in pods for s in p.get("status", {}).get("containerStatuses") or []]
        return (
            any(d.get("name") == DRIVER for d in drivers)
            and len(statuses) == 4
            and all(s.get("ready") for s in statuses)
        )

    wait_until(ready, timeout=180, what=f"{DRIVER} registered on {node} and its plugin ready")


def uninstall(kind: Kind) -> None:
    kind.kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found")
    for _, body in driver_objects(NAMESPACE, SERVICE_ACCOUNT, RUNNER_RULES, DRIVER, STORAGE_CLASS):
        if body["kind"] != "Namespace" and "namespace" not in body["metadata"]:
            kind.kubectl(
                "delete", body["kind"].lower(), body["metadata"]["name"], "--ignore-not-found"
            )


def statefulset(
    kind: Kind, namespace: str, *, claim: bool = True, prefer: str | None = None
) -> dict[str, Any]:
    """`db`: one replica of busybox with a ReadWriteOnce claim `data` from the driver's
    StorageClass (`claim=False`: none); `prefer`: a node it prefers (the first pod lands
    there, its replacement goes where it can)."""
    labels = {"app": "db"}
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": namespace},
        "spec": {
            "serviceName": "db",
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "db",
                            "image": kind.images["busybox"]["ref"],
                            "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": STORAGE_CLASS,
                        "resources": {"requests": {"storage": "1Mi"}},
                    },
                }
            ],
        },
    }
    pod = sts["spec"]["template"]["spec"]
    if not claim:
        del sts["spec"]["volumeClaimTemplates"], pod["containers"][0]["volumeMounts"]
    if prefer is not None:
        term = {"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer]}
        pod["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [term]}}]}}  # fmt: skip
    return sts


def attachments(kind: Kind, pv: str) -> list[dict[str, Any]]:
    """The VolumeAttachments of `pv`."""
    items: list[dict[str, Any]] = kind.get("volumeattachments")["items"]
    return [va for va in items if va["spec"]["source"].get("persistentVolumeName") == pv]


def attached_to(kind: Kind, pv: str) -> list[str]:
    """The nodes `pv` is attached to (VolumeAttachments marked attached)."""
    return sorted(
        va["spec"]["nodeName"]
        for va in attachments(kind, pv)
        if (va.get("status") or {}).get("attached")
    )


def start_db(kind: Kind, namespace: str, node: str, other: str) -> tuple[str, str]:
    """The driver on `node` and `db-0` running there with its volume attached (`other`
    cordoned meanwhile so that the scheduler picks `node`); (db-0's uid, its PV)."""
    install(kind, node)
    kind.apply(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": namespace, "labels": {"unstick.dev/remediate": "true"}}}
    )  # fmt: skip
    kind.kubectl("cordon", other)
    try:
        kind.apply(statefulset(kind, namespace))
        wait_until(
            lambda: kind.pods(namespace), timeout=60, what=f"the StatefulSet's pod in {namespace}"
        )
        kind.kubectl("wait", "--for=condition=Ready", "pod/db-0", "-n", namespace,
                     "--timeout=180s")  # fmt: skip
    finally:
        kind.kubectl("uncordon", other)
    pod = kind.get("pod", "db-0", "-n", namespace)
    assert pod["spec"]["nodeName"] == node, pod["spec"]["nodeName"]
    pv = kind.get("pvc", "data-db-0", "-n", namespace)["spec"]["volumeName"]
    wait_until(lambda: attached_to(kind, pv) == [node], timeout=60, what=f"{pv} attached to {node}")
    return pod["metadata"]["uid"], pv


def replacement_blocked(
    kind: Kind, namespace: str, old_uid: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Waits for the StatefulSet's new db-0 (another uid) to be refused its attach and for
    unstick's BlockedReplacement Event on it; (the new pod, that Event)."""

    def replacement() -> dict[str, Any] | None:
        pods = [p for p in kind.pods(namespace) if p["metadata"]["uid"] != old_uid]
        return pods[0] if pods and pods[0]["spec"].get("nodeName") else None

    new = wait_until(replacement, timeout=180, what="the StatefulSet's replacement db-0 placed")

    def event() -> dict[str, Any] | None:
        for e in kind.events(namespace):
            about = e["involvedObject"]
            if about.get("uid") == new["metadata"]["uid"] and e["reason"] == "BlockedReplacement":
                found: dict[str, Any] = e
                return found
        return None

    try:
        blocked = wait_until(event, timeout=180, what="BlockedReplacement on the new db-0")
    except TimeoutError:
        seen = [(e["reason"], e["message"]) for e in kind.events(namespace)]
        raise AssertionError(f"no BlockedReplacement; the Events: {seen}") from None
    return new, blocked


def statefulset_replacement_blocked(
    kind: Kind, sts_ns: str, db_uid: str, pv: str, node: str, other: str, controller: dict[str, Any]
) -> None:
    """The StatefulSet part of test_node_partitioned, while `node` is cut off."""
    # An admin force-deletes db-0 (what unstick refuses on a node not fenced); the
    # StatefulSet makes it again, on the other worker. Its volume stays attached to
    # the cut-off worker: the attach/detach controller waits up to 6 min for an
    # unreachable node to unmount it.
    kind.kubectl("delete", "pod", "db-0", "-n", sts_ns, "--force", "--grace-period=0")
    new, blocked = replacement_blocked(kind, sts_ns, db_uid)
    assert new["spec"]["nodeName"] == other
    message = blocked["message"]
    assert f"(PV {pv}) is still attached to node {node}" in message, message
    assert "force-detach after 6 min" in message and "unstick never detaches" in message
    refused = [e["message"] for e in kind.events(sts_ns) if e["reason"] == "FailedAttachVolume"]
    # the attach/detach controller's words: "Multi-Attach error" up to 1.36, "Waiting for
    # detach ... already exclusively attached to one node" in 1.37
    assert any(w in m for m in refused for w in MULTI_ATTACH), refused
    metrics = kind.scrape(controller["metadata"]["name"], 9100)
    assert sample(metrics, "unstick_blocked_replacements", namespace=sts_ns) == 1
    assert [va["spec"]["nodeName"] for va in attachments(kind, pv)] == [node]
