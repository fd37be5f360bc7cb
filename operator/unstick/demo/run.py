"""`unstick demo`: a local control plane, a small cluster, the classic stuck terminations,
and unstick (controller + agent) diagnosing and fixing them — shown live."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from unstick.demo import cluster
from unstick.demo.scenarios import AGENT_NODE, GONE_NODE, NAMESPACE, SCENARIOS
from unstick.demo.table import Row, render
from unstick.devcluster import ControlPlane, ControlPlaneSettings, Kwok
from unstick.devcluster.process import Process, free_port


@dataclass(frozen=True)
class DemoSettings:
    interactive: bool
    timeout_s: float = 100.0
    summary_path: Path | None = None


class NodeProcess:
    """The demo node (mounts, CSI driver, agent, kubelet stand-in) in its own mount namespace."""

    def __init__(self, cfg: dict[str, Any], workdir: Path) -> None:
        cfg_path = workdir / "node.json"
        cfg_path.write_text(json.dumps(cfg))
        self.log = (workdir / "node.log").open("w")
        self.popen = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private",
             sys.executable, "-m", "unstick.demo.node", str(cfg_path)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True,
        )  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self.agent_metrics_port = int(cfg["agent_metrics_port"])
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                self.events.append(event)
                if event.get("event") == "ready":
                    self.ready.set()

    def finalised(self) -> set[str]:
        return {e["pod"] for e in self.events if e.get("event") == "finalised"}

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # anything it left behind
        self.popen.wait()
        self.log.close()


class History:
    """Every (cause, plan) each scenario pod went through, from a watch on the Remediations
    (a poll could miss a diagnosis the controller moved past within a second)."""

    def __init__(self, custom: Any) -> None:
        self.diagnoses: dict[str, list[tuple[str, str]]] = {}
        self._stopped = threading.Event()
        self._watch = watch.Watch()
        threading.Thread(target=self._run, args=(custom,), daemon=True).start()

    def _run(self, custom: Any) -> None:
        version = ""
        while not self._stopped.is_set():
            stream = self._watch.stream(
                custom.list_namespaced_custom_object, "unstick.dev", "v1alpha1", NAMESPACE,
                "remediations", resource_version=version, timeout_seconds=5,
            )  # fmt: skip
            try:
                for event in stream:
                    rem = event["object"]
                    version = rem["metadata"].get("resourceVersion", version)
                    self.record(rem["spec"].get("podName", ""), rem.get("status") or {})
            except Exception:  # the API server restarting or going away at the end
                if self._stopped.wait(0.5):
                    return
                version = ""  # relist: the version may be gone

    def record(self, pod: str, status: dict[str, Any]) -> None:
        cause = status.get("cause")
        if not cause or status.get("phase") == "WaitingForAgent":  # Unknown until the probe
            return
        plan = _plan_text([step["action"] for step in status.get("plan", [])])
        seen = self.diagnoses.setdefault(pod, [])
        if not seen or seen[-1][0] != cause:
            seen.append((cause, plan))
        elif plan and not seen[-1][1]:
            seen[-1] = (cause, plan)

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()


def _compact(items: list[str]) -> list[str]:
    """`[a, b, b, b]` as `[a, b x3]`."""
    groups = [(a, len(list(g))) for a, g in itertools.groupby(items)]
    return [a if n == 1 else f"{a} x{n}" for a, n in groups]


def _plan_text(actions: list[str]) -> str:
    return "→".join(_compact(actions))


def _rows(custom: Any, core: Any, node: NodeProcess, history: History) -> list[Row]:
    rems = custom.list_namespaced_custom_object(
        "unstick.dev", "v1alpha1", NAMESPACE, "remediations"
    )
    by_pod = {r["spec"]["podName"]: r for r in rems["items"]}
    present = {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
    finalised = node.finalised()
    rows = []
    for sc in SCENARIOS:
        status = by_pod.get(sc.pod, {}).get("status", {})
        history.record(sc.pod, status)
        done = [
            f"{a['action']} {'✓' if a.get('result') == 'succeeded' else a.get('result', '')}"
            for a in status.get("actions", [])
        ]
        if f"{NAMESPACE}/{sc.pod}" in finalised:
            done.append("kubelet stand-in finalised ✓")
        done = _compact(done)
        rows.append(
            Row(
                scenario=sc,
                diagnoses=tuple(history.diagnoses.get(sc.pod, ())),
                phase=status.get("phase", ""),
                actions=" → ".join(done),
                pod_gone=sc.pod not in present,
            )
        )
    return rows


def _metrics(port: int, prefix: str = "unstick_") -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError as e:
        return [f"(metrics not reachable: {e})"]
    return [
        line
        for line in text.splitlines()
        if line.startswith(prefix) and not line.split("{")[0].endswith(("_created", "_bucket"))
    ]


def _show(text: str, interactive: bool, last: list[str]) -> None:
    if interactive:
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
        sys.stdout.flush()
    elif text.split("\n", 1)[1] != (last[0].split("\n", 1)[1] if last else ""):
        print(text + "\n", flush=True)
    last[:] = [text]


def run(settings: DemoSettings) -> int:
    if os.geteuid() != 0:
        print(
            "unstick demo needs root: its storage node makes real mounts in a private mount "
            "namespace (unshare -m). Run it with sudo.",
            file=sys.stderr,
        )
        return 2
    print("starting a local control plane (etcd + kube-apiserver) and kwok nodes…", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="unstick-demo-"))
    cp = ControlPlane(ControlPlaneSettings(workdir=workdir / "cp", audit=False))
    stack = contextlib.ExitStack()
    rows: list[Row] = []
    # The work dir (logs) stays only when an outcome was missed; removed after everything stopped.
    stack.callback(lambda: _remove_if(bool(rows) and all(r.done for r in rows), workdir))
    try:
        stack.callback(cp.stop)
        core, custom, uids = _start_cluster(cp, stack)
        print("setting up the storage node's mounts, CSI driver and agent…", flush=True)
        node = NodeProcess(
            {
                "work": str(workdir / "node"),
                "kubeconfig": str(cp.kubeconfig),
                "node": AGENT_NODE,
                "csi_pod_uid": uids["db-0"],
                "busy_pod_uid": uids["uploader"],
                "pv": cluster.PV,
                "handle": cluster.HANDLE,
                "agent_metrics_port": free_port(),
            },
            workdir,
        )
        stack.callback(node.stop)
        if not node.ready.wait(60):
            raise RuntimeError(f"the demo node did not come up; see {workdir / 'node.log'}")

        metrics_port = free_port()
        controller = Process(
            "unstick controller",
            [sys.executable, "-m", "unstick", "controller", f"--kubeconfig={cp.kubeconfig}",
             "--standalone", f"--metrics-port={metrics_port}", "--health-port=0"],
            workdir / "controller.log",
        ).start()  # fmt: skip
        stack.callback(controller.stop)

        history = History(custom)  # before the deletes: no diagnosis goes unseen
        stack.callback(history.stop)
        for sc in SCENARIOS:
            core.delete_namespaced_pod(sc.pod, NAMESPACE)
        core.delete_node(GONE_NODE)
        cluster.block_replacement(core, client.StorageV1Api(core.api_client))
        print(
            "deleted the scenario pods and node-vanished; unstick takes over.\n"
            "(No real kubelet runs here: a stand-in finalises a pod on node-storage once "
            "nothing of it is left on the node, as the kubelet would.)\n",
            flush=True,
        )
        start = time.monotonic()
        last: list[str] = []
        while True:
            rows = _rows(custom, core, node, history)
            _show(render(rows, time.monotonic() - start), settings.interactive, last)
            if all(r.done for r in rows) or time.monotonic() - start > settings.timeout_s:
                break
            if not controller.alive():
                raise RuntimeError(f"the controller exited:\n{controller.log_tail()}")
            time.sleep(0.5)

        print("\nmetrics (controller /metrics):")
        print("\n".join("  " + line for line in _metrics(metrics_port)))
        print("\naftermath (docs/aftermath.md):")
        print("\n".join("  " + line for line in _aftermath(core, node)))
        ok = all(r.done for r in rows)
        if ok:
            print("\nall outcomes as expected.")
        else:
            print(f"\nsome outcomes not reached in {settings.timeout_s:.0f}s; logs in {workdir}")
        return 0 if ok else 1
    finally:
        if settings.summary_path is not None:
            settings.summary_path.write_text(json.dumps(_summary(rows), indent=2))
        stack.close()
        print("stopped everything: no processes or mounts left behind.", flush=True)


def _aftermath(core: Any, node: NodeProcess) -> list[str]:
    """What the stuck pods block and leave behind: the Event on the blocked replacement,
    the agent's orphaned-pod-dir gauge and its Event on the Node."""
    lines = []
    for reason, ns in (("BlockedReplacement", NAMESPACE), ("OrphanedPodDirs", "default")):
        deadline = time.monotonic() + 40
        events: list[Any] = []
        while not events and time.monotonic() < deadline:
            events = core.list_namespaced_event(ns, field_selector=f"reason={reason}").items
            if not events:
                time.sleep(0.5)
        events.sort(key=lambda e: int(e.metadata.resource_version or 0))
        for ev in events[-1:]:
            who = f"{ev.involved_object.kind} {ev.involved_object.name}"
            lines.append(f"{reason} on {who}: {ev.message}")
        if not events:
            lines.append(f"{reason}: no Event yet")
    lines += _metrics(node.agent_metrics_port, "unstick_node_orphaned_pod_dirs")
    return lines


def _remove_if(condition: bool, path: Path) -> None:
    if condition:
        shutil.rmtree(path, ignore_errors=True)


def _start_cluster(
    cp: ControlPlane, stack: contextlib.ExitStack
) -> tuple[Any, Any, dict[str, str]]:
    cp.start()
    stack.enter_context(Kwok(cp))
    api = cp.api_client()
    stack.callback(api.close)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    cp.install_crds()
    custom.create_cluster_custom_object(
        "unstick.dev", "v1alpha1", "remediationpolicies", cluster.policy()
    )
    cluster.create_nodes(core, client.StorageV1Api(api))
    uids = cluster.create_workload(core)
    print(f"cluster ready: kubectl --kubeconfig {cp.kubeconfig} get pods -A", flush=True)
    return core, custom, uids


def _summary(rows: list[Row]) -> dict[str, Any]:
    return {
        row.scenario.pod: {
            "expected_cause": row.scenario.cause,
            "causes": list(row.causes),
            "plans": [plan for _, plan in row.diagnoses],
            "expected": row.scenario.expectation,
            "pod_gone": row.pod_gone,
            "phase": row.phase,
            "actions": row.actions,
            "done": row.done,
        }
        for row in rows
    }
