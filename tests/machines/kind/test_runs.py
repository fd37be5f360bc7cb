"""Two runs of the kind suite at once (tests/kind/runs.py): each its own cluster name and
lock; the leftover sweep deletes only what a dead run left, never a live run's cluster.

No cluster is made: the "clusters" are podman containers created (not started) with kind's
cluster label, which is all `kind get clusters` and `kind delete cluster` look at, plus a
node volume and a network each, named as kind names them."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from devcluster.process import wait_until

from . import runs
from .support import build_node_image, kind_cmd, podman, sweep_leftovers

pytestmark = [pytest.mark.kind, pytest.mark.timeout(300)]

HOLDER = """
import sys, time
from tests.machines.kind import runs
lock = runs.RunLock({name!r})
print("held", flush=True)
time.sleep(600)
"""


def hold(name: str) -> subprocess.Popen[str]:
    """Another run's process holding `name`'s lock (as a pytest session does)."""
    code = HOLDER.format(name=name)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def fake_cluster(name: str, image: str) -> None:
    """What kind leaves of a cluster, without running it: a node container labelled with
    the cluster, its /var volume labelled with the node's name, the cluster's network."""
    node = f"{name}-control-plane"
    podman("volume", "create", "--label", f"{node}=true", f"{node}-var")
    podman("network", "create", name)
    podman("create", "--name", node, "--label", f"io.x-k8s.kind.cluster={name}",
           "--network", name, "--volume", f"{node}-var:/var", image)  # fmt: skip


def present(name: str) -> dict[str, bool]:
    volumes = json.loads(podman("volume", "ls", "--format", "json") or "[]")
    return {
        "cluster": name in kind_cmd("get", "clusters", check=False).split(),
        "volume": any(f"{name}-control-plane" in (v.get("Labels") or {}) for v in volumes),
        "network": name in podman("network", "ls", "--format", "{{.Name}}").split(),
    }


@pytest.fixture
def names() -> Iterator[list[str]]:
    made: list[str] = []
    try:
        yield made
    finally:
        from .support import delete_cluster

        for name in made:
            delete_cluster(name)


def test_names_are_per_run_and_recognised() -> None:
    a, b = runs.new_name(), runs.new_name()
    assert a != b
    for name in (a, b, "unstick-kind"):  # (the suite's earlier fixed name too)
        assert runs.cluster_of(name) == name
        assert runs.cluster_of(f"{name}-control-plane") == name
        assert runs.cluster_of(f"{name}-worker2") == name
    assert runs.cluster_of("kind") is None
    assert runs.cluster_of("unstick-kind-net") is None
    assert runs.cluster_of("other-worker") is None


def test_the_sweep_deletes_a_killed_runs_cluster_and_keeps_a_live_ones(
    names: list[str],
) -> None:
    image = build_node_image()
    live, killed = runs.new_name(), runs.new_name()
    names += [live, killed]
    holders = [hold(live), hold(killed)]
    try:
        for name in (live, killed):
            fake_cluster(name, image)
            (runs.workdir(name) / ".pytest-kind").mkdir(parents=True)
        assert runs.alive(live) and runs.alive(killed)

        with runs.machine_lock():
            assert not {live, killed} & set(sweep_leftovers())
        assert (
            present(live) == present(killed) == {"cluster": True, "volume": True, "network": True}
        )

        holders[1].send_signal(signal.SIGKILL)  # the run killed: its lock goes with it
        holders[1].wait()
        wait_until(lambda: not runs.alive(killed), timeout=10, what="the killed run's lock free")
        with runs.machine_lock():
            swept = sweep_leftovers()
        assert killed in swept and live not in swept
        assert present(killed) == {"cluster": False, "volume": False, "network": False}
        assert present(live) == {"cluster": True, "volume": True, "network": True}
        assert not (runs.runs_dir() / f"{killed}.lock").exists()
        assert not runs.workdir(killed).exists()
        assert (runs.runs_dir() / f"{live}.lock").exists()
        assert runs.workdir(live).exists()
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
            if proc.stdout:
                proc.stdout.close()
        for name in (live, killed):
            (runs.runs_dir() / f"{name}.lock").unlink(missing_ok=True)
            shutil.rmtree(runs.workdir(name), ignore_errors=True)
