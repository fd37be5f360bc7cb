"""Agent scenarios with real mounts, run INSIDE a private mount namespace by conftest.

Usage: `unshare -m --propagation private python mountns_scenarios.py NAME WORKDIR`.
WORKDIR gets a tmpfs first; the kubelet root and all data live on it. Each scenario lays
out pods the way the kubelet does, runs the agent's probe/executor/handler against them,
kills every process it started (by pid, in finally) and prints one JSON line.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from devcluster.csi_hostpath import kubelet_capability
from devcluster.process import wait_until
from tests.agent.policy_sources import opted_in
from tests.support.remediations import node_steps, remediation
from unstick.agent.handler import Handler
from unstick.agent.probe.collect import probe_pod
from unstick.agent.proto import csi_pb2, csi_pb2_grpc
from unstick.agent.settings import AgentSettings
from unstick.agent.steps.executor import Executor
from unstick.core.model.mountinfo import parse_mountinfo
from unstick.core.remediation import rfc3339

UID_A = "aaaaaaaa-1111-4111-8111-aaaaaaaaaaaa"
UID_B = "bbbbbbbb-2222-4222-8222-bbbbbbbbbbbb"
DRIVER = "hostpath.csi.k8s.io"
HERE = Path(__file__).parent


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def mount_points() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [m.mount_point for m in parse_mountinfo(f.read())]


class Node:
    """A kubelet root on the scenario's tmpfs, with helpers that lay out pod volumes."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.root = work / "kubelet"
        self.data = work / "data"
        self.data.mkdir()
        self.root.mkdir()
        self.procs: list[subprocess.Popen[Any]] = []
        self.settings = AgentSettings(
            node_name="test-node",
            kubelet_root=str(self.root),
            host_proc="/proc",
            mountinfo_path="/proc/self/mountinfo",
            kubelet_healthz="http://127.0.0.1:9/healthz",
            state_dir=str(work / "state"),
            grpc_timeout_s=5.0,
        )

    def pod(self, uid: str) -> Path:
        return self.root / "pods" / uid

    def csi_volume(self, uid: str, pv: str, handle: str, bind: bool = True) -> Path:
        vol = self.pod(uid) / "volumes" / "kubernetes.io~csi" / pv
        (vol / "mount").mkdir(parents=True)
        data = {"specVolID": pv, "volumeHandle": handle, "driverName": DRIVER, "nodeName": "n"}
        (vol / "vol_data.json").write_text(json.dumps(data))
        if bind:
            src = self.data / handle
            src.mkdir(exist_ok=True)
            (src / "file.txt").write_text("user data\n")
            sh("mount", "--bind", str(src), str(vol / "mount"))
        return vol / "mount"

    def projected(self, uid: str, name: str) -> Path:
        path = self.pod(uid) / "volumes" / "kubernetes.io~projected" / name
        path.mkdir(parents=True)
        sh("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path))
        (path / "token").write_text("secret\n")
        return path

    def subpath(self, uid: str, source: Path) -> Path:
        path = self.pod(uid) / "volume-subpaths" / "data" / "app" / "0"
        path.mkdir(parents=True)
        sh("mount", "--bind", str(source), str(path))
        return path

    def staging(self, handle: str) -> Path:
        digest = hashlib.sha256(handle.encode()).hexdigest()
        path = self.root / "plugins" / "kubernetes.io" / "csi" / DRIVER / digest / "globalmount"
        path.mkdir(parents=True)
        src = self.data / handle
        src.mkdir(exist_ok=True)
        sh("mount", "--bind", str(src), str(path))
        return path

    def start(self, *cmd: str, **kw: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(cmd, **kw)
        self.procs.append(proc)
        return proc

    def in_own_namespace(self, script: str, what: str) -> subprocess.Popen[str]:
        """A shell in a mount namespace of its own (`unshare -m`, propagation unchanged)
        that runs `script` (`set -e`), says ready and sleeps; once it is ready."""
        proc = self.start(
            "unshare", "-m", "--propagation", "unchanged",
            "sh", "-c", f"set -e; {script}; echo ready; exec sleep 600",
            stdout=subprocess.PIPE, text=True, cwd="/",
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "ready", f"{what} did not start: {line!r}"
        # "ready" is said by the shell before its exec: until the exec the process is
        # still `sh`, and a holder scan then names it so (seen under load)
        comm = Path(f"/proc/{proc.pid}/comm")
        wait_until(lambda: comm.read_text().strip() == "sleep", timeout=20, what=f"{what} asleep")
        return proc

    def stop(self, proc: subprocess.Popen[Any]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()

    def cleanup(self) -> None:
        for proc in self.procs:
            self.stop(proc)

    def executor(self) -> Executor:
        return Executor(self.settings)

    def probe(self, uid: str) -> dict[str, Any]:
        return probe_pod(self.settings, uid)


def step(
    ex: Executor, uid: str, action: str, target: str = "", dry: bool = False
) -> dict[str, str]:
    return ex.run_step(uid, action, target, dry_run=dry, lazy_unmount=False).to_json()


def tree(path: Path) -> list[str]:
    """Every path below `path`, without following symlinks."""
    found = []
    for dirpath, dirnames, filenames in os.walk(path):
        found.extend(str(Path(dirpath) / n) for n in dirnames + filenames)
    return sorted(found)


def layout(node: Node) -> dict[str, str]:
    """Pod A: CSI volume, projected tmpfs, subpath bind, stale empty-dir; the CSI volume's
    global staging mount; pod B (decoy) with its own CSI and projected mounts."""
    paths = {
        "staging": str(node.staging("vol-a")),
        "a_csi": str(node.csi_volume(UID_A, "pvc-a", "vol-a")),
        "a_projected": str(node.projected(UID_A, "kube-api-access-x")),
        "b_csi": str(node.csi_volume(UID_B, "pvc-b", "vol-b")),
        "b_projected": str(node.projected(UID_B, "kube-api-access-y")),
    }
    paths["a_subpath"] = str(node.subpath(UID_A, node.data / "vol-a"))
    stale = node.pod(UID_A) / "volumes" / "kubernetes.io~empty-dir" / "cache"
    stale.mkdir(parents=True)
    paths["a_stale"] = str(stale)
    return paths


def scenario_layout(node: Node) -> dict[str, Any]:
    paths = layout(node)
    probe = node.probe(UID_A)
    ex = node.executor()
    unmount = step(ex, UID_A, "unmount")
    rmdir = step(ex, UID_A, "rmdir-stale")
    return {
        "paths": paths,
        "probe": probe,
        "unmount": unmount,
        "rmdir": rmdir,
        "mounts_after": mount_points(),
        "pod_a_tree_after": tree(node.pod(UID_A)),
        "probe_after": node.probe(UID_A),
    }


def scenario_dry_run(node: Node) -> dict[str, Any]:
    paths = layout(node)
    before = (mount_points(), tree(node.pod(UID_A)))
    ex = node.executor()
    results = [step(ex, UID_A, a, dry=True) for a in ("unmount", "rmdir-stale", "replay-unpublish")]
    after = (mount_points(), tree(node.pod(UID_A)))
    return {"paths": paths, "results": results, "unchanged": before == after}


def scenario_holders(node: Node) -> dict[str, Any]:
    v1 = node.projected(UID_A, "cwd-held")
    v2 = node.projected(UID_A, "fd-held")
    v3 = node.projected(UID_A, "ns-held")
    try:
        by_cwd = node.start("sleep", "600", cwd=v1)
        by_fd = node.start("tail", "-f", str(v2 / "token"), stdout=subprocess.DEVNULL)
        wait_until(
            lambda: _has_fd(by_fd.pid, str(v2 / "token")), timeout=20, what="tail to open the file"
        )
        own_ns = _ns(os.getpid())
        by_ns = node.start("unshare", "-m", "--propagation", "private", "sleep", "600")
        wait_until(
            lambda: _comm(by_ns.pid) == "sleep" and _ns(by_ns.pid) != own_ns,
            timeout=20,
            what="the namespace holder",
        )
        probe = node.probe(UID_A)
        ex = node.executor()
        refused = {
            name: step(ex, UID_A, "unmount", str(p))
            for name, p in (("cwd", v1), ("fd", v2), ("mountns", v3))
        }
        refused["all"] = step(ex, UID_A, "unmount")
        still = mount_points()
        node.stop(by_ns)
        after_release = step(ex, UID_A, "unmount", str(v3))
        return {
            "paths": {"cwd": str(v1), "fd": str(v2), "mountns": str(v3)},
            "pids": {"cwd": by_cwd.pid, "fd": by_fd.pid, "mountns": by_ns.pid},
            "probe": probe,
            "refused": refused,
            "mounts_while_held": still,
            "after_release": after_release,
            "mounts_after": mount_points(),
        }
    finally:
        node.cleanup()


def _has_fd(pid: int, path: str) -> bool:
    try:
        return any(str(fd.readlink()) == path for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ns(pid: int) -> str:
    try:
        return str(Path(f"/proc/{pid}/ns/mnt").readlink())
    except OSError:
        return ""


def scenario_symlinks(node: Node) -> dict[str, Any]:
    """Symlinks planted in pod A's dirs, pointing at /etc and at pod B's mounts."""
    b_proj = node.projected(UID_B, "kube-api-access-b")
    b_csi = node.csi_volume(UID_B, "pvc-b", "vol-b")
    a_vols = node.pod(UID_A) / "volumes"
    (a_vols / "kubernetes.io~empty-dir").mkdir(parents=True)
    (a_vols / "kubernetes.io~empty-dir" / "evil").symlink_to("/etc")
    (a_vols / "kubernetes.io~secret").symlink_to(b_proj.parent)
    sub = node.pod(UID_A) / "volume-subpaths" / "data" / "app"
    sub.mkdir(parents=True)
    (sub / "0").symlink_to(b_csi)
    etc_before = sorted(p.name for p in Path("/etc").iterdir())
    through = a_vols / "kubernetes.io~secret" / b_proj.name
    ex = node.executor()
    results = {
        "unmount_through_symlink": step(ex, UID_A, "unmount", str(through)),
        "rmdir_through_symlink": step(ex, UID_A, "rmdir-stale", str(through)),
        "unmount_all": step(ex, UID_A, "unmount"),
        "rmdir_all": step(ex, UID_A, "rmdir-stale"),
    }
    return {
        "probe": node.probe(UID_A),
        "results": results,
        "etc_unchanged": sorted(p.name for p in Path("/etc").iterdir()) == etc_before,
        "b_mounts": [str(b_proj), str(b_csi)],
        "mounts_after": mount_points(),
        "b_token": (b_proj / "token").read_text(),
        "pod_a_tree_after": tree(node.pod(UID_A)),
    }


def scenario_other_uid(node: Node) -> dict[str, Any]:
    paths = layout(node)
    ex = node.executor()
    b_pv_dir = str(Path(paths["b_csi"]).parent)
    return {
        "paths": paths,
        "unmount_b_as_a": step(ex, UID_A, "unmount", paths["b_csi"]),
        "replay_b_as_a": step(ex, UID_A, "replay-unpublish", paths["b_csi"]),
        "rmdir_b_as_a": step(ex, UID_A, "rmdir-stale", b_pv_dir),
        "staging_as_a": step(ex, UID_A, "unmount", paths["staging"]),
        "bad_uid": step(ex, "../" + UID_B, "unmount"),
        "mounts_after": mount_points(),
    }


class CSIServer:
    """devcluster.csi_hostpath as a process of this namespace."""

    def __init__(self, node: Node) -> None:
        self.node = node
        registry = node.root / "plugins_registry"
        plugin_dir = node.root / "plugins" / DRIVER
        registry.mkdir(parents=True, exist_ok=True)
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self.csi_socket = str(plugin_dir / "csi.sock")
        self.args = [
            sys.executable, "-m", "devcluster.csi_hostpath", "--name", DRIVER,
            "--csi-socket", self.csi_socket,
            "--registration-socket", str(registry / f"{DRIVER}-reg.sock"),
            "--data-dir", str(node.data), "--state-file", str(node.work / "csi-state.json"),
        ]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = self.node.start(*self.args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"csi server did not start: {line!r}"

    def restart_with_state_lost(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        (self.node.work / "csi-state.json").unlink()
        self.start()

    def publish(self, uid: str, pv: str, handle: str) -> tuple[str, str]:
        """What the kubelet does: NodeStageVolume, NodePublishVolume, vol_data.json."""
        digest = hashlib.sha256(handle.encode()).hexdigest()
        staging = (
            self.node.root / "plugins" / "kubernetes.io" / "csi" / DRIVER / digest / "globalmount"
        )
        target = self.node.csi_volume(uid, pv, handle, bind=False)
        (self.node.data / handle).mkdir(exist_ok=True)  # the static PV's directory
        cap = kubelet_capability()
        with grpc.insecure_channel(f"unix://{self.csi_socket}") as ch:
            node = csi_pb2_grpc.NodeStub(ch)
            if not staging.exists() or str(staging) not in mount_points():
                node.NodeStageVolume(
                    csi_pb2.NodeStageVolumeRequest(
                        volume_id=handle, staging_target_path=str(staging), volume_capability=cap
                    ),
                    timeout=10,
                )
            node.NodePublishVolume(
                csi_pb2.NodePublishVolumeRequest(
                    volume_id=handle,
                    staging_target_path=str(staging),
                    target_path=str(target),
                    volume_capability=cap,
                ),
                timeout=10,
            )
        return str(staging), str(target)


def terminating_pod(namespace: str, name: str) -> dict[str, Any]:
    """What the API answers for pod A here: Terminating on test-node, overdue (there is no
    API server in these scenarios; test_agent_envtest.py checks the real GET)."""
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": UID_A,
                     "deletionTimestamp": "2026-01-02T00:00:00Z"},
        "spec": {"nodeName": "test-node"},
    }  # fmt: skip


def steps_request(
    uid: str, steps: Sequence[str | tuple[str, str]], requested: datetime, key: str = "rem-1"
) -> dict[str, Any]:
    """The Remediation of pod web-0 (UID `uid`) on test-node asking for `steps`, requested at
    `requested`, as the agent's watch hands it over (its record UID `key`)."""
    body = remediation(
        "web-0", uid, "test-node", name="web-0-aaaaaaaa",
        metadata={"namespace": "default", "uid": key},
        nodeSteps=node_steps(*steps), nodeStepsRequestedAt=rfc3339(requested), dryRun=False,
    )  # fmt: skip
    return {**body, "status": {}}


def recording_handler(
    node: Node, lookup: Callable[[str, str], Any] = terminating_pod, **options: Any
) -> tuple[Handler, list[dict[str, Any]]]:
    """The agent's handler on `node` (opted-in policies unless `options` say otherwise) and
    the list its status patches go to."""
    patches: list[dict[str, Any]] = []
    handler = Handler(
        node.settings,
        node.executor(),
        lambda ns, name, p: patches.append(p),
        lookup,
        **{"policies": opted_in(), **options},
    )
    return handler, patches


def _run_handler_steps(
    node: Node, uid: str, steps: list[str] | list[tuple[str, str]]
) -> dict[str, Any]:
    handler, patches = recording_handler(node)
    request = steps_request(uid, steps, datetime.now(UTC))
    handler.handle(request)
    handler.handle(request)  # the same request again: already served, no second run
    return {"patches": patches}


def scenario_csi_replay(node: Node) -> dict[str, Any]:
    """A healthy driver: replay-unpublish unpublishes and unstages."""
    server = CSIServer(node)
    try:
        server.start()
        staging, target = server.publish(UID_A, "pvc-1", "vol-1")
        probe = node.probe(UID_A)
        pv_dir = str(Path(target).parent)
        # the plan the core makes for OrphanedMount: per-target steps, deepest first
        steps = [("replay-unpublish", target), ("unmount", target), ("rmdir-stale", target),
                 ("rmdir-stale", pv_dir), ("rmdir-stale", str(Path(pv_dir).parent))]  # fmt: skip
        result = _run_handler_steps(node, UID_A, steps)
        return {"staging": staging, "target": target, "probe": probe, **result,
                "mounts_after": mount_points()}  # fmt: skip
    finally:
        node.cleanup()


def scenario_csi_lost_state(node: Node) -> dict[str, Any]:
    """The driver restarts with its state lost: NodeUnpublishVolume answers OK and leaves
    the mount; the agent must notice and fall through to unmount, then rmdir-stale."""
    server = CSIServer(node)
    try:
        server.start()
        staging, target = server.publish(UID_A, "pvc-1", "vol-1")
        _, other = server.publish(UID_B, "pvc-1", "vol-1")  # another pod uses the volume
        server.restart_with_state_lost()
        probe = node.probe(UID_A)
        result = _run_handler_steps(node, UID_A, ["replay-unpublish", "unmount", "rmdir-stale"])
        after = {"mounts_after": mount_points(), "pod_a_tree_after": tree(node.pod(UID_A))}
        return {"staging": staging, "target": target, "other": other, "probe": probe, **result,
                **after}  # fmt: skip
    finally:
        node.cleanup()


def _bundle(probe: dict[str, Any]) -> dict[str, Any]:
    """A snapshot bundle around a live probe: pod A (opted in, deleted long ago) on a Ready
    node, with a PVC bound to the CSI PV `pvc-1` (handle `vol-1`) of the test driver."""
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    return {
        "apiVersion": "unstick.dev/v1alpha1", "kind": "Snapshot",
        "capturedAt": probe["probedAt"],
        "pod": {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-0", "namespace": "default", "uid": UID_A,
                "annotations": {"unstick.dev/remediate": "true"},
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 30,
            },
            "spec": {
                "nodeName": "test-node",
                "containers": [{"name": "app", "image": "app:1"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}],
            },
            "status": {"phase": "Running"},
        },
        "node": {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node"},
                 "status": {"conditions": [ready]}},
        "csiNode": {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                    "metadata": {"name": "test-node"},
                    "spec": {"drivers": [{"name": DRIVER, "nodeID": "test-node"}]}},
        "persistentVolumeClaims": [{
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data-web-0", "namespace": "default"},
            "spec": {"volumeName": "pvc-1"}, "status": {"phase": "Bound"},
        }],
        "persistentVolumes": [{
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pvc-1"},
            "spec": {"csi": {"driver": DRIVER, "volumeHandle": "vol-1"},
                     "claimRef": {"namespace": "default", "name": "data-web-0"}},
            "status": {"phase": "Bound"},
        }],
        "volumeAttachments": [], "events": [],
        "probe": probe,
    }  # fmt: skip


def scenario_core_plan(node: Node) -> dict[str, Any]:
    """The whole node side: live probe -> the core's diagnosis and plan -> the plan's node
    steps through the agent's handler -> a fresh probe -> the core's diagnosis again."""
    from unstick.core.model.snapshot import parse_bundle
    from unstick.core.policy.planner import plan
    from unstick.core.rules.diagnosis import diagnose
    from unstick.core.vocabulary import NODE_ACTIONS

    server = CSIServer(node)
    try:
        server.start()
        _, target = server.publish(UID_A, "pvc-1", "vol-1")
        token = node.projected(UID_A, "kube-api-access-x")
        server.restart_with_state_lost()
        before = diagnose(parse_bundle(_bundle(node.probe(UID_A))))
        steps = [(str(s.action), s.target) for s in plan(before, None).steps
                 if s.action in NODE_ACTIONS]  # fmt: skip
        result = _run_handler_steps(node, UID_A, steps)
        after_probe = result["patches"][0]["probe"]
        after = diagnose(parse_bundle(_bundle(after_probe)))
        return {
            "target": target, "token": str(token),
            "cause_before": str(before.cause), "steps": steps, **result,
            "cause_after": str(after.cause), "mounts_after": mount_points(),
        }  # fmt: skip
    finally:
        node.cleanup()


def scenarios_in(namespace: dict[str, Any]) -> dict[str, Callable[[Node], dict[str, Any]]]:
    """A script's scenarios (`scenarios_in(globals())`): its functions `scenario_<name>`,
    by name."""
    prefix = "scenario_"
    return {k.removeprefix(prefix): v for k, v in namespace.items() if k.startswith(prefix)}


SCENARIOS = scenarios_in(globals())


def main(scenarios: dict[str, Callable[[Node], dict[str, Any]]] = SCENARIOS) -> int:
    name, work = sys.argv[1], Path(sys.argv[2])
    # Everything below lives on this tmpfs, in this (private) mount namespace only.
    sh("mount", "--make-rprivate", "/")
    sh("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(work))
    node = Node(work)
    try:
        result = scenarios[name](node)
    finally:
        node.cleanup()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
