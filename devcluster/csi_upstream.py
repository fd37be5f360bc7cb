"""The upstream csi-driver-host-path on the real node, deployed as its own
`deploy/kubernetes-*/hostpath/` manifests deploy it: one pod (a StatefulSet of one replica)
with the `hostpathplugin` container and its sidecars node-driver-registrar (the kubelet's
plugin registration), external-provisioner (PVs from a StorageClass) and external-attacher
(the CSIDriver has attachRequired: true, so the attach/detach controller makes real
VolumeAttachments and the attacher marks them attached). The programs are built from the
upstream release archives by `hack/build-thirdparty.sh`, their images by
`hack/build-images.sh` (`csi-hostpath-<version>`, `csi-sidecars` in bin/node-images.json).

Paths differ from upstream only where the node's do: the kubelet root is the node's
(`<workdir>/kubelet`, mounted at the same path in the containers), the volumes' data dir
is `<workdir>/csi-hostpath-data` (on the kubelet root's filesystem, as upstream's
/var/lib/csi-hostpath-data is on /var/lib/kubelet's). The driver keeps its state file
there too (`--statedir`), so a restarted container finds it: that is where v1.11.0 lost
what it had published (issue #457: a volume updated in memory was not written back)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster.controlplane import ControlPlane, find_bin_dir
from devcluster.node import RealNode
from devcluster.node_containerd import ctr
from devcluster.node_images import INDEX_NAME, NodeImage
from devcluster.process import wait_until

DRIVER = "hostpath.csi.k8s.io"
VERSIONS = ("v1.11.0", "v1.12.0")
BUGGY, FIXED = VERSIONS
NAMESPACE = "csi-hostpath"
STORAGE_CLASS = "csi-hostpath-sc"
STATEFULSET = "csi-hostpathplugin"
PLUGIN_POD = f"{STATEFULSET}-0"
SERVICE_ACCOUNT = "csi-hostpathplugin-sa"
SIDECARS = "csi-sidecars"
# The RBAC rules the sidecars' own deploy/kubernetes/rbac.yaml grant (leader election off,
# no snapshots): external-provisioner-runner and external-attacher-runner.
RUNNER_RULES: dict[str, list[tuple[str, str, str]]] = {
    "external-provisioner-runner": [
        ("", "persistentvolumes", "get list watch create patch delete"),
        ("", "persistentvolumeclaims", "get list watch update"),
        ("storage.k8s.io", "storageclasses", "get list watch"),
        ("", "events", "list watch create update patch"),
        ("storage.k8s.io", "csinodes", "get list watch"),
        ("", "nodes", "get list watch"),
        ("storage.k8s.io", "volumeattachments", "get list watch"),
    ],
    "external-attacher-runner": [
        ("", "persistentvolumes", "get list watch patch"),
        ("storage.k8s.io", "csinodes", "get list watch"),
        ("storage.k8s.io", "volumeattachments", "get list watch patch"),
        ("storage.k8s.io", "volumeattachments/status", "patch"),
    ],
}


@dataclass(frozen=True)
class UpstreamImages:
    plugin: NodeImage
    sidecars: NodeImage


def upstream_images(version: str, index: Path | None = None) -> UpstreamImages:
    """The images of `version` listed in bin/node-images.json; FileNotFoundError saying
    what to build when they are not there."""
    if version not in VERSIONS:
        raise ValueError(f"csi-driver-host-path version {version!r}: one of {VERSIONS}")
    index = index or find_bin_dir() / INDEX_NAME
    raw = json.loads(index.read_text()) if index.exists() else {}
    found = []
    for name in (f"csi-hostpath-{version}", SIDECARS):
        entry = raw.get(name) or {}
        archive = Path(entry.get("archive", ""))
        if not entry.get("ref") or not archive.is_file():
            raise FileNotFoundError(f"{index}: no image {name!r}: {_why_not_built(index)}")
        found.append(NodeImage(ref=str(entry["ref"]), archive=archive))
    return UpstreamImages(*found)


def _why_not_built(index: Path) -> str:
    """hack/build-thirdparty.sh's reason (bin/thirdparty.json), else how to build them."""
    try:
        missing = json.loads((index.parent / "thirdparty.json").read_text()).get("missing")
    except (OSError, ValueError):
        missing = None
    if isinstance(missing, str) and missing:
        return f"the upstream programs were {missing}"
    return "`make tools images` builds it from the upstream release archives (docs/csi.md)"


def upstream_unavailable(version: str) -> str | None:
    """Why the upstream driver at `version` cannot be deployed here (None: it can)."""
    try:
        upstream_images(version)
    except FileNotFoundError as e:
        return str(e)
    return None


