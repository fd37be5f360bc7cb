"""The demo on a real node (devcluster.node: kubelet + containerd + runc + CNI in
their own namespaces), with unstick installed from the chart by `helm install`, as the
real-node suite runs it.

Which scenario runs where:
- db-0 (OrphanedMount) and uploader (MountBusy) run on the real node: db-0 on a volume of
  the upstream csi-driver-host-path v1.11.0 (devcluster.csi_upstream: plugin,
  registrar, provisioner, attacher; a claim from its StorageClass), whose hostpathplugin
  container is killed and restarted and forgets where it published (upstream issue #457);
  where its images were not built, the project's CSI plugin stands in for it
  (devcluster.csi_seed: a static PV, the plugin restarted with its state lost).
  uploader is a busybox pod whose memory emptyDir a process on the node keeps open. The
  real kubelet calls NodeStage/NodePublish, then loops on what it cannot tear down, and
  its log says so (shown under the row).
- cache-0 (NodeGone), report-job (FinalizerBlocked) and web-7 (NodeUnreachable) are
  API-only: a Node object deleted, a finalizer nobody removes (on a kwok node), a Node
  whose Ready condition went Unknown. A real kubelet adds nothing to them.
- The replacement blocked by web-7's volume is on the real node: its kubelet waits for an
  attachment that never comes.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from devcluster.controlplane import ControlPlane, ControlPlaneSettings, find_bin_dir
from devcluster.csi_seed import CsiSeed, set_kubelet_verbosity
from devcluster.csi_upstream import BUGGY, UpstreamDriver, upstream_unavailable
from devcluster.csi_upstream_seed import UpstreamSeed
from devcluster.demo import cluster
from devcluster.demo.backend import Cluster, scrape_metrics
from devcluster.demo.scenarios import ABANDONED_FINALIZER, NAMESPACE, scenarios
from devcluster.kwok import Kwok
from devcluster.node import NodeSettings, RealNode, children
from devcluster.node_check import lock_holders
from devcluster.node_cluster import ClusterControllers
from devcluster.node_images import NodeImages
from devcluster.process import wait_until

NODE = NodeSettings().name  # the real-node suite's name: its lock is shared
RELEASE, RELEASE_NAMESPACE = "unstick", "unstick-system"
ON_THE_NODE = {"kubernetes.io/hostname": NODE}
ORPHAN_UID = "0a0a0a0a-dead-4bad-8bad-0a0a0a0a0a0a"

# What the real kubelet logs when it cannot finish a pod's volumes (kubelet_volumes.go,
# operation_generator.go, the mounter's umount error).
KUBELET_SAYS = (
    "volumes are still mounted on disk",
    "still mounted by other references",
    "target is busy",
    "some volumes have not been cleaned up",
)


def chart_dir() -> Path:
    return find_bin_dir().parent / "charts" / "unstick"


def values(node: RealNode, images: NodeImages) -> dict[str, Any]:
    """The chart's values: the image built here, the node's paths, the demo's policy."""
    policy = cluster.policy()["spec"]
    return {
        "image": {
            "repository": images.unstick.repository,
            "tag": images.unstick.tag,
            "pullPolicy": "Never",
        },
        "policy": {
            **{k: policy[k] for k in ("dryRun", "actions", "slackSeconds", "rateLimits")},
            "nodeLostAfterSeconds": policy["nodeLostAfterSeconds"],
            "probeMaxAgeSeconds": policy["probeMaxAgeSeconds"],
            "finalizerAllowlist": [ABANDONED_FINALIZER],
        },
        # both on the real node (not on kwok's nodes, nor the kubelet-less ones); the
        # demo's orphaned pod dir is made a moment before the agent looks
        # one real node: the chart's two replicas (leader and standby) share it
        "controller": {"nodeSelector": ON_THE_NODE, "podAntiAffinity": "preferred"},
        "agent": {
            **node.helm_values()["agent"],  # type: ignore[dict-item]
            "nodeSelector": ON_THE_NODE,
            "extraArgs": ["--orphan-min-age=0"],
        },
    }


