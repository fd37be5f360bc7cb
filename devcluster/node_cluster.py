"""What a real node needs from the control plane besides the API server: the
kube-controller-manager controllers that turn the chart's Deployment and DaemonSet into
pods and give namespaces their `default` ServiceAccount and `kube-root-ca.crt`, the
kube-scheduler, and the node role bound to the node group (the RBAC half of what the Node
authorizer grants; the API server runs with RBAC only)."""

from __future__ import annotations

from dataclasses import dataclass, field

from devcluster.controlplane import ControlPlane
from devcluster.process import Process, wait_until

# node-lifecycle: the kubelet registers its Node with the `not-ready` taint, which only
# this controller lifts. No podgc: it would delete the pods of a deleted Node itself,
# racing unstick's NodeGone, and the out-of-service taint's force-delete (podgc's, racing
# unstick's fenced NodeUnreachable). No taint-eviction-controller (separate from
# node-lifecycle since 1.29): it would delete the pods of an unreachable node (unstick's own
# among them) once their `unreachable` toleration runs out.
CONTROLLERS = (
    "node-lifecycle-controller",
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "garbage-collector-controller",
    "namespace-controller",
    # The upstream CSI driver's volumes (csi_upstream): claims bound to the PVs its
    # provisioner makes, VolumeAttachments (attachRequired: true), the driver's StatefulSet
    # and the seed's, and the protection finalizers a real cluster has.
    "persistentvolume-binder-controller",
    "persistentvolume-attach-detach-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "statefulset-controller",
)

# How long a Node may stay silent before node-lifecycle marks it NotReady (default 50 s).
NODE_MONITOR_GRACE_S = 20

NODE_ROLE_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "unstick-dev:system:nodes"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:node",
    },
    "subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
    ],
}


@dataclass
class ClusterControllers:
    control_plane: ControlPlane
    processes: list[Process] = field(init=False, default_factory=list)

    def start(self) -> ClusterControllers:
        cp = self.control_plane
        try:
            cp.request(
                "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", NODE_ROLE_BINDING
            )
        except OSError as e:
            if getattr(e, "code", None) != 409:
                raise
        kcm = [
            str(cp.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={cp.kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--root-ca-file={cp.certs.ca_cert}",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            "--secure-port=0",
            "--concurrent-deployment-syncs=2",
            # A silent kubelet's Node goes NotReady after ~20 s instead of 50 (the kubelet
            # posts its status every 5 s, nodeStatusUpdateFrequency in node_kubelet).
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s",
            "--node-monitor-period=2s",
            "--v=1",
        ]
        scheduler = [
            str(cp.bin_dir / "kube-scheduler"),
            f"--kubeconfig={cp.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=1",
        ]
        for name, argv in (("kube-controller-manager", kcm), ("kube-scheduler", scheduler)):
            self.processes.append(Process(name, argv, cp.workdir / f"{name}.log").start())
        return self

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    def wait_namespace(self, namespace: str, timeout: float = 30) -> None:
        """Until the namespace has its `default` ServiceAccount and `kube-root-ca.crt`
        (before, pods are refused or cannot start)."""
        cp = self.control_plane

        def ready() -> bool:
            try:
                cp.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                cp.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/kube-root-ca.crt")
            except OSError:
                return False
            return True

        wait_until(
            ready,
            timeout=timeout,
            what=f"namespace {namespace}'s ServiceAccount and CA",
            process=self.processes[0] if self.processes else None,
        )
