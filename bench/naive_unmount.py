"""The node-side benchmark's naive peer: what an on-call script does about pods stuck in
Terminating with orphaned mounts, run on the node (in its mount namespace) instead of
unstick's agent and controller (`python -m bench.naive_unmount CFG.json`).

Every `interval_s`: list the node's pods (`spec.nodeName` field selector); for each pod
past `deletionTimestamp + slack` (the same eligibility as unstick's), one after the other:

1. `umount -l` every mount under `<kubeletRoot>/pods/<uid>/`, deepest first (one
   `umount` process per mount, as a shell loop over `/proc/self/mountinfo` would);
2. `rmdir` what is left under its `volumes/` and `volume-subpaths/`, deepest first
   (non-empty dirs stay: `find -depth -type d -exec rmdir`);
3. force-delete it (DELETE with grace 0, as `kubectl delete --force --grace-period=0`;
   through the Python client here, which is cheaper than a kubectl process per pod).

No safety check at all: no holder scan, no container check, no CSI call (the volume's
staging mount and the kubelet's `vol_data.json` are left behind), lazy unmounts whoever
uses the mount. Prints `{"event": "finalised", "pod": "ns/name"}` per pod it deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from unstick.core.model.kubelet_paths import pod_dir
from unstick.core.model.mountinfo import parse_mountinfo

NAIVE_UA = "unstick-bench-naive-unmount/1"


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [m.mount_point for m in parse_mountinfo(f.read())]


def clean(root: str, uid: str) -> None:
    """Steps 1 and 2 for one pod."""
    base = pod_dir(root, uid)
    points = [p for p in _mount_points() if p.startswith(base + "/")]
    for point in sorted(points, key=lambda p: -p.count("/")):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    for sub in ("volumes", "volume-subpaths"):
        top = Path(base) / sub
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in os.walk(top, topdown=False):
            if dirpath != str(top):
                with contextlib.suppress(OSError):  # not empty: left as it is
                    Path(dirpath).rmdir()


def main() -> int:
    cfg: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    api = config.new_client_from_config(config_file=cfg["kubeconfig"])  # type: ignore[no-untyped-call]
    api.user_agent = NAIVE_UA
    core = client.CoreV1Api(api)
    stopping = False

    def on_term(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    done: set[str] = set()
    while not stopping:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={cfg['node']}")
        now = time.time()
        for pod in pods.items:
            meta: Any = pod.metadata
            dts = meta.deletion_timestamp
            if dts is None or meta.uid in done or now <= dts.timestamp() + cfg["slack_s"]:
                continue
            clean(cfg["root"], meta.uid)
            try:
                core.delete_namespaced_pod(meta.name, meta.namespace, grace_period_seconds=0)
            except client.ApiException as e:
                if e.status != 404:
                    raise
            done.add(meta.uid)
            print(json.dumps({"event": "finalised", "pod": f"{meta.namespace}/{meta.name}",
                              "uid": meta.uid, "by": "naive"}), flush=True)  # fmt: skip
        time.sleep(float(cfg["interval_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