class UpstreamDriver:
    """csi-driver-host-path `version` on `node`; `uninstall()` removes all of it (not the
    volumes' data dir, which is the node's: `RealNode.stop` removes it)."""

    def __init__(self, cp: ControlPlane, node: RealNode, version: str) -> None:
        self.cp, self.node, self.version = cp, node, version
        self.images = upstream_images(version)

    # -- paths -------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.node.kubelet_root

    @property
    def data_dir(self) -> Path:
        return self.node.workdir / "csi-hostpath-data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "plugins" / "csi-hostpath"

    # -- install / uninstall -------------------------------------------------------------

    def install(self) -> UpstreamDriver:
        for image in (self.images.plugin, self.images.sidecars):
            self.node.import_image(image)
        self.data_dir.mkdir(exist_ok=True)
        for path, body in self._objects():
            self._create(path, body)
        self.start_plugin()
        return self

    def start_plugin(self) -> None:
        """The plugin's StatefulSet; returns once the kubelet lists the driver in the
        CSINode and every container of the pod is ready."""
        self._create(f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets", self._statefulset())
        self.wait_ready()

    def wait_ready(self, timeout: float = 120) -> None:
        try:
            wait_until(
                lambda: self.registered() and self._pod_ready(),
                timeout=timeout,
                what=f"{DRIVER} {self.version} registered and {PLUGIN_POD} ready",
            )
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.describe()}") from None

    def stop_plugin(self) -> None:
        """The plugin's StatefulSet deleted (the driver uninstalled, its CSIDriver, RBAC
        and StorageClass kept); returns once the pod is gone and the kubelet has
        unregistered the driver."""
        self.cp.request(
            "DELETE", f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{STATEFULSET}"
        )
        wait_until(lambda: self.plugin_pod() is None, timeout=90, what=f"{PLUGIN_POD} gone")
        wait_until(lambda: not self.registered(), timeout=60, what=f"{DRIVER} unregistered")

    def uninstall(self) -> None:
        if self.plugin_pod() is not None or self._exists(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{STATEFULSET}"
        ):
            self.stop_plugin()
        for path, body in reversed(self._objects()):
            self._delete(f"{path}/{body['metadata']['name']}")
        wait_until(
            lambda: not self._exists(f"/api/v1/namespaces/{NAMESPACE}"),
            timeout=60,
            what=f"namespace {NAMESPACE} gone",
        )

    # -- the plugin container --------------------------------------------------------------

    def plugin_pod(self) -> dict[str, Any] | None:
        try:
            pod: dict[str, Any] = self.cp.request(
                "GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{PLUGIN_POD}"
            )
        except OSError:
            return None
        return pod

    def restarts(self) -> int:
        status = self._container_status("hostpath")
        return int(status.get("restartCount", 0)) if status else 0

    def restart_plugin_container(self) -> None:
        """SIGKILL the hostpathplugin container's process (as a crash or an OOM kill would
        end it); the kubelet starts it again in the same pod, with the same state file."""
        status = self._container_status("hostpath")
        if not status or "containerID" not in status:
            raise RuntimeError(f"{PLUGIN_POD} has no running hostpath container: {status}")
        before = int(status.get("restartCount", 0))
        container = status["containerID"].partition("://")[2]
        ctr(self.node.containerd_settings, "tasks", "kill", "--signal", "SIGKILL", container)
        wait_until(
            lambda: self.restarts() > before and self._pod_ready() and self.registered(),
            timeout=90,
            what=f"the hostpath container of {PLUGIN_POD} restarted and ready",
        )

    def log(self, container: str = "hostpath") -> str:
        """Every log file of `container` of the plugin pod (this and earlier instances),
        read from the node's pod log directory."""
        logs = self.node.workdir / "kubelet-conf" / "pod-logs"
        files = sorted(logs.glob(f"{NAMESPACE}_{PLUGIN_POD}_*/{container}/*.log"))
        return "\n".join(f.read_text(errors="replace") for f in files)

    def registered(self) -> bool:
        try:
            csinode = self.cp.request(
                "GET", f"/apis/storage.k8s.io/v1/csinodes/{self.node.settings.name}"
            )
        except OSError:
            return False
        drivers = csinode.get("spec", {}).get("drivers") or []
        return any(d.get("name") == DRIVER for d in drivers)

    def describe(self) -> str:
        pod = self.plugin_pod()
        status = (pod or {}).get("status", {})
        lines = [f"{PLUGIN_POD}: {status.get('phase')} {status.get('containerStatuses')}"]
        for container in ("hostpath", "node-driver-registrar", "csi-provisioner", "csi-attacher"):
            lines.append(f"-- {container}:\n{self.log(container)[-1500:]}")
        lines.append("-- kubelet:\n" + self.node.log_tail("kubelet", 20))
        return "\n".join(lines)

    def _container_status(self, name: str) -> dict[str, Any] | None:
        pod = self.plugin_pod() or {}
        for status in pod.get("status", {}).get("containerStatuses") or []:
            if status.get("name") == name:
                found: dict[str, Any] = status
                return found
        return None

    def _pod_ready(self) -> bool:
        pod = self.plugin_pod() or {}
        statuses = pod.get("status", {}).get("containerStatuses") or []
        return len(statuses) == 4 and all(s.get("ready") for s in statuses)

    # -- API helpers -------------------------------------------------------------------------

    def _create(self, path: str, body: dict[str, Any]) -> None:
        try:
            self.cp.request("POST", path, body)
        except OSError as e:
            if getattr(e, "code", None) != 409:
                raise

    def _delete(self, path: str) -> None:
        try:
            self.cp.request("DELETE", path)
        except OSError as e:
            if getattr(e, "code", None) != 404:
                raise

    def _exists(self, path: str) -> bool:
        try:
            self.cp.request("GET", path)
        except OSError:
            return False
        return True

    # -- the objects ---------------------------------------------------------------------------

    def _objects(self) -> list[tuple[str, dict[str, Any]]]:
        """(collection path, object) of everything but the StatefulSet, in creation order."""
        from devcluster.csi_upstream_objects import driver_objects

        return driver_objects(NAMESPACE, SERVICE_ACCOUNT, RUNNER_RULES, DRIVER, STORAGE_CLASS)

    def _statefulset(self) -> dict[str, Any]:
        from devcluster.csi_upstream_objects import plugin_statefulset

        return plugin_statefulset(
            name=STATEFULSET,
            namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT,
            driver=DRIVER,
            plugin_image=self.images.plugin.ref,
            sidecars_image=self.images.sidecars.ref,
            node=self.node.settings.name,
            kubelet_root=str(self.root),
            data_dir=str(self.data_dir),
        )