class KubeletLog:
    """The real kubelet's log, read as it grows: per pod UID, the last entry about volumes
    it cannot tear down (KUBELET_SAYS) and how often it said it. An entry is a klog header
    line and its continuation lines (a mount error's output is on the lines after it)."""

    def __init__(self, path: Path, uids: list[str]) -> None:
        self.path = path
        self.uids = uids
        self.offset = path.stat().st_size if path.exists() else 0
        self.said: dict[str, tuple[str, int]] = {}
        self.rank: dict[str, int] = {}

    def update(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        text = data.decode(errors="replace")
        # whole entries only: up to the last header line, which may still be growing
        headers = [m.start() for m in _KLOG_HEADER.finditer(text)]
        if len(headers) < 2:
            return
        self.offset += len(text[: headers[-1]].encode())
        for start, end in itertools.pairwise(headers):
            self._entry(text[start:end])

    def _entry(self, entry: str) -> None:
        if not any(p in entry for p in KUBELET_SAYS):
            return
        rank = min(i for i, p in enumerate(KUBELET_SAYS) if p in entry)
        for uid in self.uids:
            if uid not in entry:
                continue
            message = kubelet_message(entry)
            last, count = self.said.get(uid, ("", 0))
            if last and self.rank.get(uid, rank) < rank:
                continue  # the more telling line stays (KUBELET_SAYS is in that order)
            self.rank[uid] = rank
            self.said[uid] = (message, count + 1 if last == message else 1)

    def view(self, uid: str) -> str:
        message, count = self.said.get(uid, ("", 0))
        return f"{message} x{count}" if message else ""


_KLOG_HEADER = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ ", re.MULTILINE)


def kubelet_message(line: str) -> str:
    """The message of a klog line: its quoted text (structured logging), else what follows
    the header, with the reason it ends in (`target is busy`) kept."""
    body = " ".join(line.split("] ", 1)[-1].split())
    quoted = re.match(r'"((?:[^"\\]|\\.)*)"', body)
    if quoted:
        return f'"{quoted.group(1)}"'
    # e.g. `Operation for "{...}" failed. No retries permitted until <time> (...). Error:
    # UnmountVolume.TearDown failed for volume "uploads" (UniqueName: ...) pod ... : unmount
    # failed: exit status 32 Unmounting arguments: ... Output: umount: ...: target is busy.`
    text = body.split("Error: ", 1)[-1].split(" (UniqueName", 1)[0]
    for reason in KUBELET_SAYS:
        if reason in body and reason not in text:
            text = f"{text[:80]} … {reason}"
    return text[:120]


class RealNodeDemo:
    banner = (
        f"(A real node, {NODE}: kubelet + containerd + runc, unstick installed from the chart "
        "with helm; under each row, the real kubelet's own log line about the pod's volumes.)"
    )

    def __init__(self, workdir: Path, images: NodeImages) -> None:
        self.workdir = workdir
        self.images = images
        # db-0's driver: the upstream one where its images were built (docs/csi.md)
        self.upstream_missing = upstream_unavailable(BUGGY)
        upstream = "" if self.upstream_missing else f"hostpath {BUGGY}"
        self.scenarios = scenarios(NODE, upstream)
        if not self.upstream_missing:
            self.banner += (
                f"\n(db-0's volume: upstream csi-driver-host-path {BUGGY}, built from its "
                "release; its plugin container was restarted and forgot where it published.)"
            )
        self.cp: ControlPlane | None = None
        self.node: RealNode | None = None
        self.kubelet_log: KubeletLog | None = None
        self.uids: dict[str, str] = {}

    # -- start-up ---------------------------------------------------------------------

    def start(self, stack: contextlib.ExitStack) -> Cluster:
        print("starting a local control plane, kube-controller-manager, kube-scheduler, kwok…")
        settings = ControlPlaneSettings(
            workdir=self.workdir / "cp",
            audit=False,
            service_account_admission=True,
            kubelet_access=True,
        )
        cp = self.cp = ControlPlane(settings)
        stack.callback(cp.stop)
        cp.start()
        controllers = ClusterControllers(cp)
        stack.callback(controllers.stop)
        controllers.start()
        stack.enter_context(Kwok(cp))
        cp.install_crds()
        api = cp.api_client()
        stack.callback(api.close)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        cluster.create_nodes(core, client.StorageV1Api(api), stand_in=False)
        cluster.create_namespace(core)
        holders = lock_holders(NODE)
        if holders:
            print(f"waiting for another real node {NODE} to stop (pid {holders})…", flush=True)
        print(f"starting the real node {NODE} (containerd, image import, kubelet)…", flush=True)
        node = self.node = RealNode(cp, self.images).start()  # stops itself if it fails
        stack.callback(node.stop)
        print(f"real node {NODE} Ready (its state in {node.workdir})", flush=True)
        self._helm(["install", RELEASE, str(chart_dir()), "--create-namespace", "-f",
                    str(self._values_file(node))])  # fmt: skip
        controllers.wait_namespace(NAMESPACE)
        self.uids = cluster.create_workload(core, stand_in=False)
        print(f"cluster ready: kubectl --kubeconfig {cp.kubeconfig} get pods -A", flush=True)
        print("on the real node: the CSI plugin pod, db-0 on its volume, uploader…", flush=True)
        self._node_scenarios(core, stack)
        self._wait_unstick_ready()
        return Cluster(core, custom, self.uids)

    def _node_scenarios(self, core: Any, stack: contextlib.ExitStack) -> None:
        assert self.cp is not None and self.node is not None
        cp, node = self.cp, self.node
        restart = self._upstream_db(core) if not self.upstream_missing else self._own_db(core)
        self.uids["uploader"] = core.create_namespaced_pod(NAMESPACE, self._uploader()).metadata.uid
        for pod in ("db-0", "uploader"):
            wait_until(partial(_running, core, pod), timeout=120, what=f"{pod} Running")
        self._hold_uploads(stack)
        restart()
        # "Pod found, but volumes are still mounted on disk" is logged at -v=4
        set_kubelet_verbosity(cp, node, 4)
        self._orphaned_pod_dir()
        watched = [self.uids["db-0"], self.uids["uploader"]]
        self.kubelet_log = KubeletLog(node.workdir / "kubelet.log", watched)

    def _upstream_db(self, core: Any) -> Callable[[], None]:
        """db-0 on a claim of the upstream driver; returns the driver's restart."""
        assert self.cp is not None and self.node is not None
        print(f"installing upstream csi-driver-host-path {BUGGY}…", flush=True)
        driver = UpstreamDriver(self.cp, self.node, BUGGY).install()
        seed = UpstreamSeed(self.cp, core, self.node, NAMESPACE, name="db")
        seed.create_pod()
        self.uids["db-0"] = seed.wait_running(timeout=120)
        if not seed.mounted(self.uids["db-0"]):
            raise RuntimeError(f"the real kubelet did not publish db-0's volume ({BUGGY})")

        def restart() -> None:
            print(f"hostpathplugin {BUGGY} is killed; the kubelet restarts it…", flush=True)
            driver.restart_plugin_container()

        return restart

    def _own_db(self, core: Any) -> Callable[[], None]:
        """db-0 on a static PV of the project's CSI plugin; returns its restart (state lost)."""
        assert self.cp is not None and self.node is not None
        print(f"(no upstream driver: {self.upstream_missing}; the project's plugin instead)")
        seed = CsiSeed(self.cp, core, self.node, self.images.unstick.ref, NAMESPACE)
        seed.setup()
        self.uids["db-0"] = core.create_namespaced_pod(
            NAMESPACE, seed.pod_manifest("db-0", {})
        ).metadata.uid
        wait_until(partial(_running, core, "db-0"), timeout=60, what="db-0 Running")
        if not seed.mounted(self.uids["db-0"]):
            raise RuntimeError("the real kubelet did not publish db-0's CSI volume")

        def restart() -> None:
            print("the CSI plugin restarts and loses its state…", flush=True)
            seed.stop_plugin()
            seed.start_plugin()

        return restart

    def _uploader(self) -> dict[str, Any]:
        return {
            "metadata": {"name": "uploader"},
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "app",
                        "image": self.images.busybox.ref,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "echo part > /uploads/part-1; exec sleep 3600"],
                        "volumeMounts": [{"name": "uploads", "mountPath": "/uploads"}],
                    }
                ],
                "volumes": [{"name": "uploads", "emptyDir": {"medium": "Memory"}}],
            },
        }

    def _hold_uploads(self, stack: contextlib.ExitStack) -> None:
        """A process on the node (outside the pod) keeps a file of uploader's emptyDir open."""
        assert self.node is not None
        node = self.node
        uploads = (
            node.kubelet_root / "pods" / self.uids["uploader"]
            / "volumes" / "kubernetes.io~empty-dir" / "uploads"
        )  # fmt: skip
        holder = node.run(["sh", "-c", f"exec 3<{uploads}/part-1; exec sleep 3600"])
        stack.callback(node.kill, holder)
        wait_until(lambda: children(holder.pid), timeout=10, what="the holder on the node")

    def _orphaned_pod_dir(self) -> None:
        """A pod dir of a pod the API never had, with a user's file in its emptyDir: the
        real kubelet cannot remove it (not empty), the agent reports it (never `rm`)."""
        assert self.node is not None
        scratch = (
            self.node.kubelet_root / "pods" / ORPHAN_UID
            / "volumes" / "kubernetes.io~empty-dir" / "scratch"
        )  # fmt: skip
        scratch.mkdir(parents=True)
        (scratch / "results.csv").write_text("order,total\n" + "1,9.99\n" * 300)

    def _values_file(self, node: RealNode) -> Path:
        path = self.workdir / "values.yaml"
        path.write_text(yaml.safe_dump(values(node, self.images)))
        return path

    def _helm(self, args: list[str]) -> None:
        assert self.cp is not None
        home = self.workdir / "helm"
        env = {
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            "HOME": str(home),
            "PATH": "/usr/bin:/bin",
        }
        argv = [str(self.cp.bin_dir / "helm"), *args, f"--kubeconfig={self.cp.kubeconfig}",
                f"--namespace={RELEASE_NAMESPACE}"]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"helm {args[0]} failed:\n{proc.stdout}\n{proc.stderr}")

    def _pods(self, component: str | None = None) -> list[dict[str, Any]]:
        assert self.cp is not None
        selector = f"app.kubernetes.io/instance={RELEASE}"
        if component:
            selector += f",app.kubernetes.io/component={component}"
        path = f"/api/v1/namespaces/{RELEASE_NAMESPACE}/pods?labelSelector={selector}"
        items: list[dict[str, Any]] = self.cp.request("GET", path)["items"]
        return items

    def _wait_unstick_ready(self) -> None:
        def ready() -> bool:
            pods = self._pods()
            comps = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
            return comps >= {"controller", "agent"} and all(_ready(p) for p in pods)

        wait_until(ready, timeout=120, what="unstick's controller and agent pods Ready")

    # -- while it runs ------------------------------------------------------------------

    def finalised(self) -> set[str]:
        return set()

    def kubelet_view(self, pod: str) -> str:
        if self.kubelet_log is None or pod not in self.uids:
            return ""
        self.kubelet_log.update()
        return self.kubelet_log.view(self.uids[pod])

    def settled(self) -> bool:
        """The kubelet has said what it cannot tear down for both pods on the real node
        (its retries of uploader's unmount back off, so its word may come after the
        outcomes)."""
        return all(self.kubelet_view(pod) for pod in ("db-0", "uploader"))

    def check(self) -> None:
        kubelet = self.node.kubelet if self.node else None
        if kubelet is None or not kubelet.process.alive():
            raise RuntimeError("the real node's kubelet exited")

    def _leader_first(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The controller replica that holds the leader Lease first: only it diagnoses and
        acts (the chart runs two; the standby's metrics have no stuck pods)."""
        assert self.cp is not None
        path = f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases"
        leases: list[dict[str, Any]] = self.cp.request("GET", path)["items"]
        holders = {(lease.get("spec") or {}).get("holderIdentity") for lease in leases}
        return sorted(pods, key=lambda p: p["metadata"]["name"] not in holders)

    def _metrics(self, component: str, port: int, prefix: str) -> list[str]:
        pods = self._pods(component)
        if component == "controller":
            pods = self._leader_first(pods)
        ip = pods[0].get("status", {}).get("podIP") if pods else None
        if not ip:
            return [f"(no {component} pod with an address)"]
        return scrape_metrics(f"http://{ip}:{port}/metrics", prefix)

    def controller_metrics(self) -> list[str]:
        return self._metrics("controller", 9100, "unstick_")

    def agent_metrics(self, prefix: str) -> list[str]:
        return self._metrics("agent", 9101, prefix)


def _running(core: Any, name: str) -> bool:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    return bool(pod.status.phase == "Running")


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
