"""The demo without a real node: kwok nodes, and node-storage — a kubelet-less node whose
kubelet root (real mounts, a CSI driver, the agent) lives in a private mount namespace
(devcluster.demo.node), with a kubelet stand-in that finalises a pod once nothing of it is
left on the node. The controller runs as a local process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from kubernetes import client

from devcluster import ControlPlane, ControlPlaneSettings, Kwok
from devcluster.demo import cluster
from devcluster.demo.backend import Cluster, scrape_metrics
from devcluster.demo.scenarios import AGENT_NODE, scenarios
from devcluster.process import Process, free_port
from unstick.core.remediation import GROUP, POLICY_PLURAL, VERSION


class NodeProcess:
    """A node module (`python -m <module> <cfg.json>`: mounts, CSI driver, agent, kubelet
    stand-in) in its own mount namespace and process group: its JSON events read from
    stdout; stopped with TERM, then KILL of the whole group. The demo's node by default;
    the node-side benchmark runs its own module through it."""

    module = "devcluster.demo.node"
    stop_timeout_s = 20.0

    def __init__(
        self,
        cfg: dict[str, Any],
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        cfg_path = workdir / "node.json"
        cfg_path.write_text(json.dumps(cfg))
        self.log = (workdir / "node.log").open("w")
        self.popen = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private",
             sys.executable, "-m", self.module, str(cfg_path)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True,
            env=env, cwd=cwd,
        )  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self.agent_metrics_port = int(cfg["agent_metrics_port"])
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                self.events.append(event)
                if event.get("event") == "ready":
                    self.ready.set()

    def event(self, name: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == name), None)

    def finalised(self) -> set[str]:
        return {e["pod"] for e in self.events if e.get("event") == "finalised"}

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=self.stop_timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # anything it left behind
        self.popen.wait()
        self._reader.join(timeout=5)  # its last events are read
        self.log.close()


class StandIn:
    banner = (
        "(No real kubelet runs here: a stand-in finalises a pod on node-storage once "
        "nothing of it is left on the node, as the kubelet would.)"
    )
    scenarios = scenarios(AGENT_NODE)

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.node: NodeProcess | None = None
        self.controller: Process | None = None
        self.metrics_port = free_port()

    def start(self, stack: contextlib.ExitStack) -> Cluster:
        print("starting a local control plane (etcd + kube-apiserver) and kwok nodes…", flush=True)
        cp = ControlPlane(ControlPlaneSettings(workdir=self.workdir / "cp", audit=False))
        stack.callback(cp.stop)
        cp.start()
        stack.enter_context(Kwok(cp))
        api = cp.api_client()
        stack.callback(api.close)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        cp.install_crds()
        custom.create_cluster_custom_object(GROUP, VERSION, POLICY_PLURAL, cluster.policy())
        cluster.create_nodes(core, client.StorageV1Api(api), stand_in=True)
        cluster.create_namespace(core)
        uids = cluster.create_workload(core, stand_in=True)
        print(f"cluster ready: kubectl --kubeconfig {cp.kubeconfig} get pods -A", flush=True)
        print("setting up the storage node's mounts, CSI driver and agent…", flush=True)
        self.node = NodeProcess(
            {
                "work": str(self.workdir / "node"),
                "kubeconfig": str(cp.kubeconfig),
                "node": AGENT_NODE,
                "csi_pod_uid": uids["db-0"],
                "busy_pod_uid": uids["uploader"],
                "pv": cluster.PV,
                "handle": cluster.HANDLE,
                "agent_metrics_port": free_port(),
            },
            self.workdir,
        )
        stack.callback(self.node.stop)
        if not self.node.ready.wait(60):
            raise RuntimeError(f"the demo node did not come up; see {self.workdir / 'node.log'}")
        self.controller = Process(
            "unstick controller",
            [sys.executable, "-m", "unstick", "controller", f"--kubeconfig={cp.kubeconfig}",
             "--standalone", f"--metrics-port={self.metrics_port}", "--health-port=0"],
            self.workdir / "controller.log",
        ).start()  # fmt: skip
        stack.callback(self.controller.stop)
        return Cluster(core, custom, uids)

    def finalised(self) -> set[str]:
        return self.node.finalised() if self.node else set()

    def kubelet_view(self, pod: str) -> str:
        return ""

    def settled(self) -> bool:
        return True

    def check(self) -> None:
        if self.controller is not None and not self.controller.alive():
            raise RuntimeError(f"the controller exited:\n{self.controller.log_tail()}")

    def controller_metrics(self) -> list[str]:
        return scrape_metrics(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def agent_metrics(self, prefix: str) -> list[str]:
        port = self.node.agent_metrics_port if self.node else 0
        return scrape_metrics(f"http://127.0.0.1:{port}/metrics", prefix)
