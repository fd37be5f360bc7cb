"""Runs inside a private mount namespace (`unshare -m --propagation private`, see
test_sanity.py): the project's CSI plugin on a unix socket, then one of

- `sanity WORKDIR CSI_SANITY`: the real csi-sanity against it (its ginkgo JSON report);
- `behaviour WORKDIR`: what csi-sanity does not check, over the real gRPC API.

WORKDIR gets a tmpfs first, so every mount lives in this namespace only. Prints one JSON
line with the outcome; the test asserts on it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc

from unstick.agent.proto import csi_pb2, csi_pb2_grpc
from unstick.core.model.mountinfo import parse_mountinfo

DRIVER = "hostpath.csi.k8s.io"


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [m.mount_point for m in parse_mountinfo(f.read())]
    return [p for p in points if p.startswith(str(path) + "/")]


class Plugin:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.socket = work / "csi.sock"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "devcluster.csi_hostpath", "--name", DRIVER,
                "--csi-socket", str(self.socket),
                "--registration-socket", str(self.work / "reg.sock"),
                "--data-dir", str(self.work / "data"),
                "--state-file", str(self.work / "state.json"),
            ],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"the CSI plugin did not start: {line!r}"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 30 s (on a loaded machine the
        plugin's gRPC servers took longer than 20 s to stop once): the scenario checks what
        the plugin answered, not how fast it stops, and leaves no process behind."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def sanity(work: Path, binary: str) -> dict[str, Any]:
    plugin = Plugin(work)
    plugin.start()
    report = work / "report.json"
    try:
        run = subprocess.run(
            [
                binary, f"--csi.endpoint=unix://{plugin.socket}",
                f"--csi.mountdir={work / 'mnt'}", f"--csi.stagingdir={work / 'stage'}",
                f"--ginkgo.json-report={report}", "--ginkgo.no-color",
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        plugin.stop()
    specs = json.loads(report.read_text())[0]["SpecReports"]
    return {
        "returncode": run.returncode,
        "output": run.stdout[-6000:],
        "specs": [
            {
                "name": " ".join([*s["ContainerHierarchyTexts"], s["LeafNodeText"]]),
                "state": s["State"],
                "message": (s.get("Failure") or {}).get("Message", ""),
            }
            for s in specs
            if s["LeafNodeType"] == "It"
        ],
        "mounts_after": mounts_under(work),
        "volumes_after": sorted(p.name for p in (work / "data").iterdir()),
    }


def _code(call: Any) -> str:
    try:
        call()
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


def behaviour(work: Path) -> dict[str, Any]:
    """Unknown volumes, a staging path taken by another volume, deleting a published volume,
    and the lost-state NodeUnpublishVolume (OK, mount left behind)."""
    from devcluster.csi_hostpath import kubelet_capability  # (not in the old plugin)

    plugin = Plugin(work)
    plugin.start()
    cap = kubelet_capability()
    out: dict[str, Any] = {}
    try:
        with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
            ctl, node = csi_pb2_grpc.ControllerStub(ch), csi_pb2_grpc.NodeStub(ch)
            vols = [
                ctl.CreateVolume(
                    csi_pb2.CreateVolumeRequest(name=n, volume_capabilities=[cap]), timeout=10
                ).volume.volume_id
                for n in ("a", "b")
            ]
            staging, target = str(work / "staging"), str(work / "target")

            def stage(vol: str) -> Any:
                req = csi_pb2.NodeStageVolumeRequest(
                    volume_id=vol, staging_target_path=staging, volume_capability=cap
                )
                return lambda: node.NodeStageVolume(req, timeout=10)

            def publish(vol: str, path: str = target) -> Any:
                req = csi_pb2.NodePublishVolumeRequest(
                    volume_id=vol, staging_target_path=staging, target_path=path,
                    volume_capability=cap,
                )  # fmt: skip
                return lambda: node.NodePublishVolume(req, timeout=10)

            unpublish = csi_pb2.NodeUnpublishVolumeRequest(volume_id=vols[0], target_path=target)
            out["publish_unstaged"] = _code(publish(vols[0]))
            out["stage_unknown"] = _code(stage("vol-nobody-made-this"))
            out["stage_escape"] = _code(stage("../data"))
            out["stage_a"] = _code(stage(vols[0]))
            out["stage_a_again"] = _code(stage(vols[0]))
            out["stage_b_same_path"] = _code(stage(vols[1]))
            out["publish_a"] = _code(publish(vols[0]))
            out["publish_a_again"] = _code(publish(vols[0]))
            out["delete_published"] = _code(
                lambda: ctl.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vols[0]))
            )
            out["block_create"] = _code(
                lambda: ctl.CreateVolume(
                    csi_pb2.CreateVolumeRequest(
                        name="blk",
                        volume_capabilities=[
                            csi_pb2.VolumeCapability(
                                block=csi_pb2.VolumeCapability.BlockVolume(),
                                access_mode=cap.access_mode,
                            )
                        ],
                    )
                )
            )
        out["mounts_published"] = mounts_under(work)
        plugin.stop()
        (work / "state.json").unlink()  # the restart that loses the state
        plugin.start()
        with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
            node = csi_pb2_grpc.NodeStub(ch)
            out["unpublish_forgotten"] = _code(lambda: node.NodeUnpublishVolume(unpublish))
        out["mounts_after_forgotten_unpublish"] = mounts_under(work)
    finally:
        plugin.stop()
    return out


def main() -> int:
    what, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "csi-sanity", str(work)], check=True)
    (work / "data").mkdir()
    result = sanity(work, sys.argv[3]) if what == "sanity" else behaviour(work)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
