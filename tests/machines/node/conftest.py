"""Fixtures of the real-node suite (marker `node`, root only): a control plane of its own
(the ServiceAccount admission plugin on, kube-controller-manager and kube-scheduler
running), one real node for the session (containerd + runc + CNI + kubelet, see
devcluster.node), and unstick installed on it with `helm install` from the
chart, with the image built here. Skipped, with the reason, where any of it is missing."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from devcluster import ControlPlane, ControlPlaneSettings
from devcluster.csi_seed import set_kubelet_verbosity
from devcluster.csi_upstream import UpstreamDriver, upstream_unavailable
from devcluster.csi_upstream_seed import UpstreamSeed
from devcluster.node import RealNode
from devcluster.node_check import node_unavailable
from devcluster.node_cluster import ClusterControllers
from devcluster.node_images import NodeImages, load_images
from tests.support.clients import core_v1

from .support import CHART, REPO, Release, delete_pods_and_wait


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed node test's report carries what unstick's pods logged (`kubectl logs`,
    read from the real kubelet) and the end of the kubelet's log."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.failed or report.when == "teardown":
        return
    funcargs = getattr(item, "funcargs", {})
    release, node = funcargs.get("unstick_release"), funcargs.get("real_node")
    if isinstance(release, Release):
        for pod in release.pods():
            name = pod["metadata"]["name"]
            report.sections.append((f"kubectl logs {name}", release.logs(name, tail=400)))
    if isinstance(node, RealNode):
        report.sections.append(("kubelet log (tail)", node.log_tail("kubelet", 40)))


@pytest.fixture(scope="session", autouse=True)
def no_kube_dir_in_the_repo() -> Iterator[None]:
    """kubectl or helm run without $HOME puts its cache in ./.kube: none of this suite's."""
    kube = REPO / ".kube"
    existed = kube.exists()
    yield
    assert existed or not kube.exists(), f"the node suite created {kube}"


@pytest.fixture(scope="session")
def node_images() -> NodeImages:
    reason = node_unavailable()
    if reason:
        pytest.skip(f"node: {reason}")
    return load_images()


@pytest.fixture(scope="session")
def node_cluster(node_images: NodeImages) -> Iterator[ClusterControllers]:
    settings = ControlPlaneSettings(service_account_admission=True, kubelet_access=True)
    cp = ControlPlane(settings).start()
    controllers = ClusterControllers(cp)
    try:
        controllers.start()
        cp.install_crds()
        yield controllers
    finally:
        controllers.stop()
        cp.stop()


@pytest.fixture(scope="session")
def node_control_plane(node_cluster: ClusterControllers) -> ControlPlane:
    return node_cluster.control_plane


@pytest.fixture(scope="session")
def real_node(node_control_plane: ControlPlane, node_images: NodeImages) -> Iterator[RealNode]:
    """One real node for the session; stopping it fails if anything is left behind."""
    node = RealNode(node_control_plane, node_images).start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def unstick_release(
    real_node: RealNode,
    node_control_plane: ControlPlane,
    node_images: NodeImages,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """The chart installed with `helm install`: image built here (pullPolicy Never), the
    node's paths, remediation on (not dry-run), a short slack so tests need not wait."""
    if not (node_control_plane.bin_dir / "helm").exists():
        pytest.skip(f"node: helm not in {node_control_plane.bin_dir}: run `make tools`")
    home = tmp_path_factory.mktemp("helm")
    values = real_node.write_helm_values(
        home / "values.yaml",
        {
            "image": {
                "repository": node_images.unstick.repository,
                "tag": node_images.unstick.tag,
                "pullPolicy": "Never",
            },
            "policy": {"dryRun": False, "slackSeconds": 5},
            "agent": {"logLevel": "DEBUG"},
            # one node: one replica, as before the chart's hot standby (two replicas may not
            # share a node by default; the kind suite has the two, one per worker)
            "controller": {"verbose": True, "replicas": 1},
        },
    )
    release = Release(node_control_plane, home, namespace="unstick-system")
    release.install(CHART, values)
    try:
        release.wait_ready(real_node)
        yield release
    finally:
        release.uninstall(real_node)


@pytest.fixture(scope="session")
def upstream_driver(
    real_node: RealNode, node_control_plane: ControlPlane
) -> Iterator[Callable[[str], UpstreamDriver]]:
    """`upstream_driver(version)`: csi-driver-host-path `version` deployed on the node, one
    deployment per version shared by the tests that ask for it (another version replaces
    it); skips, with the reason, where its images were not built (docs/csi.md)."""
    current: list[UpstreamDriver] = []

    def deployed(version: str) -> UpstreamDriver:
        reason = upstream_unavailable(version)
        if reason:
            pytest.skip(f"node: upstream csi-driver-host-path {version}: {reason}")
        if current and current[0].version == version:
            if current[0].plugin_pod() is None:  # a test uninstalled it
                current[0].start_plugin()
            return current[0]
        while current:
            current.pop().uninstall()
        driver = UpstreamDriver(node_control_plane, real_node, version)
        current.append(driver)
        driver.install()
        return driver

    try:
        yield deployed
    finally:
        while current:
            current.pop().uninstall()


@pytest.fixture
def node_namespace(node_cluster: ClusterControllers) -> Iterator[str]:
    """A namespace for one test; its pods are deleted (and gone: the real kubelet
    finishes them) before it is."""
    from kubernetes import client

    api_client = node_cluster.control_plane.api_client()
    core = client.CoreV1Api(api_client)
    name = f"n-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    node_cluster.wait_namespace(name)
    try:
        yield name
    finally:
        delete_pods_and_wait(core, name)
        core.delete_namespace(name)
        api_client.close()


@pytest.fixture
def core(node_control_plane: ControlPlane) -> Iterator[Any]:
    with core_v1(node_control_plane) as core:
        yield core


@pytest.fixture
def seed(
    request: pytest.FixtureRequest,
    real_node: RealNode,
    node_control_plane: ControlPlane,
    core: Any,
    node_namespace: str,
) -> Iterator[UpstreamSeed]:
    """The upstream driver's seed (devcluster/csi_upstream_seed.py) in the test's namespace,
    made with the test module's `SEED` arguments; cleaned up at the end."""
    made = UpstreamSeed(
        node_control_plane, core, real_node, node_namespace, **getattr(request.module, "SEED", {})
    )
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def kubelet_verbosity(
    real_node: RealNode, node_control_plane: ControlPlane
) -> Iterator[Callable[[int], None]]:
    """`kubelet_verbosity(4)` restarts the node's kubelet with that -v, to read what it logs;
    it is back at 2 after the test."""
    try:
        yield lambda level: set_kubelet_verbosity(node_control_plane, real_node, level)
    finally:
        set_kubelet_verbosity(node_control_plane, real_node, 2)
