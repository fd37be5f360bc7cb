"""Shared fixtures: the real local control plane (etcd + kube-apiserver), kwok, and the
skips for environments that cannot run a part (with the reason said)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from hypothesis import settings

from devcluster import ControlPlane, Kwok, find_bin_dir, node_manifest
from tests.support.clients import core_v1

# The property tests draw the same examples on every run (Hypothesis seeds each test from
# its own name): `make test` and CI see what a developer saw, and a property failure is
# reproducible. HYPOTHESIS_PROFILE=explore draws new examples each run, for local hunting.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def _unshare_works() -> str | None:
    if os.geteuid() != 0:
        return "needs root for mounts"
    if shutil.which("unshare") is None:
        return "needs unshare(1) (util-linux)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -m is not permitted here: {probe.stderr.strip()}"
    return None


def _kind_unavailable() -> str | None:
    """The kind suite (tests/kind): podman, root, kind and the tools to build its node image."""
    from devcluster.kind_check import kind_unavailable

    return kind_unavailable()


def _binaries_missing() -> str | None:
    try:
        find_bin_dir()
    except FileNotFoundError as e:
        return str(e)
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--envtest-shard",
        metavar="K/N",
        default=None,
        help="keep only the K-th of N shares of the envtests (whole modules, or single tests "
        "in a module marked shard_by_test, dealt round-robin in path order); other tests "
        "are not affected (hack/run-tests.sh)",
    )


def _shard_unit(item: pytest.Item) -> str:
    """What is dealt to a share: the test's module, or the test itself in a module marked
    `shard_by_test` (one whose tests each wait minutes on leases and budgets: whole, it
    would be one share's time on its own)."""
    module = item.nodeid.split("::")[0]
    return item.nodeid if item.get_closest_marker("shard_by_test") else module


def _envtest_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("--envtest-shard")
    if not shard:
        return
    try:
        k, n = (int(x) for x in shard.split("/"))
        if not 1 <= k <= n:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"--envtest-shard {shard}: expected K/N with 1 <= K <= N") from None
    units = sorted({_shard_unit(i) for i in items if i.get_closest_marker("envtest")})
    mine = {u for index, u in enumerate(units) if index % n == k - 1}
    keep, drop = [], []
    for item in items:
        envtest = item.get_closest_marker("envtest") is not None
        (drop if envtest and _shard_unit(item) not in mine else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _envtest_shard(config, items)
    reasons: dict[str, str | None] = {}
    checks = {"mountns": _unshare_works, "kind": _kind_unavailable, "envtest": _binaries_missing}
    for item in items:
        for marker, check in checks.items():
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in reasons:
                reasons[marker] = check()
            reason = reasons[marker]
            if reason is None:
                continue
            if marker == "envtest" and os.environ.get("CI"):
                # In CI `make test` builds the binaries first: missing ones are a failure.
                item.add_marker(pytest.mark.xfail(reason=reason, run=False, strict=True))
            else:
                item.add_marker(pytest.mark.skip(reason=f"{marker}: {reason}"))


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on loopback for the whole session (torn down at the end)."""
    with ControlPlane() as cp:
        yield cp


@pytest.fixture(scope="session")
def kwok(control_plane: ControlPlane) -> Iterator[Kwok]:
    """A kwok controller: nodes annotated `kwok.x-k8s.io/node: fake` get a simulated kubelet."""
    with Kwok(control_plane) as k:
        yield k


@pytest.fixture
def core_api(control_plane: ControlPlane) -> Iterator[Any]:
    with core_v1(control_plane) as core:
        yield core


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Any]:
    """The project's own client (unstick.kube.client.Kube) of the control plane, closed at
    the end."""
    from unstick.kube.client import ClientSettings, Kube

    with closing(Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))) as k:
        yield k


@pytest.fixture
def namespace(core_api: Any) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core_api.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        _purge_pods(core_api, name)
        _purge_remediations(core_api, name)
        core_api.delete_namespace(name)


def _purge_remediations(core_api: Any, namespace: str) -> None:
    """Remove a test's Remediations (forged ones included): nothing here runs a namespace
    controller, and a controller started by a later module would find them."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi(core_api.api_client)
    try:
        custom.delete_collection_namespaced_custom_object(
            "unstick.dev", "v1alpha1", namespace, "remediations"
        )
    except ApiException as e:
        if e.status != 404:  # 404: the CRD is not installed
            raise


def _purge_pods(core_api: Any, namespace: str) -> None:
    """Really remove a test's pods: nothing here runs a namespace controller, and pods on
    kubelet-less nodes would otherwise stay Terminating and leak into later tests."""
    from kubernetes.client.exceptions import ApiException

    for pod in core_api.list_namespaced_pod(namespace).items:
        try:
            if pod.metadata.finalizers:
                core_api.patch_namespaced_pod(
                    pod.metadata.name, namespace, {"metadata": {"finalizers": None}}
                )
            core_api.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture
def make_node(core_api: Any) -> Iterator[Any]:
    """Create Nodes (`kubelet=True`: managed by kwok); every one is deleted afterwards."""
    created: list[str] = []

    def make(
        name: str | None = None, *, kubelet: bool, labels: dict[str, str] | None = None
    ) -> str:
        name = name or f"node-{uuid.uuid4().hex[:8]}"
        core_api.create_node(node_manifest(name, kubelet=kubelet, labels=labels))
        created.append(name)
        return name

    try:
        yield make
    finally:
        from kubernetes.client.exceptions import ApiException

        for name in created:
            try:
                core_api.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise
