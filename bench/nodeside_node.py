"""The node-side benchmark's one node, run inside a private mount namespace (`unshare -m`).

Built from the demo's node (`devcluster.demo.node.Node`: the kubelet root on a tmpfs, the
project's CSI plugin registered through `plugins_registry/`, the real `unstick agent`, the
kubelet stand-in), scaled up:
- every stuck pod gets a CSI volume staged and published through the plugin, plus a stale
  (empty, unmounted) emptyDir volume dir; then the plugin restarts and forgets its state
  (the csi-driver-host-path bug): each pod's target is an orphaned mount;
- `extra_mounts` tmpfs mounts that belong to no pod (outside the kubelet root), so the host
  mount table is as large as a busy node's;
- before the agent starts, `probe_pod` (the function the agent's handler calls) is driven
  once per stuck pod, its CPU time measured (`process_time`);
- the kubelet stand-in finalises a terminating pod once nothing of it is left on the node.

`mode` (cfg) says who resolves the pods (issue 23's peers, each in its own run):
- `unstick` (default): the real agent (and, outside, the real controller);
- `naive`: `bench.naive_unmount`, the on-call script (`umount -l`, `rmdir`, force delete);
- `kubelet`: the floor — the driver keeps its state (no restart) and the stand-in does the
  kubelet's own teardown of a deleted pod: NodeUnpublishVolume and NodeUnstageVolume
  through the healthy driver, the volume dirs removed, then the final delete.

Events go to stdout as JSON lines: `ready` (the agent's pid, the direct-probe figures),
`finalised` (one per pod), and `final` on SIGTERM (what is still left of the stuck pods).
Everything it starts is in its process group; the mounts live only in this namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from devcluster.demo.node import Node, _emit, _mount_points, _sh
from devcluster.demo.scenarios import CSI_DRIVER
from unstick.agent.probe.collect import probe_pod
from unstick.agent.settings import AgentSettings
from unstick.agent.steps import csi_client
from unstick.core.model.kubelet_paths import pod_dir

STANDIN_UA = "unstick-bench-kubelet/1"  # the stand-in's requests in the audit log
FINAL_DELETES_IN_FLIGHT = 8  # the stand-in's final deletes of one pass, at most at once
_EMIT_LOCK = threading.Lock()
# lifted like the controller's (bench/contenders.py): the agent's own cap on node-step
# batches would otherwise hold the burst to 10 pods a minute
AGENT_FLAGS = ("--max-node-actions-per-minute", "1000000")
_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2


def _mount_tmpfs(target: str) -> None:
    """mount(2) directly: thousands of mounts without a process each."""
    if _libc.mount(b"tmpfs", target.encode(), b"tmpfs", 0, b"size=64k") != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


class BenchNode(Node):
    """The demo's node with many stuck pods and a large mount table."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.points: frozenset[str] = frozenset()

    def setup_pods(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        _sh("mount", "--make-rprivate", "/")
        _sh("mount", "-t", "tmpfs", "-o", "size=256m", "unstick-bench-node", str(self.work))
        driver = self.csi_driver()
        for pod in self.cfg["pods"]:
            self.publish(pod["uid"], pod["pv"], pod["handle"])
            stale = Path(pod_dir(str(self.root), pod["uid"]))
            (stale / "volumes/kubernetes.io~empty-dir/cache").mkdir(parents=True)
        if self.cfg.get("mode") != "kubelet":
            # The driver restarts and comes back without its state.
            driver.send_signal(signal.SIGTERM)
            try:
                driver.wait(timeout=20)
            except subprocess.TimeoutExpired:  # seen once on a loaded machine: the same loss
                driver.kill()
                driver.wait()
            self.children.remove(driver)
            (self.work / "csi.json").unlink(missing_ok=True)
            self.csi_driver()
        extra = self.work / "host-mounts"
        for i in range(int(self.cfg["extra_mounts"])):
            target = extra / f"m{i:05d}"
            target.mkdir(parents=True)
            _mount_tmpfs(str(target))

    def probe_directly(self) -> dict[str, Any]:
        """`probe_pod` once per stuck pod, as the agent's handler calls it: CPU and wall."""
        settings = AgentSettings(
            node_name=self.cfg["node"], kubelet_root=str(self.root), host_proc="/proc",
            mountinfo_path="/proc/self/mountinfo",
            kubelet_healthz="http://127.0.0.1:1/healthz",
        )  # fmt: skip
        cpu0, wall0 = time.process_time(), time.monotonic()
        for pod in self.cfg["pods"]:
            probe_pod(settings, pod["uid"])
        n = max(1, len(self.cfg["pods"]))
        return {
            "probes": len(self.cfg["pods"]),
            "cpu_s_per_probe": (time.process_time() - cpu0) / n,
            "wall_s_per_probe": (time.monotonic() - wall0) / n,
        }

    # -- the kubelet stand-in, with one read of the mount table per pass ----------------

    def leftovers(self, uid: str) -> list[str]:
        base = pod_dir(str(self.root), uid) + "/"
        mounts = [m for m in self.points if m.startswith(base)]
        dirs = []
        for sub in ("volumes", "volume-subpaths"):
            top = Path(base) / sub
            if top.is_dir() and not top.is_symlink():
                dirs += [str(p) for p in top.iterdir()]
        return mounts + dirs

    def standin_pass(self, core: Any) -> None:
        if self.cfg.get("mode") == "kubelet":
            self.teardown_deleted_pods(core)
        self.points = frozenset(_mount_points())
        self.finalise_clean_pods(core)

    def finalise_clean_pods(self, core: Any) -> None:
        """The demo's final delete (grace 0, the pod's UID as precondition) of every
        terminating pod with nothing left on the node, reading the API's answers as plain
        JSON: the client's model objects cost ~40 ms of CPU per pod on this machine, which
        made the stand-in's final deletes of a burst take seconds (the real kubelet's
        status manager deletes with a Go client). The deletes of one pass go out
        `FINAL_DELETES_IN_FLIGHT` at a time: one after the other, each a round trip to a
        loaded API server (~50-100 ms with the audit log written in blocking mode), the
        last of 100 pods clean at once was deleted seconds after the first — the
        stand-in's pace, not the kubelet's (whose client allows 50 requests a second, and
        whose round trip is shorter)."""
        field = f"spec.nodeName={self.cfg['node']}"
        raw = core.list_pod_for_all_namespaces(field_selector=field, _preload_content=False)
        clean = [
            pod["metadata"]
            for pod in json.loads(raw.data)["items"]
            if pod["metadata"].get("deletionTimestamp")
            and not self.leftovers(pod["metadata"]["uid"])
        ]
        if not clean:
            return
        with ThreadPoolExecutor(min(FINAL_DELETES_IN_FLIGHT, len(clean))) as pool:
            list(pool.map(lambda meta: _final_delete(core, meta), clean))  # raises as before

    def teardown_deleted_pods(self, core: Any) -> None:
        """The kubelet's own teardown of every deleted pod whose grace period is over (its
        containers would be stopped by then): unpublish and unstage its CSI volume through
        the driver, which did not lose its state, then remove its volume dirs."""
        by_uid = {p["uid"]: p for p in self.cfg["pods"]}
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.cfg['node']}")
        now = time.time()
        for pod in pods.items:
            meta = pod.metadata
            spec = by_uid.get(meta.uid)
            dts = meta.deletion_timestamp
            if spec is None or dts is None or dts.timestamp() > now or spec.get("torn_down"):
                continue
            self.teardown(spec)
            spec["torn_down"] = True

    def teardown(self, pod: dict[str, Any]) -> None:
        base = Path(pod_dir(str(self.root), pod["uid"]))
        volume = base / "volumes/kubernetes.io~csi" / pod["pv"]
        endpoint = str(self.csi_socket)
        csi_client.node_unpublish(endpoint, pod["handle"], str(volume / "mount"), 10.0)
        for staging in csi_client.staging_paths(
            str(self.root), CSI_DRIVER, pod["handle"], pod["pv"]
        ):
            if Path(staging).is_dir():
                csi_client.node_unstage(endpoint, pod["handle"], staging, 10.0)
                break
        # then the kubelet removes what is left of the volume dirs (the driver may have
        # removed the target dir itself, as csi-driver-host-path does)
        (volume / "vol_data.json").unlink(missing_ok=True)
        for gone in (
            volume / "mount",
            volume,
            base / "volumes/kubernetes.io~empty-dir/cache",
            base / "volumes/kubernetes.io~csi",
            base / "volumes/kubernetes.io~empty-dir",
        ):
            with contextlib.suppress(FileNotFoundError):
                gone.rmdir()

    def stop(self) -> None:
        """Detach the whole tree at once (thousands of mounts: one syscall, not a `umount`
        each), then the demo's stop (its children; nothing is left to unmount)."""
        _libc.umount2(str(self.work).encode(), _MNT_DETACH)
        super().stop()

    def final_report(self) -> None:
        self.points = frozenset(_mount_points())
        left = [p for pod in self.cfg["pods"] for p in self.leftovers(pod["uid"])]
        data = self.work / "data"
        staging = str(self.root / "plugins/kubernetes.io/csi") + "/"
        _emit(
            event="final",
            leftovers=left,
            data_kept=sum(1 for p in self.cfg["pods"] if (data / p["handle"]).is_dir()),
            staging_mounts_left=sum(1 for m in self.points if m.startswith(staging)),
        )


