"""Helpers for the agent tests: run a scenario inside a private mount namespace.

`run_scenario(name, workdir)` starts `unshare -m --propagation private python
mountns_scenarios.py NAME WORKDIR` in its own process group. The scenario mounts a tmpfs
on WORKDIR first, so every mount it makes lives in that namespace only and disappears with
it; whatever happens, the whole process group (scenario, holders, CSI server) is killed
by its id at the end.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.processes import run_unshared

HERE = Path(__file__).parent
SCENARIOS = HERE / "mountns_scenarios.py"

# A kubeconfig whose API server never answers (port 9): for agents whose API calls a test
# replaces, so nothing reaches a cluster.
UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def offline_agent(tmp_path: Path) -> Callable[..., Any]:
    """`offline_agent(**loop_settings)`: an Agent of node `n` (kubelet root under tmp_path)
    whose kubeconfig points at nothing."""
    from unstick.agent.loop import Agent, LoopSettings
    from unstick.agent.settings import AgentSettings

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    settings = AgentSettings(node_name="n", kubelet_root=str(tmp_path / "kubelet"))

    def make(**loop: Any) -> Agent:
        return Agent(settings, LoopSettings(kubeconfig=str(kubeconfig), **loop))

    return make


def run_scenario(
    name: str, workdir: Path, *args: str, timeout: float = 120, script: Path = SCENARIOS
) -> dict[str, Any]:
    """Run one scenario of `script` in a private mount namespace; its JSON result."""
    workdir.mkdir(parents=True, exist_ok=True)
    done = run_unshared([sys.executable, str(script), name, str(workdir), *args], timeout)
    if done.returncode != 0:
        pytest.fail(f"scenario {name} exited {done.returncode}:\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"scenario {name} printed no result:\n{done.stdout}\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def host_mounts_under(path: Path) -> list[str]:
    """Mount points under `path` in the test's own (host) namespace: must stay empty."""
    prefix = str(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A dir with a short path (unix socket paths are limited to 107 bytes), removed
    afterwards."""
    path = Path(tempfile.mkdtemp(prefix="ua-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def work(short_tmp: Path) -> Iterator[Path]:
    """The scenario's work dir (`short_tmp`); afterwards no mount under it may exist in the
    host namespace."""
    yield short_tmp
    assert host_mounts_under(short_tmp) == [], "a mount leaked into the host namespace"


@pytest.fixture(scope="session")
def scenario() -> Callable[..., dict[str, Any]]:
    """`scenario(name, workdir)`: run a mountns scenario, its JSON result (a plain
    function: session-scoped, so module-scoped fixtures may use it too)."""
    return run_scenario


@pytest.fixture(scope="session")
def host_mounts() -> Callable[[Path], list[str]]:
    """`host_mounts(path)`: mount points under `path` in the test's own namespace."""
    return host_mounts_under


@pytest.fixture
def kube(kube: Any, control_plane: ControlPlane) -> Any:
    """The client of tests/conftest.py, with the project's CRDs installed (and Established)
    first, for the tests that write Remediations and policies through it."""
    control_plane.install_crds()
    return kube
