"""A cloud controller manager beside the kind suite's cluster (docs/kind.md, "A cloud
controller manager for kind's machines"): bin/podman-ccm, the upstream cloud controller
manager of k8s.io/cloud-provider with a test-only provider whose instances are the
cluster's podman containers (tests/machines/kind/podmanccm, built by `make tools`). Only its
upstream `cloud-node-lifecycle` controller runs: it taints a NotReady node whose container
is stopped with `node.cloudprovider.kubernetes.io/shutdown` (and takes the taint off once
the node is Ready), and deletes the Node of a container that is gone.

It runs on the host (podman is there), with the cluster's admin kubeconfig, no leader
election and no serving port; stopped by PID at the end, also on failure."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from devcluster.process import Process, wait_until

from . import runs
from .support import BIN, Kind

CCM = BIN / "podman-ccm"
SHUTDOWN_TAINT = "node.cloudprovider.kubernetes.io/shutdown"


def unavailable() -> str:
    """Why the cloud controller manager cannot run here ('' when it can)."""
    if not CCM.exists():
        return f"{CCM} missing: run `make tools` (hack/build-tools.sh builds it)"
    return ""


@contextlib.contextmanager
def cloud_controller_manager(kind: Kind) -> Iterator[Process]:
    """bin/podman-ccm running against `kind`'s cluster, for the containers of that cluster
    only (its name is the provider's cloud config); stopped at the end."""
    work = runs.workdir(kind.name)
    config = work / "podman-cloud.conf"
    config.write_text(kind.name + "\n")
    argv = [
        str(CCM),
        "--cloud-provider=podman",
        f"--cloud-config={config}",
        f"--kubeconfig={kind.kubeconfig}",
        "--controllers=cloud-node-lifecycle",
        "--node-monitor-period=5s",  # (upstream's default)
        "--leader-elect=false",
        "--secure-port=0",
    ]
    proc = Process("podman-ccm", argv, work / "podman-ccm.log").start()
    try:
        wait_until(
            lambda: 'Started "cloud-node-lifecycle-controller"' in log(proc),
            timeout=60,
            what="the cloud node lifecycle controller to start",
            process=proc,
        )
        yield proc
    finally:
        proc.stop()


def log(proc: Process) -> str:
    try:
        return proc.log_path.read_text(errors="replace")
    except OSError:
        return ""


def answered(proc: Process, node: str, status: str, since: int = 0) -> bool:
    """The provider has told the lifecycle controller that `node`'s container is `status`
    (it is asked only about NotReady nodes), in the log after offset `since`."""
    return f"podman: node {node}: container is {status}:" in log(proc)[since:]


def shutdown_taint(node: dict[str, Any]) -> dict[str, Any] | None:
    taints: list[dict[str, Any]] = node.get("spec", {}).get("taints") or []
    return next((t for t in taints if t["key"] == SHUTDOWN_TAINT), None)
