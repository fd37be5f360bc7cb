"""`unstick demo`: a local control plane, a small cluster, the classic stuck terminations,
and unstick (controller + agent) diagnosing and fixing them — shown live."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from devcluster.demo import cluster
from devcluster.demo.backend import Backend
from devcluster.demo.scenarios import GONE_NODE, NAMESPACE
from devcluster.demo.table import Row, render
from unstick.core.remediation import (
    GROUP,
    INTENTS,
    NODE_STEPS_REQUESTED_AT,
    PLURAL,
    VERSION,
    node_results,
    steps_answered,
)

NODE_CHOICES = ("auto", "real", "stand-in")


@dataclass(frozen=True)
class DemoSettings:
    interactive: bool
    timeout_s: float = 100.0
    summary_path: Path | None = None
    node: str = "auto"  # NODE_CHOICES: the real node if this machine can run it, ...


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
                custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL,
                resource_version=version, timeout_seconds=5,
            )  # fmt: skip
            try:
                for event in stream:
                    rem = event["object"]
                    version = rem["metadata"].get("resourceVersion", version)
                    for pod, status in per_pod(rem):
                        self.record(pod, status)
            except Exception:  # the API server restarting or going away at the end
                if self._stopped.wait(0.5):
                    return
                version = ""  # relist: the version may be gone

    def record(self, pod: str, status: dict[str, Any]) -> None:
        cause = status.get("cause")
        if not cause or status.get("phase") == "WaitingForAgent":  # Unknown until the probe
            return
        steps = status.get("plan") or []
        agents = status.get("nodePlan") or {}  # the round trip: the agent planned the steps
        if not steps and agents.get("cause") == cause:
            steps = agents.get("steps") or []
        plan = _plan_text([step["action"] for step in steps])
        seen = self.diagnoses.setdefault(pod, [])
        if not seen or seen[-1][0] != cause:
            seen.append((cause, plan))
        elif plan and not seen[-1][1]:
            seen[-1] = (cause, plan)

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()


def per_pod(rem: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(pod name, its status) of a Remediation: a pod's own, or each pod of a node incident
    (one Remediation for the pods one node-level fact holds: `spec.incident` is the cause,
    `status.pods` what was done to each, docs/incidents.md)."""
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    if spec.get("podName"):
        return [(spec["podName"], status)]
    if not spec.get("incident"):
        return []
    return [
        (
            entry["name"],
            {
                "cause": spec["incident"],
                "phase": status.get("phase", ""),
                "plan": [{"action": entry["action"]}] if entry.get("action") else [],
                "actions": [entry] if entry.get("result") else [],
            },
        )
        for entry in status.get("pods") or []
        if entry.get("name")
    ]


def answer_recorded(rem: dict[str, Any]) -> bool:
    """The agent's answer to the pod's latest node steps (when it was asked any) is on the
    record and recorded by the controller: answered (`status.nodeStepsDoneAt` at or after
    the request) and each `status.nodeActions` entry (with its plan step's target) in
    `status.actions`. The kubelet may
    remove the pod right after the agent's unmount, before the agent writes its answer:
    the controller marks the record Resolved first and records the late answer when it
    lands (controller/records/pod_record.py), so a read in between sees the pod gone and
    none of the agent's actions. A node incident asks no agent anything."""
    spec, status = rem.get("spec") or {}, rem.get("status") or {}
    if spec.get(NODE_STEPS_REQUESTED_AT) and not steps_answered(spec, status):
        return False

    def entries(items: list[Any]) -> set[tuple[Any, Any, Any]]:
        return {(a.get("action"), a.get("target"), a.get("result")) for a in items}

    # a mandate's results name the plan's step, not its target (node_results reads it)
    return entries(node_results(status)) <= entries(status.get("actions") or [])


def _compact(items: list[str]) -> list[str]:
    """`[a, b, b, b]` as `[a, b x3]`."""
    groups = [(a, len(list(g))) for a, g in itertools.groupby(items)]
    return [a if n == 1 else f"{a} x{n}" for a, n in groups]


def _plan_text(actions: list[str]) -> str:
    return "→".join(_compact(actions))


def _rows(custom: Any, core: Any, backend: Backend, history: History) -> list[Row]:
    rems = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
    by_pod = {pod: status for r in rems["items"] for pod, status in per_pod(r)}
    unanswered = {pod for r in rems["items"] if not answer_recorded(r) for pod, _ in per_pod(r)}
    present = {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
    finalised = backend.finalised()
    rows = []
    for sc in backend.scenarios:
        status = by_pod.get(sc.pod, {})
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
                kubelet=backend.kubelet_view(sc.pod),
                pending=sc.pod in unanswered
                or any(a.get("result") in INTENTS for a in status.get("actions", [])),
            )
        )
    return rows


def _show(text: str, interactive: bool, last: list[str]) -> None:
    if interactive:
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
        sys.stdout.flush()
    elif text.split("\n", 1)[1] != (last[0].split("\n", 1)[1] if last else ""):
        print(text + "\n", flush=True)
    last[:] = [text]


