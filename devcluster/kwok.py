"""kwok: simulated kubelets for the local control plane.

kwok manages only nodes annotated `kwok.x-k8s.io/node: fake`: it marks them Ready and
keeps them heartbeating, makes their pods Running, and finalises deleted pods (DELETE
with grace 0) as a kubelet would. A node without the annotation has no kubelet at all,
so a pod deleted there stays Terminating — the raw material of stuck pods.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.controlplane import ControlPlane
from devcluster.process import Process, free_port, wait_until

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
STAGES = Path(__file__).with_name("kwok-stages.yaml")


def node_manifest(
    name: str, *, kubelet: bool, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Node object; `kubelet=True` puts it under kwok's management."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"kubernetes.io/hostname": name, **(labels or {})},
    }
    if kubelet:
        meta["annotations"] = {FAKE_NODE_ANNOTATION: "fake"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": {"taints": []},
    }


@dataclass
class Kwok:
    control_plane: ControlPlane
    process: Process | None = field(init=False, default=None)

    def start(self) -> Kwok:
        cp = self.control_plane
        port = free_port()
        argv = [
            str(cp.bin_dir / "kwok"),
            f"--kubeconfig={cp.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            f"--config={STAGES}",
            f"--server-address=127.0.0.1:{port}",
            "--node-lease-duration-seconds=40",
        ]
        self.process = Process("kwok", argv, cp.workdir / "kwok.log").start()
        wait_until(lambda: _healthy(port), timeout=60, what="kwok /healthz", process=self.process)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def __enter__(self) -> Kwok:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
