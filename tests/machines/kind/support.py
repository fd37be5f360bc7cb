"""The kind suite's cluster: kind on podman (pytest-kind's KindCluster with the kind built
here), the node image hack/build-kind-node-image.sh builds, unstick loaded with `kind
load image-archive` and installed from the chart with helm as the README says. Helpers to
read the cluster (kubectl, metrics through the API server's pod proxy) and to act on a
node's container (podman)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from devcluster.kind_check import ROOT, kind_env
from devcluster.process import wait_until

from . import runs

BIN = ROOT / "bin"
CONFIG = Path(__file__).with_name("cluster.yaml")
NAMESPACE = "unstick"
log = logging.getLogger(__name__)
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


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a scraped exposition (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def podman(*args: str, check: bool = True, stdin: str | None = None) -> str:
    return run(["podman", *args], stdin=stdin, check=check)


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
class _Load:
    argv: list[str]
    proc: subprocess.Popen[str]


@dataclass
class Kind:
    """The running cluster: kubectl and helm against it, its nodes' containers."""

    cluster: Any  # pytest_kind.KindCluster
    images: dict[str, dict[str, str]]
    # `kind load image-archive` runs started at setup, by what they are for; waited for
    # where first needed (wait_loaded)
    loads: dict[str, list[_Load]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The cluster's name, this run's own (tests/kind/runs.py)."""
        name: str = self.cluster.name
        return name

    @property
    def kubeconfig(self) -> str:
        return str(self.cluster.kubeconfig_path)

    def start_load(self, group: str, image: str, nodes: str = "") -> None:
        """`kind load image-archive` of an image of bin/node-images.json into `nodes`
        (comma-separated; all when empty), started without waiting (see wait_loaded)."""
        argv = [str(BIN / "kind"), "load", "image-archive", "--name", self.name]
        argv += ["--nodes", nodes] if nodes else []
        argv.append(self.images[image]["archive"])
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.loads.setdefault(group, []).append(_Load(argv, proc))

    def leader_pod(self) -> dict[str, Any]:
        """The controller pod that holds the leader Lease: the one that acts (the chart
        runs two replicas, one per worker; docs/controller.md "Leader election")."""

        def holder() -> dict[str, Any] | None:
            lease = self.get("lease", "unstick-controller", "-n", NAMESPACE)
            name = (lease.get("spec") or {}).get("holderIdentity")
            pods = self.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=controller")
            return next((p for p in pods["items"] if p["metadata"]["name"] == name), None)

        found: dict[str, Any] = wait_until(holder, timeout=60, what="the leading controller")
        return found

    def worker_without_controller(self) -> str:
        """The worker where the leading controller does not run (the one the tests cut off:
        the controller that acts must keep running; the standby there stops with it)."""
        node = self.leader_pod()["spec"].get("nodeName")
        return next(w for w in self.workers() if w != node)

    def wait_loaded(self, group: str) -> None:
        """The image loads of `group` finished (a failed one raises, saying why)."""
        for load in self.loads.get(group, []):
            _, err = load.proc.communicate(timeout=600)
            if load.proc.returncode != 0:
                raise RuntimeError(f"{' '.join(load.argv)} failed: {err}")

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


def kind_cmd(*args: str, check: bool = True) -> str:
    return run([str(BIN / "kind"), *args], check=check)


def delete_cluster(name: str) -> None:
    """The cluster, its nodes' volumes and its network. The nodes are removed first with
    no stop timeout: `kind delete cluster` lets each node's systemd take podman's 10 s to
    stop, and nothing in them is worth keeping."""
    nodes = podman("ps", "-a", "--filter", f"label=io.x-k8s.kind.cluster={name}",
                   "--format", "{{.Names}}", check=False).split()  # fmt: skip
    with phase(f"{name}'s nodes removed"):
        if nodes:
            podman("rm", "--force", "--time", "0", "--volumes", *nodes, check=False)
    with phase("kind delete cluster"):
        kind_cmd("delete", "cluster", "--name", name, check=False)
    for volume in json.loads(podman("volume", "ls", "--format", "json", check=False) or "[]"):
        if any(runs.cluster_of(label) == name for label in volume.get("Labels") or {}):
            podman("volume", "rm", "--force", volume["Name"], check=False)
    if network_exists(name):
        podman("network", "rm", "--force", name, check=False)


def network_exists(name: str) -> bool:
    probe = subprocess.run(["podman", "network", "exists", name], env={**os.environ, **kind_env()})
    return probe.returncode == 0


def leftovers() -> set[str]:
    """The suite's clusters that have a cluster, node volume or network here but no live
    run (tests/kind/runs.py): left by a killed session."""
    found = set(kind_cmd("get", "clusters", check=False).split())
    for volume in json.loads(podman("volume", "ls", "--format", "json", check=False) or "[]"):
        found.update(volume.get("Labels") or {})
    found.update(podman("network", "ls", "--format", "{{.Name}}", check=False).split())
    names = {runs.cluster_of(f) for f in found} - {None}
    return {n for n in names if n is not None and not runs.alive(n)}


def sweep_leftovers() -> list[str]:
    """Deletes what killed runs left (never a live run's cluster); the names deleted.
    Called under runs.machine_lock()."""
    dead = sorted(leftovers())
    for name in dead:
        delete_cluster(name)
    for path in runs.dead_files():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return dead


@contextlib.contextmanager
def _environment(network: str) -> Iterator[None]:
    """kind's variables in os.environ (pytest-kind runs kind with the process's own)."""
    env = kind_env(network)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _claimed(name: str) -> Iterator[None]:
    """This run's name claimed (and leftovers swept) under the machine lock; at the end
    the claim released and the empty /lib/modules removed if the suite made it and no
    other run still uses it."""
    made_marker = runs.runs_dir() / "made-lib-modules"
    with runs.machine_lock():
        sweep_leftovers()
        claim = runs.RunLock(name)
        # kind mounts the host's /lib/modules into every node; podman refuses a missing one
        if not MODULES.exists():
            MODULES.mkdir()
            made_marker.touch()
    try:
        yield
    finally:
        with runs.machine_lock():
            claim.release()
            if made_marker.exists() and not runs.live_runs():
                with contextlib.suppress(OSError):
                    MODULES.rmdir()
                made_marker.unlink(missing_ok=True)


def csi_images(images: dict[str, dict[str, str]]) -> list[str]:
    """The upstream CSI driver's images (tests/kind/csi.py), if all were built."""
    from devcluster.csi_upstream import FIXED, SIDECARS

    names = [f"csi-hostpath-{FIXED}", SIDECARS]
    return names if all(n in images for n in names) else []


@contextlib.contextmanager
def phase(what: str) -> Iterator[None]:
    """Logs how long a step of the setup took (`pytest --log-cli-level=INFO` shows it)."""
    start = time.monotonic()
    yield
    log.info("kind suite: %s in %.1f s", what, time.monotonic() - start)


def _create(kind: Kind, workers: str) -> None:
    """`kind create cluster` (pytest-kind's create), with unstick (every node: the agent
    runs on each) and busybox (the workers: the tests' pods) loaded into the nodes as
    soon as their containerd answers, while kubeadm runs (~20 s less than after it)."""
    failed: list[BaseException] = []

    def create() -> None:
        try:
            kind.cluster.create(config_file=CONFIG)
        except BaseException as e:  # raised again in the caller's thread below
            failed.append(e)

    thread = threading.Thread(target=create, name="kind-create", daemon=True)
    thread.start()
    nodes = [f"{kind.name}-control-plane", *workers.split(",")]
    last = [0.0]

    def containerd_up() -> bool:
        if not thread.is_alive():
            return True
        if time.monotonic() - last[0] < 2:  # podman exec is not cheap: every 2 s
            return False
        last[0] = time.monotonic()
        ctr = ["ctr", "--namespace", "k8s.io", "version"]
        return all(
            subprocess.run(
                ["podman", "exec", node, *ctr], capture_output=True, env=kind_env_now()
            ).returncode
            == 0
            for node in nodes
        )

    try:
        wait_until(containerd_up, timeout=600, what="the kind nodes' containerd")
        if thread.is_alive() or not failed:
            kind.start_load("images", "unstick")
            kind.start_load("images", "busybox", workers)
    finally:
        thread.join()
    if failed:
        raise failed[0]


def kind_env_now() -> dict[str, str]:
    return {**os.environ, **kind_env()}


@contextlib.contextmanager
def kind_cluster() -> Iterator[Kind]:
    """This run's cluster (its own name: tests/kind/runs.py), deleted at the end (also on
    failure) with its network, volumes and the empty /lib/modules made for it."""
    from pytest_kind import KindCluster

    images = node_images()
    image = build_node_image()
    name = runs.new_name()
    work = runs.workdir(name)
    with _environment(name), _claimed(name):
        work.mkdir()
        with contextlib.chdir(work):  # pytest-kind makes .pytest-kind/<name> in the cwd
            cluster = KindCluster(
                name,
                kubeconfig=work / "kubeconfig",
                image=image,
                kind_path=BIN / "kind",
                kubectl_path=BIN / "kubectl",
            )
        kind = Kind(cluster, images)
        workers = f"{name}-worker,{name}-worker2"
        try:
            with phase("kind create cluster (images loaded meanwhile)"):
                _create(kind, workers)
            with phase("nodes Ready"):
                wait_until(
                    lambda: len(kind.nodes()) == 3 and all(kind.ready(n) for n in kind.nodes()),
                    timeout=300,
                    what="the kind cluster's 3 nodes to be Ready",
                )
            with phase("images loaded (after Ready)"):
                kind.wait_loaded("images")
            with phase("helm install --wait"):
                kind.helm_install()
            # The upstream CSI driver's images, on the worker the partition test cuts off
            # (the one without the controller), loaded while the first tests run.
            for csi_image in csi_images(images):
                kind.start_load("csi", csi_image, kind.worker_without_controller())
            yield kind
        finally:
            for load in (load for group in kind.loads.values() for load in group):
                if load.proc.poll() is None:
                    load.proc.kill()
                    load.proc.wait()
            with phase("cluster deleted, with its volumes and network"):
                delete_cluster(name)
            shutil.rmtree(work, ignore_errors=True)
