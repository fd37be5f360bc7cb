"""The Kubernetes objects of the upstream csi-driver-host-path deployment (csi_upstream):
written after its `deploy/kubernetes-*/hostpath/` manifests and the sidecars'
`deploy/kubernetes/rbac.yaml`, without what the suite does not run (resizer, snapshotter,
health monitor, liveness probe) and with the node's paths."""

from __future__ import annotations

from typing import Any

_RBAC = "rbac.authorization.k8s.io"
_LABELS = {"app.kubernetes.io/instance": "hostpath.csi.k8s.io",
           "app.kubernetes.io/part-of": "csi-driver-host-path"}  # fmt: skip


def driver_objects(
    namespace: str,
    service_account: str,
    runner_rules: dict[str, list[tuple[str, str, str]]],
    driver: str,
    storage_class: str,
) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object): namespace, ServiceAccount, the sidecars' ClusterRoles and
    their bindings, the CSIDriver, the StorageClass."""
    objects: list[tuple[str, dict[str, Any]]] = [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": namespace}}),
        (f"/api/v1/namespaces/{namespace}/serviceaccounts",
         {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": {"name": service_account, "namespace": namespace}}),
    ]  # fmt: skip
    for role, rules in runner_rules.items():
        objects.append(
            (f"/apis/{_RBAC}/v1/clusterroles", {
                "apiVersion": f"{_RBAC}/v1", "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [{"apiGroups": [group], "resources": [resource], "verbs": verbs.split()}
                          for group, resource, verbs in rules],
            })
        )  # fmt: skip
        objects.append(
            (f"/apis/{_RBAC}/v1/clusterrolebindings", {
                "apiVersion": f"{_RBAC}/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"csi-hostpathplugin-{role}"},
                "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": service_account,
                              "namespace": namespace}],
            })
        )  # fmt: skip
    objects.append(
        ("/apis/storage.k8s.io/v1/csidrivers", {
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": driver, "labels": _LABELS},
            # attachRequired: true (also upstream's default, left unset there): the
            # attach/detach controller creates VolumeAttachments, external-attacher
            # marks them attached.
            "spec": {"attachRequired": True, "podInfoOnMount": True,
                     "volumeLifecycleModes": ["Persistent", "Ephemeral"],
                     "fsGroupPolicy": "File"},
        })
    )  # fmt: skip
    objects.append(
        ("/apis/storage.k8s.io/v1/storageclasses", {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": storage_class},
            "provisioner": driver,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": False,
        })
    )  # fmt: skip
    return objects


def _host_path(name: str, path: str, kind: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": kind}}


def plugin_statefulset(
    *,
    name: str,
    namespace: str,
    service_account: str,
    driver: str,
    plugin_image: str,
    sidecars_image: str,
    node: str,
    kubelet_root: str,
    data_dir: str,
) -> dict[str, Any]:
    """The plugin's StatefulSet of one replica: hostpathplugin, node-driver-registrar,
    csi-provisioner (node deployment off: one node), csi-attacher; all on the socket
    `<kubelet root>/plugins/csi-hostpath/csi.sock`, seen as /csi/csi.sock."""
    labels = {**_LABELS, "app.kubernetes.io/name": name, "app.kubernetes.io/component": "plugin"}
    node_name = {
        "name": "KUBE_NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    socket = {"name": "socket-dir", "mountPath": "/csi"}
    privileged = {"privileged": True}
    sidecar_args = ["--v=5", "--csi-address=/csi/csi.sock"]
    containers = [
        {
            "name": "hostpath",
            "image": plugin_image,
            "imagePullPolicy": "Never",
            "command": ["hostpathplugin"],
            "args": [f"--drivername={driver}", "--v=5", "--endpoint=unix:///csi/csi.sock",
                     "--nodeid=$(KUBE_NODE_NAME)", "--statedir=/csi-data-dir"],
            "env": [node_name],
            "securityContext": privileged,
            "volumeMounts": [
                socket,
                {"name": "mountpoint-dir", "mountPath": f"{kubelet_root}/pods",
                 "mountPropagation": "Bidirectional"},
                {"name": "plugins-dir", "mountPath": f"{kubelet_root}/plugins",
                 "mountPropagation": "Bidirectional"},
                {"name": "csi-data-dir", "mountPath": "/csi-data-dir"},
                {"name": "dev-dir", "mountPath": "/dev"},
            ],
        },
        {
            "name": "node-driver-registrar",
            "image": sidecars_image,
            "imagePullPolicy": "Never",
            "command": ["csi-node-driver-registrar"],
            "args": [*sidecar_args,
                     f"--kubelet-registration-path={kubelet_root}/plugins/csi-hostpath/csi.sock"],
            "env": [node_name],
            "securityContext": privileged,
            "volumeMounts": [socket, {"name": "registration-dir", "mountPath": "/registration"}],
        },
        {
            "name": "csi-provisioner",
            "image": sidecars_image,
            "imagePullPolicy": "Never",
            "command": ["csi-provisioner"],
            "args": [*sidecar_args, "--feature-gates=Topology=true"],
            "securityContext": privileged,
            "volumeMounts": [socket],
        },
        {
            "name": "csi-attacher",
            "image": sidecars_image,
            "imagePullPolicy": "Never",
            "command": ["csi-attacher"],
            "args": sidecar_args,
            "securityContext": privileged,
            "volumeMounts": [socket],
        },
    ]  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": service_account,
                    "nodeName": node,
                    "terminationGracePeriodSeconds": 2,
                    "containers": containers,
                    "volumes": [
                        _host_path("socket-dir", f"{kubelet_root}/plugins/csi-hostpath",
                                   "DirectoryOrCreate"),
                        _host_path("mountpoint-dir", f"{kubelet_root}/pods", "DirectoryOrCreate"),
                        _host_path("registration-dir", f"{kubelet_root}/plugins_registry",
                                   "Directory"),
                        _host_path("plugins-dir", f"{kubelet_root}/plugins", "Directory"),
                        _host_path("csi-data-dir", data_dir, "DirectoryOrCreate"),
                        _host_path("dev-dir", "/dev", "Directory"),
                    ],
                },
            },
        },
    }  # fmt: skip
