"""The tour of docs/quickstart.md in the kind suite's cluster: a pod held by a finalizer
nobody removes, in a namespace that opted in, deleted -> `kubectl unstick status` lists
it as FinalizerBlocked and its Remediation says so; the finalizer removed as its owner
would -> the pod goes and `kubectl wait --for=condition=Resolved` on the record returns."""

from __future__ import annotations

import os

import pytest

from devcluster.process import wait_until

from .support import BIN, Kind, run

pytestmark = [pytest.mark.kind, pytest.mark.timeout(600)]

VENV_BIN = BIN.parent / ".venv" / "bin"
NS = "tour"


def plugin(kind: Kind, *args: str) -> str:
    """`kubectl unstick ...` through the real kubectl and the plugin, as a user runs it."""
    path = f"{BIN}:{VENV_BIN}:{os.environ.get('PATH', '')}"
    return run(["env", f"PATH={path}", f"KUBECONFIG={kind.kubeconfig}", "kubectl", "unstick",
                *args])  # fmt: skip


def test_the_quickstart_tour(kind: Kind, quick_policy: None, namespaces: list[str]) -> None:
    namespaces.append(NS)
    kind.kubectl("create", "namespace", NS)
    kind.kubectl("label", "namespace", NS, "unstick.dev/remediate=true")
    overrides = '{"metadata": {"finalizers": ["example.com/forgotten"]}}'
    kind.kubectl("-n", NS, "run", "stuck", f"--image={kind.images['busybox']['ref']}",
                 "--restart=Never", "--image-pull-policy=Never", f"--overrides={overrides}",
                 "--", "sleep", "3600")  # fmt: skip
    try:
        kind.kubectl("-n", NS, "wait", "--for=condition=Ready", "pod/stuck", "--timeout=120s")
        kind.kubectl("-n", NS, "delete", "pod", "stuck", "--wait=false")

        def diagnosed() -> bool:
            records = kind.remediations(NS)
            return any((r.get("status") or {}).get("cause") == "FinalizerBlocked" for r in records)

        wait_until(diagnosed, timeout=120, what="the Remediation saying FinalizerBlocked")
        status = plugin(kind, "status")
        assert "stuck" in status and "FinalizerBlocked" in status, status

        # `why` diagnoses afresh from the pod's deletionTimestamp now (the kubelet's final
        # delete moves it): it says stuck once that is past the slack too
        def why_stuck() -> str:
            out = plugin(kind, "why", "-n", NS, "stuck")
            return out if "cause: FinalizerBlocked" in out else ""

        why = wait_until(why_stuck, timeout=60, what="kubectl unstick why saying FinalizerBlocked")
        assert "example.com/forgotten" in why, why
    finally:
        kind.kubectl("-n", NS, "patch", "pod", "stuck", "--type=merge",
                     "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
    kind.kubectl("-n", NS, "wait", "rem", "--all", "--for=condition=Resolved", "--timeout=120s")
    (record,) = kind.remediations(NS)
    conditions = {c["type"]: c["status"] for c in record["status"]["conditions"]}
    assert conditions == {"Resolved": "True", "Stalled": "False"}
