"""Whether this machine can run the kind suite (tests/kind): a kind cluster on podman,
from the node image hack/build-kind-node-image.sh builds here.

`kind_unavailable()` says why not (None: it can); the suite skips with that reason.
`kind_env()` is the environment kind and podman run with: kind's podman provider, the
project's podman configuration (hack/podman/containers.conf: runc, no raised ulimits)
and, for a cluster being made, a podman network of the run's own (named after its
cluster: tests/kind/runs.py), removed at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTAINERS_CONF = ROOT / "hack" / "podman" / "containers.conf"
# What building the node image needs besides podman (hack/build-kind-node-image.sh).
BUILD_COMMANDS = ("mmdebstrap", "buildah", "go")


def kind_env(network: str | None = None) -> dict[str, str]:
    """The variables kind and podman need here (on top of the caller's environment);
    `network`: the podman network `kind create cluster` puts the nodes on."""
    env = {"KIND_EXPERIMENTAL_PROVIDER": "podman", "CONTAINERS_CONF": str(CONTAINERS_CONF)}
    if network:
        env["KIND_EXPERIMENTAL_PODMAN_NETWORK"] = network
    return env


def kind_unavailable(bin_dir: Path = ROOT / "bin") -> str | None:
    """Why the kind suite cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (podman runs kind's nodes as privileged containers)"
    if shutil.which("podman") is None:
        return "podman not installed (make node-deps / hack/install-node-deps.sh)"
    missing = [c for c in BUILD_COMMANDS if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} not installed: the node image is built here"
    for tool in ("kind", "kubectl", "helm", "kubeadm", "kube-proxy"):
        if not (bin_dir / tool).exists():
            return f"{tool} not in {bin_dir}: run `make tools`"
    if not (bin_dir / "node-images.json").exists():
        return f"{bin_dir / 'node-images.json'} missing: run `make images` (the unstick image)"
    probe = subprocess.run(
        ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
        env={**os.environ, **kind_env()},
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or ["no output"]
        return f"podman cannot run here: `podman info` failed: {lines[-1]}"
    return None
