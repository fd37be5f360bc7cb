"""The OrphanedMount seed on the real node (used by the node suite and by `unstick demo` on
the real node): the project's CSI plugin (devcluster.csi_hostpath) run as a pod
from the unstick image, registered with the real kubelet through
`<kubeletRoot>/plugins_registry/` (no registrar sidecar), a `CSIDriver` (attachRequired:
false) and a static PV bound to a PVC.

The volumes live on a tmpfs of the node's (the data dir): a bind mount from another
filesystem, as a real driver's block device would be. (From the kubelet root's own
filesystem the kubelet's `IsLikelyNotMountPoint`, which compares st_dev with the parent,
would not see the bind mount at all and would delete the pod with the mount still there.)

The PV controller does not run in the suite's control plane, so the claim and the volume
are bound here: the PV's claimRef names the PVC's UID and both statuses say Bound, which is
all the kubelet checks."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from pathlib import Path
from typing import Any

from devcluster.controlplane import ControlPlane
from devcluster.node import RealNode
from devcluster.process import wait_until

DRIVER = "seed.csi.unstick.dev"
# The plugin's module, run with the unstick image's Python and packages. The image holds
# the operator only (the wheel leaves the dev harness out), so this directory of the
# source tree is mounted read-only at HARNESS_MOUNT. `devcluster`'s __init__
# imports the local control plane, which needs `cryptography`, a dependency the image does
# not install; the plugin itself needs only grpc and the CSI protos. So the package is
# entered without its __init__ (a namespace stand-in whose __path__ is the mount).
HARNESS = Path(__file__).resolve().parent
HARNESS_MOUNT = "/unstick-harness/devcluster"
_RUN = (
    "python3 -c 'import runpy, sys, types; "
    'p = types.ModuleType("devcluster"); '
    f'p.__path__ = ["{HARNESS_MOUNT}"]; '
    "sys.modules[p.__name__] = p; "
    'sys.argv[0] = "csi_hostpath"; '
    'runpy.run_module("devcluster.csi_hostpath", run_name="__main__")\''
)
VOLUME_ID = "vol-seed"


class CsiSeed:
    """The driver pod, its CSIDriver, a PV and a PVC; `cleanup()` removes all of it (the
    pods' leftover mounts too), also after a failure."""

    def __init__(
        self, cp: ControlPlane, core: Any, node: RealNode, image: str, namespace: str
    ) -> None:
        self.cp, self.core, self.node, self.image, self.ns = cp, core, node, image, namespace
        suffix = uuid.uuid4().hex[:6]
        self.pv = f"seed-pv-{suffix}"
        self.pvc = "seed-data"
        self.data_dir = node.workdir / f"csi-seed-{suffix}"
        self.plugins = 0
        self.plugin_pod = ""
        self._tmpfs = False

    # -- paths -----------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.node.kubelet_root

    @property
    def csi_socket(self) -> Path:
        return self.root / "plugins" / DRIVER / "csi.sock"

    @property
    def registration_socket(self) -> Path:
        return self.root / "plugins_registry" / f"{DRIVER}-reg.sock"

    def target(self, pod_uid: str) -> Path:
        """Where the kubelet asks the driver to publish the PV for the pod."""
        return self.root / "pods" / pod_uid / "volumes" / "kubernetes.io~csi" / self.pv / "mount"

    # -- setup -------------------------------------------------------------------------

    def setup(self) -> None:
        self.data_dir.mkdir()
        self._node_run(["mount", "-t", "tmpfs", "-o", "size=16m", "csi-seed", str(self.data_dir)])
        self._tmpfs = True
        self._node_run(["mkdir", str(self.data_dir / VOLUME_ID)])
        self.cp.request(
            "POST",
            "/apis/storage.k8s.io/v1/csidrivers",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSIDriver",
                "metadata": {"name": DRIVER},
                "spec": {
                    "attachRequired": False,
                    "podInfoOnMount": False,
                    "volumeLifecycleModes": ["Persistent"],
                },
            },
        )
        self.start_plugin()
        self._bind_claim()

    def _bind_claim(self) -> None:
        pvc = self.core.create_namespaced_persistent_volume_claim(
            self.ns,
            {
                "metadata": {"name": self.pvc},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                    "volumeName": self.pv,
                },
            },
        )
        self.core.create_persistent_volume(
            {
                "metadata": {"name": self.pv},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "claimRef": {
                        "namespace": self.ns,
                        "name": self.pvc,
                        "uid": pvc.metadata.uid,
                    },
                    "csi": {"driver": DRIVER, "volumeHandle": VOLUME_ID},
                },
            }
        )
        self.core.patch_persistent_volume_status(self.pv, {"status": {"phase": "Bound"}})
        self.core.patch_namespaced_persistent_volume_claim_status(
            self.pvc,
            self.ns,
            {"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                        "capacity": {"storage": "1Gi"}}},
        )  # fmt: skip

    def start_plugin(self) -> str:
        """A new driver pod (state file on its emptyDir: a new pod starts with none);
        returns once the real kubelet lists the driver in the CSINode."""
        self.plugins += 1
        self.plugin_pod = f"csi-plugin-{self.plugins}"
        self.core.create_namespaced_pod(self.ns, self._plugin_manifest(self.plugin_pod))
        try:
            wait_until(
                self.registered, timeout=60, what=f"{DRIVER} registered by {self.plugin_pod}"
            )
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.plugin_pod}'s log:\n{self.plugin_log()}") from None
        return self.plugin_pod

    def plugin_log(self) -> str:
        """The driver pod's container log, read from the node's pod log directory."""
        logs = self.node.workdir / "kubelet-conf" / "pod-logs"
        files = sorted(logs.glob(f"{self.ns}_{self.plugin_pod}_*/plugin/*.log"))
        return "\n".join(f.read_text(errors="replace")[-3000:] for f in files[-2:])

    def stop_plugin(self) -> None:
        """Delete the driver pod and wait until the kubelet has removed it and its
        registration: the driver is gone, with what it remembered."""
        pod = self.core.read_namespaced_pod(self.plugin_pod, self.ns)
        self.core.delete_namespaced_pod(self.plugin_pod, self.ns, grace_period_seconds=1)
        wait_until(
            lambda: not pod_exists(self.core, self.ns, self.plugin_pod, pod.metadata.uid),
            timeout=60,
            what=f"driver pod {self.plugin_pod} gone",
        )
        wait_until(lambda: not self.registered(), timeout=30, what=f"{DRIVER} unregistered")

    def registered(self) -> bool:
        try:
            csinode = self.cp.request(
                "GET", f"/apis/storage.k8s.io/v1/csinodes/{self.node.settings.name}"
            )
        except OSError:
            return False
        drivers = csinode.get("spec", {}).get("drivers") or []
        return any(d.get("name") == DRIVER for d in drivers)

    def _plugin_manifest(self, name: str) -> dict[str, Any]:
        plugin_dir = self.csi_socket.parent
        args = (
            f"--name {DRIVER} --node-id {self.node.settings.name}"
            f" --csi-socket {self.csi_socket} --registration-socket {self.registration_socket}"
            f" --data-dir {self.data_dir} --state-file /state/published.json"
        )
        command = f"mkdir -p {plugin_dir} {self.registration_socket.parent} && exec {_RUN} {args}"
        root = str(self.root)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "csi-seed-plugin"}},
            "spec": {
                "nodeName": self.node.settings.name,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "plugin",
                        "image": self.image,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", command],
                        "securityContext": {"privileged": True, "runAsUser": 0},
                        "volumeMounts": [
                            {
                                "name": "kubelet",
                                "mountPath": root,
                                "mountPropagation": "Bidirectional",
                            },
                            {"name": "data", "mountPath": str(self.data_dir)},
                            {"name": "state", "mountPath": "/state"},
                            {"name": "harness", "mountPath": HARNESS_MOUNT, "readOnly": True},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "kubelet", "hostPath": {"path": root, "type": "Directory"}},
                    {"name": "data", "hostPath": {"path": str(self.data_dir), "type": "Directory"}},
                    {"name": "state", "emptyDir": {}},
                    {"name": "harness", "hostPath": {"path": str(HARNESS), "type": "Directory"}},
                ],
            },
        }

    # -- the pod using the volume ----------------------------------------------------

    def pod_manifest(self, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "nodeName": self.node.settings.name,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": self.node.images.busybox.ref,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "echo kept > /data/file; exec sleep 3600"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": self.pvc}}],
            },
        }

    def mounted(self, pod_uid: str) -> list[str]:
        """The node's mountinfo lines of the pod's CSI target."""
        target = f" {self.target(pod_uid)} "
        return [line for line in pod_mounts(self.node, pod_uid) if target in f" {line} "]

    # -- cleanup -------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Everything the seed made, in an order that lets the kubelet finish: the pods'
        leftover mounts of the data dir first (a failed test leaves the orphaned one), then
        pods, claim, volume, CSIDriver, the tmpfs and the directory."""
        errors: list[str] = []
        steps = (
            self._unmount_leftovers,
            self._delete_pods,
            self._delete_claim_and_volume,
            lambda: self.cp.kubectl("delete", "csidriver", DRIVER, "--ignore-not-found"),
            self._unmount_data,
        )
        for step in steps:
            try:
                step()
            except Exception as e:  # every step runs; all errors are raised together
                errors.append(f"{getattr(step, '__name__', 'step')}: {e}")
        if errors:
            raise AssertionError("csi seed cleanup: " + "; ".join(errors))

    def _seed_mounts(self) -> list[str]:
        """Mount points on the node below the kubelet root that the data dir backs."""
        points = []
        for line in self.node.mountinfo().splitlines():
            fields = line.split()
            sep = fields.index("-")
            if fields[4].startswith(f"{self.root}/") and fields[sep + 2] == "csi-seed":
                points.append(fields[4])
        return points

    def _unmount_leftovers(self) -> None:
        for point in sorted(self._seed_mounts(), key=len, reverse=True):
            self._node_run(["umount", point], check=False)

    def _delete_pods(self) -> None:
        self.core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=1)
        wait_until(
            lambda: not self.core.list_namespaced_pod(self.ns).items,
            timeout=90,
            what=f"the pods of {self.ns} gone",
        )

    def _delete_claim_and_volume(self) -> None:
        from kubernetes.client.exceptions import ApiException

        unprotect = {"metadata": {"finalizers": None}}
        for delete, patch, args in (
            (
                self.core.delete_namespaced_persistent_volume_claim,
                self.core.patch_namespaced_persistent_volume_claim,
                (self.pvc, self.ns),
            ),
            (self.core.delete_persistent_volume, self.core.patch_persistent_volume, (self.pv,)),
        ):
            with contextlib.suppress(ApiException):
                delete(*args)
            with contextlib.suppress(ApiException):  # no PVC-protection controller here
                patch(*args, unprotect)

    def _unmount_data(self) -> None:
        if self._tmpfs:
            self._node_run(["umount", str(self.data_dir)])
            self._tmpfs = False
        with contextlib.suppress(FileNotFoundError):
            self.data_dir.rmdir()

    def _node_run(self, argv: list[str], check: bool = True) -> None:
        proc = subprocess.run(self.node.in_node(argv), capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on the node: {proc.stderr.strip()}")


def set_kubelet_verbosity(cp: ControlPlane, node: RealNode, level: int) -> None:
    """The running kubelet's log verbosity, PUT to its /debug/flags/v with the admin's
    client certificate (the kubelet trusts the control plane's CA for clients; its webhook
    authorization lets the admin, in system:masters, do anything). Its serving certificate
    is not checked: it is the harness's own kubelet on the node's bridge address."""
    import ssl
    import urllib.request

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(cp.certs.admin_cert), str(cp.certs.admin_key))
    address = f"{node.settings.network.gateway}:{node.settings.kubelet_port}"
    req = urllib.request.Request(
        f"https://{address}/debug/flags/v", data=str(level).encode(), method="PUT"
    )
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        resp.read()


def pod_exists(core: Any, namespace: str, name: str, uid: str | None = None) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return uid is None or pod.metadata.uid == uid


def pod_mounts(node: RealNode, uid: str) -> list[str]:
    """The node's mountinfo lines under the pod's kubelet directory."""
    prefix = f"{node.kubelet_root}/pods/{uid}/"
    return [line for line in node.mountinfo().splitlines() if line.split()[4].startswith(prefix)]
