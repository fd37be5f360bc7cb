"""The demo's one real node, run inside a private mount namespace (`unshare -m`).

It lays out a kubelet root on a tmpfs the way the kubelet does, with real mounts:
- `db-0`: a CSI volume published through a real CSI node server (gRPC over a unix
  socket, registered in `plugins_registry/`), after which the driver restarts and loses
  its state (the csi-driver-host-path bug): its NodeUnpublishVolume now answers OK and
  leaves the mount behind;
- `uploader`: an emptyDir tmpfs whose mount is held by a process (cwd inside it).
Then it runs the real `unstick agent` for this node, and a **kubelet stand-in** — no real
kubelet can run here — that does the one thing the kubelet does at the end of a pod's
life: once nothing of a terminating pod is left on the node (no mounts, no volume dirs),
it finalises the pod (DELETE with grace 0 and a UID precondition) and removes its dir.

Everything it starts dies with it; the mounts live only in this namespace.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client, config

from devcluster.csi_hostpath import kubelet_capability
from devcluster.demo.scenarios import CSI_DRIVER
from unstick.agent.proto import csi_pb2, csi_pb2_grpc
from unstick.core.model.kubelet_paths import pod_dir
from unstick.core.model.mountinfo import parse_mountinfo

ORPHAN_UID = "0a0a0a0a-dead-4bad-8bad-0a0a0a0a0a0a"


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [m.mount_point for m in parse_mountinfo(f.read())]


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def _emit(**event: Any) -> None:
    print(json.dumps(event), flush=True)


class Node:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.work = Path(cfg["work"])
        self.root = self.work / "kubelet"
        self.children: list[subprocess.Popen[Any]] = []

    def start(self, *argv: str, **kw: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(list(argv), **kw)
        self.children.append(proc)
        return proc

    # -- the kubelet's layout -------------------------------------------------------

    def csi_driver(self) -> subprocess.Popen[str]:
        registry = self.root / "plugins_registry"
        plugin = self.root / "plugins" / CSI_DRIVER
        registry.mkdir(parents=True, exist_ok=True)
        plugin.mkdir(parents=True, exist_ok=True)
        self.csi_socket = plugin / "csi.sock"
        proc = self.start(
            sys.executable, "-m", "devcluster.csi_hostpath", "--name", CSI_DRIVER,
            "--csi-socket", str(self.csi_socket),
            "--registration-socket", str(registry / f"{CSI_DRIVER}-reg.sock"),
            "--data-dir", str(self.work / "data"), "--state-file", str(self.work / "csi.json"),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the demo CSI driver did not start")
        return proc

    def publish(self, uid: str, pv: str, handle: str) -> str:
        """What the kubelet does for a CSI volume: stage, publish, write vol_data.json."""
        digest = hashlib.sha256(handle.encode()).hexdigest()
        staging = self.root / "plugins/kubernetes.io/csi" / CSI_DRIVER / digest / "globalmount"
        volume = Path(pod_dir(str(self.root), uid)) / "volumes/kubernetes.io~csi" / pv
        target = volume / "mount"
        staging.mkdir(parents=True, exist_ok=True)
        target.mkdir(parents=True, exist_ok=True)
        (self.work / "data" / handle).mkdir(parents=True, exist_ok=True)
        (self.work / "data" / handle / "orders.db").write_text("precious data\n")
        (volume / "vol_data.json").write_text(
            json.dumps({"driverName": CSI_DRIVER, "volumeHandle": handle, "specVolID": pv})
        )
        with grpc.insecure_channel(f"unix://{self.csi_socket}") as ch:
            stub = csi_pb2_grpc.NodeStub(ch)
            cap = kubelet_capability()
            stub.NodeStageVolume(
                csi_pb2.NodeStageVolumeRequest(
                    volume_id=handle, staging_target_path=str(staging), volume_capability=cap
                ),
                timeout=10,
            )
            stub.NodePublishVolume(
                csi_pb2.NodePublishVolumeRequest(
                    volume_id=handle,
                    staging_target_path=str(staging),
                    target_path=str(target),
                    volume_capability=cap,
                ),
                timeout=10,
            )
        return str(target)

    def held_empty_dir(self, uid: str, name: str) -> tuple[str, int]:
        path = Path(pod_dir(str(self.root), uid)) / "volumes/kubernetes.io~empty-dir" / name
        path.mkdir(parents=True, exist_ok=True)
        _sh("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path))
        holder = self.start(
            sys.executable, "-c", "import time\nwhile True: time.sleep(3600)", cwd=str(path)
        )
        return str(path), holder.pid

    def setup(self) -> dict[str, Any]:
        self.work.mkdir(parents=True, exist_ok=True)
        _sh("mount", "--make-rprivate", "/")
        _sh("mount", "-t", "tmpfs", "-o", "size=64m", "unstick-demo", str(self.work))
        driver = self.csi_driver()
        target = self.publish(self.cfg["csi_pod_uid"], self.cfg["pv"], self.cfg["handle"])
        # The driver restarts and comes back without its state.
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=20)
        self.children.remove(driver)
        (self.work / "csi.json").unlink(missing_ok=True)
        self.csi_driver()
        held, holder_pid = self.held_empty_dir(self.cfg["busy_pod_uid"], "uploads")
        orphan = self.orphaned_dir()
        return {
            "csiTarget": target, "heldMount": held, "holderPid": holder_pid, "orphan": orphan,
        }  # fmt: skip

    def orphaned_dir(self) -> str:
        """A pod dir of a pod the API never had (deleted long ago, say) with a user's file
        in its emptyDir: the agent reports it (the data stays: never `rm`)."""
        scratch = Path(pod_dir(str(self.root), ORPHAN_UID)) / "volumes/kubernetes.io~empty-dir"
        (scratch / "scratch").mkdir(parents=True)
        (scratch / "scratch" / "results.csv").write_text("order,total\n" + "1,9.99\n" * 300)
        return str(scratch / "scratch" / "results.csv")

    def run_agent(self, *extra: str) -> None:
        self.start(
            sys.executable, "-m", "unstick", "agent", "--node-name", self.cfg["node"],
            "--kubelet-root", str(self.root), "--host-proc", "/proc",
            "--mountinfo", "/proc/self/mountinfo", "--kubeconfig", self.cfg["kubeconfig"],
            "--metrics-port", str(self.cfg["agent_metrics_port"]),
            "--kubelet-healthz", "http://127.0.0.1:1/healthz",
            "--state-dir", str(self.work / "agent-state"), "--log-level", "WARNING",
            "--orphan-min-age", "0",  # the demo's orphan is made a moment before
            *extra,
        )  # fmt: skip

    # -- the kubelet stand-in -------------------------------------------------------

    def leftovers(self, uid: str) -> list[str]:
        base = pod_dir(str(self.root), uid) + "/"
        mounts = [m for m in _mount_points() if m.startswith(base)]
        dirs = []
        for sub in ("volumes", "volume-subpaths"):
            top = Path(base) / sub
            if top.is_dir() and not top.is_symlink():
                dirs += [str(p) for p in top.iterdir()]
        return mounts + dirs

    def finalise_clean_pods(self, core: Any) -> None:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.cfg['node']}")
        for pod in pods.items:
            meta = pod.metadata
            if meta.deletion_timestamp is None or self.leftovers(meta.uid):
                continue
            try:
                core.delete_namespaced_pod(
                    meta.name, meta.namespace, grace_period_seconds=0,
                    body=client.V1DeleteOptions(
                        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta.uid)
                    ),
                )  # fmt: skip
            except client.ApiException as e:
                if e.status not in (404, 409):
                    raise
                continue
            _emit(event="finalised", pod=f"{meta.namespace}/{meta.name}", uid=meta.uid)

    def stop(self) -> None:
        for proc in reversed(self.children):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.children:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for point in sorted(
            (m for m in _mount_points() if m.startswith(str(self.work))), key=len, reverse=True
        ):
            subprocess.run(["umount", "-l", point], check=False)


def main() -> int:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    node = Node(cfg)
    stopping = False

    def on_term(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        _emit(event="ready", **node.setup())
        node.run_agent()
        config.load_kube_config(cfg["kubeconfig"])
        core = client.CoreV1Api()
        while not stopping:
            node.finalise_clean_pods(core)
            time.sleep(1.0)  # the kubelet's pod workers re-sync periodically too
    finally:
        node.stop()
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
