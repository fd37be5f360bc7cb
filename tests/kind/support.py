"""The kind suite's cluster: kind on podman (pytest-kind's KindCluster with the kind built
here), the node image hack/build-kind-node-image.sh builds, unstick loaded with `kind
load image-archive` and installed from the chart with helm as the README says. Helpers to
read the cluster (kubectl, metrics through the API server's pod proxy) and to act on a
node's container (podman)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unstick.devcluster.kind_check import NETWORK, ROOT, kind_env
from unstick.devcluster.process import wait_until

BIN = ROOT / "bin"
CLUSTER = "unstick-kind"
CONFIG = Path(__file__).with_name("cluster.yaml")
NAMESPACE = "unstick"
# kind mounts the host's /lib/modules into every node; a machine without modules (a VM
# with a built-in kernel) has none, and podman refuses the mount.
MODULES = Path("/lib/modules")


def run(argv: list[str], *, stdin: str | None = None, check: bool = True) -> str:
    """Run a command with kind's environment; its stdout. A failure says its stderr."""
    proc = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, env={**os.environ, **kind_env()}
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def podman(*args: str, check: bool = True) -> str:
    return run(["podman", *args], check=check)


def build_node_image() -> str:
    """The node image's reference (built, or found in the cache, by the script)."""
    out = run(["bash", str(ROOT / "hack" / "build-kind-node-image.sh")])
    lines = out.strip().splitlines()
    if not lines:
        raise RuntimeError("hack/build-kind-node-image.sh printed no image reference")
    return lines[-1]


def node_images() -> dict[str, dict[str, str]]:
    """bin/node-images.json (hack/build-images.sh): the unstick and busybox archives."""
    index = BIN / "node-images.json"
    if not index.exists():
        raise FileNotFoundError(f"{index} missing: run `make images` (hack/build-images.sh)")
    images: dict[str, dict[str, str]] = json.loads(index.read_text())
    return images


@dataclass
class Kind:
    """The running cluster: kubectl and helm against it, its nodes' containers."""

    cluster: Any  # pytest_kind.KindCluster
    images: dict[str, dict[str, str]]

    @property
    def kubeconfig(self) -> str:
        return str(self.cluster.kubeconfig_path)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return run(
            [str(BIN / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            stdin=stdin,
            check=check,
        )

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, *objects: dict[str, Any]) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(doc))

    def nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("nodes")["items"]
        return items

    def workers(self) -> list[str]:
        return sorted(
            n["metadata"]["name"]
            for n in self.nodes()
            if "node-role.kubernetes.io/control-plane" not in n["metadata"].get("labels", {})
        )

    def ready(self, node: dict[str, Any]) -> bool:
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def pods(self, namespace: str, *selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("pods", "-n", namespace, *selector)["items"]
        return items

    def remediations(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("remediations", "-n", namespace)["items"]
        return items

    def events(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("events", "-n", namespace)["items"]
        return items

    def scrape(self, pod: str, port: int, namespace: str = NAMESPACE) -> str:
        """A pod's /metrics, through the API server's proxy (the pod's own network)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics"
        return self.kubectl("get", "--raw", path)

    def remove_node_container(self, node: str) -> None:
        """The node's machine gone: its container and its /var volume removed."""
        volumes = podman("inspect", node, "--format", "{{range .Mounts}}{{.Name}} {{end}}")
        podman("rm", "--force", "--time", "0", "--volumes", node)
        for volume in volumes.split():
            podman("volume", "rm", "--force", volume, check=False)

    def helm_install(self) -> None:
        """The chart as the README installs it; values only for the image (and to act)."""
        repository, tag = self.images["unstick"]["ref"].rsplit(":", 1)
        run(
            [
                str(BIN / "helm"), "install", "unstick", str(ROOT / "charts" / "unstick"),
                "-n", NAMESPACE, "--create-namespace", f"--kubeconfig={self.kubeconfig}",
                "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
                "--set", "image.pullPolicy=Never", "--set", "policy.dryRun=false",
                "--wait", "--timeout", "5m",
            ]
        )  # fmt: skip


def _delete_leftovers() -> None:
    """A cluster, network or volumes of the suite left by a killed session."""
    if CLUSTER in run([str(BIN / "kind"), "get", "clusters"], check=False).split():
        run([str(BIN / "kind"), "delete", "cluster", "--name", CLUSTER], check=False)
    # kind labels a node's /var volume with the node's name (`<cluster>-worker: true`)
    for line in podman("volume", "ls", "--format", "{{.Name}} {{.Labels}}").splitlines():
        volume, _, labels = line.partition(" ")
        if f"{CLUSTER}-control-plane:" in labels or f"{CLUSTER}-worker" in labels:
            podman("volume", "rm", "--force", volume, check=False)
    if _network_exists():
        podman("network", "rm", "--force", NETWORK, check=False)


def _network_exists() -> bool:
    return (
        subprocess.run(
            ["podman", "network", "exists", NETWORK], env={**os.environ, **kind_env()}
        ).returncode
        == 0
    )


@contextlib.contextmanager
def _environment() -> Iterator[None]:
    """kind's variables in os.environ (pytest-kind runs kind with the process's own)."""
    saved = {k: os.environ.get(k) for k in kind_env()}
    os.environ.update(kind_env())
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def kind_cluster() -> Iterator[Kind]:
    """The suite's cluster, deleted at the end (also on failure) with its network,
    volumes and the empty /lib/modules made for it."""
    from pytest_kind import KindCluster

    images = node_images()
    image = build_node_image()
    made_modules = False
    with tempfile.TemporaryDirectory(prefix="unstick-kind-") as tmp, _environment():
        with contextlib.chdir(tmp):  # pytest-kind makes .pytest-kind/<name> in the cwd
            cluster = KindCluster(
                CLUSTER,
                kubeconfig=Path(tmp) / "kubeconfig",
                image=image,
                kind_path=BIN / "kind",
                kubectl_path=BIN / "kubectl",
            )
        _delete_leftovers()
        if not MODULES.exists():
            MODULES.mkdir()
            made_modules = True
        try:
            cluster.create(config_file=CONFIG)
            kind = Kind(cluster, images)
            wait_until(
                lambda: len(kind.nodes()) == 3 and all(kind.ready(n) for n in kind.nodes()),
                timeout=300,
                what="the kind cluster's 3 nodes to be Ready",
            )
            for name in ("unstick", "busybox"):
                run(
                    [
                        str(BIN / "kind"),
                        "load",
                        "image-archive",
                        "--name",
                        CLUSTER,
                        images[name]["archive"],
                    ]
                )
            kind.helm_install()
            yield kind
        finally:
            run([str(BIN / "kind"), "delete", "cluster", "--name", CLUSTER], check=False)
            _delete_leftovers()
            if made_modules:
                with contextlib.suppress(OSError):
                    MODULES.rmdir()
