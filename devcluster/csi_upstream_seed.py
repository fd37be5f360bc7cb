"""The OrphanedMount seed with the upstream driver (csi_upstream), used by the node suite
and `unstick demo` on the real node: a StatefulSet of one replica whose claim comes from the
driver's StorageClass (dynamic provisioning by external-provisioner, a VolumeAttachment
attached by external-attacher); its pod writes a file on the volume the first time and
prints what it finds there every time it starts.

    echo written > /data/file      (first pod)
    found: written                 (its replacement, on the same volume)

`cleanup()` removes the StatefulSet, its pods and claims (the driver deletes the volumes),
unmounting first whatever of the claim's volumes a failed test left mounted."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

from devcluster.controlplane import ControlPlane
from devcluster.csi_upstream import DRIVER, STORAGE_CLASS
from devcluster.node import RealNode
from devcluster.process import wait_until

WRITE_ONCE = (
    'if [ -f /data/file ]; then echo "found: $(cat /data/file)"; '
    "else echo written > /data/file && echo wrote; fi; exec sleep 3600"
)


class UpstreamSeed:
    def __init__(
        self,
        cp: ControlPlane,
        core: Any,
        node: RealNode,
        namespace: str,
        *,
        name: str = "db",
        annotations: dict[str, str] | None = None,
        access_mode: str = "ReadWriteOnce",
    ) -> None:
        self.cp, self.core, self.node, self.ns, self.name = cp, core, node, namespace, name
        self.annotations = annotations or {}
        self.access_mode = access_mode
        self.pv_names: set[str] = set()

    @property
    def pod_name(self) -> str:
        return f"{self.name}-0"

    @property
    def claim(self) -> str:
        return f"data-{self.name}-0"

    def _template(self) -> dict[str, Any]:
        container = {
            "name": "main",
            "image": self.node.images.busybox.ref,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", WRITE_ONCE],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }
        return {
            "metadata": {"labels": {"app": self.name}, "annotations": self.annotations},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                # through the scheduler (other nodes may exist: the demo's), to this node
                "nodeSelector": {"kubernetes.io/hostname": self.node.settings.name},
                "containers": [container],
            },
        }

    def _claim_spec(self) -> dict[str, Any]:
        return {
            "accessModes": [self.access_mode],
            "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": "16Mi"}},
        }

    def create(self) -> None:
        """The StatefulSet (its controller makes the claim and the pod)."""
        self.cp.request(
            "POST",
            f"/apis/apps/v1/namespaces/{self.ns}/statefulsets",
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": self.name},
                "spec": {
                    "serviceName": self.name,
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": self.name}},
                    "template": self._template(),
                    "volumeClaimTemplates": [
                        {"metadata": {"name": "data"}, "spec": self._claim_spec()}
                    ],
                },
            },
        )

    def create_pod(self, name: str = "", claim: bool = True, pinned: bool = False) -> str:
        """The same claim and pod without a StatefulSet (once deleted, the pod stays gone:
        the demo's db-0); `name`: another pod on the same claim (`claim=False`: the claim
        exists); `pinned`: placed on the node by `spec.nodeName`, not by the scheduler (as a
        controller that places its own pods does). Returns the pod's UID."""
        if claim:
            self.core.create_namespaced_persistent_volume_claim(
                self.ns, {"metadata": {"name": self.claim}, "spec": self._claim_spec()}
            )
        template = self._template()
        template["metadata"]["name"] = name or self.pod_name
        if pinned:
            template["spec"]["nodeName"] = self.node.settings.name
        template["spec"]["volumes"] = [
            {"name": "data", "persistentVolumeClaim": {"claimName": self.claim}}
        ]
        uid: str = self.core.create_namespaced_pod(self.ns, template).metadata.uid
        return uid

    def wait_running(self, other_than: str | None = None, timeout: float = 120) -> str:
        """The UID of the running pod (a new one when `other_than` is the old UID)."""

        def running() -> str | None:
            with contextlib.suppress(Exception):
                pod = self.core.read_namespaced_pod(self.pod_name, self.ns)
                if pod.metadata.uid != other_than and pod.status.phase == "Running":
                    uid: str = pod.metadata.uid
                    return uid
            return None

        found = wait_until(running, timeout=timeout, what=f"{self.ns}/{self.pod_name} Running")
        self.pv_names.add(self.pv())
        return str(found)

    def pv(self) -> str:
        claim = self.core.read_namespaced_persistent_volume_claim(self.claim, self.ns)
        name: str = claim.spec.volume_name or ""
        return name

    def volume_handle(self) -> str:
        """The driver's volume id (the PV's csi.volumeHandle)."""
        pv = self.core.read_persistent_volume(self.pv())
        handle: str = pv.spec.csi.volume_handle
        return handle

    def target(self, pod_uid: str) -> Path:
        root = self.node.kubelet_root
        return root / "pods" / pod_uid / "volumes" / "kubernetes.io~csi" / self.pv() / "mount"

    def mounted(self, pod_uid: str) -> bool:
        target = str(self.target(pod_uid))
        return any(line.split()[4] == target for line in self.node.mountinfo().splitlines())

    def logs(self) -> str:
        proc = self.cp.kubectl("logs", "-n", self.ns, self.pod_name, check=False)
        return proc.stdout + proc.stderr

    def attachments(self) -> list[dict[str, Any]]:
        """The VolumeAttachments of the claim's PV."""
        items = self.cp.request("GET", "/apis/storage.k8s.io/v1/volumeattachments")["items"]
        pv = self.pv()
        return [a for a in items if a["spec"]["source"].get("persistentVolumeName") == pv]

    # -- cleanup ---------------------------------------------------------------------------

    def cleanup(self) -> None:
        errors: list[str] = []
        for step in (self._delete_statefulset, self._unmount_leftovers, self._delete_pods,
                     self._delete_claims):  # fmt: skip
            try:
                step()
            except Exception as e:  # every step runs; the errors are raised together
                errors.append(f"{step.__name__}: {e}")
        if errors:
            raise AssertionError("upstream seed cleanup: " + "; ".join(errors))

    def _delete_statefulset(self) -> None:
        with contextlib.suppress(OSError):
            self.cp.request(
                "DELETE", f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/{self.name}"
            )

    def _unmount_leftovers(self) -> None:
        """What a failed test leaves: the claim's volume still mounted in a pod's dir."""
        suffixes = tuple(f"/volumes/kubernetes.io~csi/{pv}/mount" for pv in self.pv_names)
        prefix = f"{self.node.kubelet_root}/pods/"
        for line in self.node.mountinfo().splitlines():
            point = line.split()[4]
            if suffixes and point.startswith(prefix) and point.endswith(suffixes):
                subprocess.run(self.node.in_node(["umount", point]), capture_output=True)

    def _delete_pods(self) -> None:
        self.core.delete_collection_namespaced_pod(self.ns, grace_period_seconds=1)
        wait_until(
            lambda: not self.core.list_namespaced_pod(self.ns).items,
            timeout=90,
            what=f"the pods of {self.ns} gone",
        )

    def _delete_claims(self) -> None:
        """The claims; the driver deletes their volumes (reclaimPolicy Delete). Without a
        driver (uninstalled by a test) the PVs are released by hand."""
        self.core.delete_collection_namespaced_persistent_volume_claim(self.ns)
        try:
            wait_until(self._pvs_gone, timeout=60, what=f"the PVs of {DRIVER} in {self.ns} gone")
        except TimeoutError:
            for pv in self.pv_names:
                with contextlib.suppress(Exception):
                    self.core.patch_persistent_volume(pv, {"metadata": {"finalizers": None}})
                    self.core.delete_persistent_volume(pv)
            raise

    def _pvs_gone(self) -> bool:
        names = {pv.metadata.name for pv in self.core.list_persistent_volume().items}
        return not (names & self.pv_names)
