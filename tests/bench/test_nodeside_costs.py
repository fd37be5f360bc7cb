"""bench/nodeside_costs.py: the run's CPU per process between two snapshots (real
processes, psutil) and the API requests per pod by client, verb and resource."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.nodeside_costs import CpuLedger, requests_per_pod
from tests.bench.audit_events import audit_event

WHO = {"controller": ("ctl/",), "agent": ("agent/",)}


def test_requests_per_pod_by_client_verb_and_resource_in_the_window() -> None:
    events = [
        audit_event(0.5, "ctl/1", "get", "pods"),  # before the window
        audit_event(1.0, "ctl/1", "patch", "remediations", sub="status"),
        audit_event(1.1, "ctl/1", "patch", "remediations", sub="status"),
        audit_event(1.2, "ctl/1", "create", "remediations"),
        audit_event(1.3, "agent/1", "get", "pods"),
        audit_event(1.4, "agent/1", "watch", "remediations"),  # watches are not counted
        audit_event(1.5, "kube-apiserver/v1.36", "get", "namespaces"),  # named by its User-Agent
        audit_event(9.0, "ctl/1", "delete", "pods"),  # after the window
    ]
    out = requests_per_pod(events, WHO, 1_800_000_001.0, 1_800_000_002.0, pods=2)
    assert out["per_pod"] == {
        "agent": {"get pods": 0.5},
        "controller": {"patch remediations/status": 1.0, "create remediations": 0.5},
        "kube-apiserver": {"get namespaces": 0.5},
    }
    assert out["per_pod_by_client"] == {"controller": 1.5, "agent": 0.5, "kube-apiserver": 0.5}
    assert out["per_pod_all"] == 2.5


def test_cpu_ledger_counts_each_named_process_and_the_machine() -> None:
    """A child that burns CPU between the snapshots (alive at both): counted in its parent's
    tree and among the parent's children, not in the parent alone; the machine's busy time
    covers it."""
    code = (
        "import sys, time\n"
        "sys.stdin.readline()\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print('burnt', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        ledger = CpuLedger(
            trees={"tree": os.getpid()},
            alone={"alone": os.getpid()},
            children={"children": (os.getpid(), frozenset())},
        )
        before = ledger.take()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "burnt"
        spent = CpuLedger.spent(before, ledger.take(), wall_s=1.0)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    cpu = spent["cpu_s"]
    assert cpu["children"] >= 0.29
    assert cpu["tree"] >= cpu["children"]
    assert cpu["alone"] < cpu["children"]
    assert spent["cpu_s_machine"] >= cpu["children"] - 0.05
    assert spent["cores"] >= 1