def _final_delete(core: Any, meta: dict[str, Any]) -> None:
    """DELETE with grace 0 and the pod's UID as precondition, then the `finalised` event;
    nothing if it was gone (404) or is another pod of that name now (409)."""
    body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
    try:
        core.delete_namespaced_pod(
            meta["name"], meta["namespace"], grace_period_seconds=0, body=body,
            _preload_content=False,
        )  # fmt: skip
    except client.ApiException as e:
        if e.status not in (404, 409):
            raise
        return
    with _EMIT_LOCK:  # one JSON line at a time on stdout
        _emit(event="finalised", pod=f"{meta['namespace']}/{meta['name']}", uid=meta["uid"])


def _core(kubeconfig: str) -> Any:
    api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    api.user_agent = STANDIN_UA
    return client.CoreV1Api(api)


def main() -> int:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    node = BenchNode(cfg)
    stopping = False

    def on_term(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        node.setup_pods()
        mode = cfg.get("mode", "unstick")
        direct = node.probe_directly() if mode == "unstick" else None
        if mode == "unstick":
            node.run_agent(*AGENT_FLAGS)
        elif mode == "naive":
            naive_cfg = node.work / "naive.json"
            naive_cfg.write_text(json.dumps({
                "kubeconfig": cfg["kubeconfig"], "node": cfg["node"], "root": str(node.root),
                "slack_s": cfg["slack_s"], "interval_s": cfg["naive_interval_s"],
            }))  # fmt: skip
            node.start(sys.executable, "-m", "bench.naive_unmount", str(naive_cfg))
        # who resolves the pods: the agent, the naive script, or (the floor) this process
        worker = node.children[-1].pid if mode in ("unstick", "naive") else os.getpid()
        _emit(event="ready", agent_pid=worker, mounts=len(_mount_points()), direct_probe=direct)
        core = _core(cfg["kubeconfig"])
        while not stopping:
            node.standin_pass(core)
            time.sleep(float(cfg["standin_interval_s"]))
        node.final_report()
    finally:
        node.stop()
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
