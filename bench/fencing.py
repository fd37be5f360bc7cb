"""The whole fencing chain, measured (issue #32, design.md §10, docs/fencing.md "Measured"):
a worker of the kind suite's cluster hard-powered-off (`podman stop --time 0`) with a
StatefulSet's pod on it that holds a ReadWriteOnce volume of the upstream CSI hostpath
driver (attachRequired), and the timeline from the power-off to the replacement Ready on
the other worker — once for Kubernetes alone (unstick only observes: the default policy,
no taint action, cloudShutdown not trusted), once with unstick trusting `cloudShutdown`
(the real cloud-node-lifecycle controller of k8s.io/cloud-provider beside the cluster,
tests/machines/kind/cloud.py) and permitted `taint-out-of-service`. After each, the worker
started again: Ready, taints off, schedulable. One cluster, one run, each wait capped.

The cluster, the cloud controller manager, the policy and RBAC patches are the kind
suite's own (tests/machines/kind: imported, not copied). The CSI driver: the upstream
hostpath plugin with the controller sidecars on the surviving worker, and a node-only
plugin on the worker that is powered off, both with one CSI node ID and the volume's
state copied to the second, so that the control plane may attach the volume to either
worker (as a cloud's disk) and the replacement can mount it on the other. The data does
not follow (hostpath is node-local): what is measured is the control plane's detach and
attach and the kubelet's mount, not a database's recovery.

Writes bench/results/<date>-fencing-<commit>.json; prints it. Needs root, podman and the
kind suite's tools and images (`make tools images`). Takes ~15 min (10 of them waiting
for Kubernetes alone). unstick's part runs first: a failure there costs no 10 min wait.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.fencing_timeline import DOWN, UP, Subject, Timeline, down_facts, follow, up_facts
from bench.run import RESULTS, git_commit, machine
from devcluster.csi_upstream import (
    DRIVER,
    RUNNER_RULES,
    SERVICE_ACCOUNT,
    SIDECARS,
    STATEFULSET,
    STORAGE_CLASS,
)
from devcluster.csi_upstream import NAMESPACE as CSI_NAMESPACE
from devcluster.csi_upstream_objects import driver_objects, plugin_statefulset
from devcluster.process import wait_until
from tests.machines.kind import cloud, csi, test_fencing
from tests.machines.kind.support import Kind, kind_cluster, podman

CAP_S = 600.0  # each wait: 10 min
NS = "bench-fencing"
NODE_ID = "kind-workers"  # the CSI node ID of both plugins


def say(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def fixture(fn: Any, kind: Kind) -> contextlib.AbstractContextManager[None]:
    """A fixture of the kind suite (a generator function under pytest's decorator) as a
    context manager."""
    cm: contextlib.AbstractContextManager[None] = contextlib.contextmanager(fn.__wrapped__)(kind)
    return cm


def _plugin(kind: Kind, name: str, node: str, controller: bool) -> dict[str, Any]:
    plugin = plugin_statefulset(
        name=name, namespace=CSI_NAMESPACE, service_account=SERVICE_ACCOUNT, driver=DRIVER,
        plugin_image=kind.images[csi.PLUGIN_IMAGES[0]]["ref"],
        sidecars_image=kind.images[SIDECARS]["ref"], node=node,
        kubelet_root=csi.KUBELET_ROOT, data_dir=csi.DATA_DIR,
    )  # fmt: skip
    spec = plugin["spec"]["template"]["spec"]
    keep = {"hostpath", "node-driver-registrar"} | ({"csi-provisioner", "csi-attacher"}
                                                    if controller else set())  # fmt: skip
    spec["containers"] = [c for c in spec["containers"] if c["name"] in keep]
    for c in spec["containers"]:
        c["args"] = [
            f"--nodeid={NODE_ID}" if a.startswith("--nodeid=")
            else "--feature-gates=Topology=false" if a.startswith("--feature-gates=")
            else a
            for a in c["args"]
        ]  # fmt: skip
    return plugin


def registered(kind: Kind, node: str) -> bool:
    drivers = (kind.get("csinode", node).get("spec") or {}).get("drivers") or []
    return any(d.get("name") == DRIVER for d in drivers)


def start_db(kind: Kind, node: str, other: str) -> tuple[str, str]:
    """The driver (controller on `other`, node plugins on both), the claim provisioned and
    its state copied to `node`, `db-0` Ready on `node`; (db-0's uid, the PV)."""
    kind.wait_loaded("csi")
    kind.apply(*(body for _, body in driver_objects(
        CSI_NAMESPACE, SERVICE_ACCOUNT, RUNNER_RULES, DRIVER, STORAGE_CLASS)))  # fmt: skip
    kind.apply(_plugin(kind, STATEFULSET, other, controller=True))
    wait_until(lambda: registered(kind, other), timeout=300, what=f"the driver on {other}")
    kind.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    claim = csi.statefulset(kind, NS)["spec"]["volumeClaimTemplates"][0]
    claim = {**claim, "apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "data-db-0", "namespace": NS}}  # fmt: skip
    kind.apply(claim)
    pv: str = wait_until(
        lambda: kind.get("pvc", "data-db-0", "-n", NS)["spec"].get("volumeName"),
        timeout=120,
        what="the claim bound",
    )
    with tempfile.TemporaryDirectory() as tmp:  # the plugin's state and volume dir
        podman("cp", f"{other}:{csi.DATA_DIR}/.", tmp)
        podman("exec", node, "mkdir", "-p", csi.DATA_DIR)
        podman("cp", f"{tmp}/.", f"{node}:{csi.DATA_DIR}")
    kind.apply(_plugin(kind, f"{STATEFULSET}-node", node, controller=False))
    wait_until(lambda: registered(kind, node), timeout=300, what=f"the driver on {node}")
    uid = db_on(kind, node, other, lambda: kind.apply(csi.statefulset(kind, NS)))
    wait_until(lambda: csi.attached_to(kind, pv) == [node], timeout=120, what=f"{pv} attached")
    return uid, pv


def db_on(kind: Kind, node: str, other: str, make: Callable[[], object]) -> str:
    """`make()` (db-0 made, or deleted for the StatefulSet to make again) with `other`
    cordoned, so that db-0 lands on `node`; once Ready there, its uid."""
    kind.kubectl("cordon", other)
    try:
        make()
        wait_until(lambda: kind.pods(NS), timeout=120, what="db-0")
        kind.kubectl("wait", "--for=condition=Ready", "pod/db-0", "-n", NS, "--timeout=300s")
    finally:
        kind.kubectl("uncordon", other)
    pod = kind.get("pod", "db-0", "-n", NS)
    if pod["spec"]["nodeName"] != node:
        raise RuntimeError(f"db-0 on {pod['spec']['nodeName']}, not {node}")
    uid: str = pod["metadata"]["uid"]
    return uid


def move_db(kind: Kind, node: str, other: str) -> str:
    """db-0 back on `node` (deleted gracefully, made again there); its new uid."""
    delete = ["delete", "pod", "db-0", "-n", NS, "--timeout=300s"]
    return db_on(kind, node, other, lambda: kind.kubectl(*delete))


def reader(kind: Kind) -> Callable[[], list[Mapping[str, Any]]]:
    def read() -> list[Mapping[str, Any]]:
        time.sleep(0.3)  # (with the kubectl call: a read every ~0.4 s on this machine)
        out = kind.kubectl("get", "-n", NS, "pods,volumeattachments,nodes", "-o", "json")
        items: list[Mapping[str, Any]] = json.loads(out)["items"]
        return items

    return read


def load1() -> float:
    return os.getloadavg()[0]


def phase(kind: Kind, subject: Subject, other: str) -> dict[str, Any]:
    """Power-off → replacement Ready, then power-on → schedulable: both timelines."""
    read = reader(kind)
    out: dict[str, Any] = {"node": subject.node, "other": other}
    start = time.monotonic()
    out["load_1min_at_power_off"] = round(load1(), 2)
    podman("stop", "--time", "0", subject.node)
    out["podman_stop_s"] = round(time.monotonic() - start, 1)
    down = follow(read, lambda items: down_facts(items, subject), Timeline.of(DOWN),
                  last="ready", cap_s=CAP_S, clock=lambda: time.monotonic() - start,
                  load=load1)  # fmt: skip
    out["down"] = down.report(CAP_S)
    out["down_reads"] = down.reads
    out["down_waited_s"] = round(time.monotonic() - start, 1)
    say(f"down: {json.dumps(out['down'])}")
    back = time.monotonic()
    out["load_1min_at_power_on"] = round(load1(), 2)
    podman("start", subject.node)
    up = follow(read, lambda items: up_facts(items, subject), Timeline.of(UP),
                last="schedulable", cap_s=CAP_S, clock=lambda: time.monotonic() - back,
                load=load1)  # fmt: skip
    out["up"] = up.report(CAP_S)
    out["up_reads"] = up.reads
    say(f"up: {json.dumps(out['up'])}")
    if not down.done("ready"):  # the rest of the chain once the worker is back
        steps = DOWN[DOWN.index("old_pod_deleting") :]  # (the node's steps are over)
        rest = follow(read, lambda items: down_facts(items, subject), Timeline.of(steps),
                      last="ready", cap_s=CAP_S, clock=lambda: time.monotonic() - back,
                      load=load1)  # fmt: skip
        out["down_after_power_on"] = rest.report(CAP_S)
        say(f"after power-on: {json.dumps(out['down_after_power_on'])}")
    wait_until(lambda: test_fencing.unstick_back(kind), timeout=300, what="unstick back")
    return out


def with_unstick(kind: Kind, subject: Subject, other: str) -> Any:
    with (
        fixture(test_fencing.cloud_proof, kind),
        fixture(test_fencing.taint_actions, kind),
    ):
        result = phase(kind, subject, other)
    selector = f"unstick.dev/incident=nodeoutofservice,unstick.dev/node={subject.node}"
    records = kind.get("remediations", "-n", "unstick", "-l", selector)["items"]
    result["record"] = [
        {
            "phase": r["status"].get("phase"),
            "actions": [
                {k: a.get(k) for k in ("action", "result", "time", "message")}
                for a in r["status"].get("actions", [])
            ],
        }
        for r in records
    ]
    return result


@contextlib.contextmanager
def cluster() -> Iterator[Kind]:
    with kind_cluster() as kind:
        missing = cloud.unavailable() or csi.unavailable(kind)
        if missing:
            raise RuntimeError(missing)
        yield kind


def run(out_dir: Path) -> dict[str, Any]:
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "benchmark": "fencing",
        "started": started.isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine(),
        "cap_s": CAP_S,
    }
    path = out_dir / f"{started:%Y-%m-%d}-fencing-{result['commit']}.json"
    try:
        with cluster() as kind:
            node = kind.worker_without_controller()
            other = next(w for w in kind.workers() if w != node)
            # the CSI images on both workers (the suite loads them on `node` only)
            for image in csi.PLUGIN_IMAGES:
                kind.start_load("csi", image, other)
            say(f"cluster {kind.name}: powering off {node}, replacement on {other}")
            uid, pv = start_db(kind, node, other)
            with cloud.cloud_controller_manager(kind):
                say("unstick, cloudShutdown trusted, taint-out-of-service permitted")
                result["unstick_cloud_shutdown"] = with_unstick(kind, Subject(node, pv, uid), other)
                say("Kubernetes alone (unstick's default policy: observe only)")
                uid = move_db(kind, node, other)
                result["kubernetes_alone"] = phase(kind, Subject(node, pv, uid), other)
            result["pods_at_end"] = [
                (p["metadata"]["name"], p["spec"].get("nodeName")) for p in kind.pods(NS)
            ]
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        result["load_1min_at_end"] = round(load1(), 2)
        result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        say(f"wrote {path}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fencing", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the cluster deleted
    print(json.dumps(run(args.out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