def choose(settings: DemoSettings) -> tuple[str, str]:
    """("real" or "stand-in", why): the real node when asked for or when this machine can
    run one and no other node runs; else the stand-in, with the reason."""
    from devcluster.demo.real import NODE, chart_dir
    from devcluster.node_check import lock_free, node_unavailable

    if settings.node == "stand-in":
        return "stand-in", "asked for with --node stand-in"
    reason = node_unavailable()
    if reason is None and not chart_dir().is_dir():
        reason = f"the chart is not at {chart_dir()}"
    if reason is not None:
        return "stand-in", f"no real node here: {reason}"
    if settings.node == "auto" and not lock_free(NODE):
        return "stand-in", f"another real node {NODE} runs on this machine (a test session?)"
    return "real", "this machine can run one"


def _backend(mode: str, workdir: Path) -> Backend:
    if mode == "real":
        from devcluster.demo.real import RealNodeDemo
        from devcluster.node_images import load_images

        return RealNodeDemo(workdir, load_images())
    from devcluster.demo.standin import StandIn

    return StandIn(workdir)


def run(settings: DemoSettings) -> int:
    if os.geteuid() != 0:
        print(
            "unstick demo needs root: its node makes real mounts in its own mount namespace "
            "(a real node: kubelet + containerd; or the stand-in: unshare -m). Run it with sudo.",
            file=sys.stderr,
        )
        return 2
    mode, why = choose(settings)
    if mode == "stand-in" and settings.node == "real":
        print(f"unstick demo --node real: {why}", file=sys.stderr)
        return 2
    if mode == "real":
        print(f"unstick demo on a REAL NODE (kubelet + containerd): {why}.", flush=True)
    else:
        print(f"unstick demo with a KUBELET STAND-IN ({why}).", flush=True)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="unstick-demo-"))
    stack = contextlib.ExitStack()
    rows: list[Row] = []
    # The work dir (logs) stays only when an outcome was missed; removed after everything stopped.
    stack.callback(lambda: _remove_if(bool(rows) and all(r.done for r in rows), workdir))
    try:
        backend = _backend(mode, workdir)
        rows = _play(backend, stack, settings)
        ok = all(r.done for r in rows)
        if ok:
            print("\nall outcomes as expected.")
        else:
            print(f"\nsome outcomes not reached in {settings.timeout_s:.0f}s; logs in {workdir}")
        return 0 if ok else 1
    finally:
        if settings.summary_path is not None:
            settings.summary_path.write_text(json.dumps(_summary(rows, mode), indent=2))
        stack.close()
        print(
            f"stopped everything: no processes or mounts left behind "
            f"({mode}, {time.monotonic() - started:.0f}s in all).",
            flush=True,
        )


def _play(backend: Backend, stack: contextlib.ExitStack, settings: DemoSettings) -> list[Row]:
    """Start, break the scenarios, show the table until every outcome is reached."""
    cl = backend.start(stack)
    core, custom = cl.core, cl.custom
    history = History(custom)  # before the deletes: no diagnosis goes unseen
    stack.callback(history.stop)
    for sc in backend.scenarios:
        core.delete_namespaced_pod(sc.pod, NAMESPACE)
    core.delete_node(GONE_NODE)
    agent_node = next(sc.node for sc in backend.scenarios if sc.pod == "db-0")
    cluster.block_replacement(core, client.StorageV1Api(core.api_client), agent_node)
    print(
        f"deleted the scenario pods and {GONE_NODE}; unstick takes over.\n{backend.banner}\n",
        flush=True,
    )
    start = time.monotonic()
    last: list[str] = []
    while True:
        rows = _rows(custom, core, backend, history)
        _show(render(rows, time.monotonic() - start), settings.interactive, last)
        if all(r.done for r in rows) or time.monotonic() - start > settings.timeout_s:
            break
        backend.check()
        time.sleep(0.5)
    if all(r.done for r in rows):
        rows = _settled_rows(custom, core, backend, history, agent_node)
        _show(render(rows, time.monotonic() - start), settings.interactive, last)
    print("\nmetrics (controller /metrics):")
    print("\n".join("  " + line for line in backend.controller_metrics()))
    print("\naftermath (docs/aftermath.md):")
    print("\n".join("  " + line for line in _aftermath(core, backend, agent_node)))
    return rows


def _settled_rows(
    custom: Any, core: Any, backend: Backend, history: History, agent_node: str
) -> list[Row]:
    """The rows once the records of the fixed pods are final and the backend has all it
    shows (at most 20 s): the pod's own record marked Resolved after the pod went (the
    agent's answer is recorded already: `Row.done` waits for it, answer_recorded); a node
    incident's record is written after its force-deletes."""
    fixed = {sc.pod: sc.node == agent_node for sc in backend.scenarios if sc.fixed}

    def complete() -> bool:
        rems = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
        seen = {pod: status for r in rems for pod, status in per_pod(r)}
        status = {pod: seen.get(pod, {}) for pod in fixed}
        return all(
            status[pod].get("phase") == "Resolved" if here else status[pod].get("actions")
            for pod, here in fixed.items()
        )

    deadline = time.monotonic() + 20
    while not (complete() and backend.settled()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return _rows(custom, core, backend, history)


def _aftermath(core: Any, backend: Backend, agent_node: str) -> list[str]:
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
    lines += backend.agent_metrics("unstick_node_orphaned_pod_dirs")
    return lines


def _remove_if(condition: bool, path: Path) -> None:
    if condition:
        shutil.rmtree(path, ignore_errors=True)


def _summary(rows: list[Row], mode: str) -> dict[str, Any]:
    return {"node": mode, "scenarios": _scenario_summary(rows)}


def _scenario_summary(rows: list[Row]) -> dict[str, Any]:
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
            "kubelet": row.kubelet,
        }
        for row in rows
    }
