"""The chart's alerts evaluated by a real Prometheus on what the controller and the agent
really export: healthy → nothing; a stuck pod not opted in → UnstickPodStuck pending, then
firing; a failing action → UnstickRemediationsFailing; a forged Remediation →
UnstickRequestsRefused. Then every dashboard panel's PromQL against the same Prometheus.

The tests of this module share one Prometheus and run in file order: the healthy check
first, while nothing is stuck."""

from __future__ import annotations

import math
import time
import uuid
from datetime import datetime
from typing import Any

import pytest

from devcluster.process import wait_until
from devcluster.prometheus import PrometheusError
from tests.prometheus.conftest import Stack
from tests.support.controller import agent_probe, node_ready, utc_now, write_as_agent
from tests.support.remediations import remediation

pytestmark = [pytest.mark.prometheus, pytest.mark.envtest]

HOLD = "example.com/hold"  # keeps a test pod Terminating on a node without a kubelet


def _unstick_alerts(stack: Stack, state: str | None = None) -> list[dict[str, Any]]:
    return [
        a
        for a in stack.prometheus.alerts()
        if a["labels"]["alertname"].startswith("Unstick") and state in (None, a["state"])
    ]


def _alert_when(stack: Stack, name: str, state: str, **labels: str) -> dict[str, Any]:
    """Wait until the unstick alert `name` with these labels is in `state`; that alert."""
    found: dict[str, Any] = wait_until(
        lambda: _alert(stack, name, state, **labels), timeout=60, what=f"{name} {state}"
    )
    return found


def _alert(stack: Stack, name: str, state: str, **labels: str) -> dict[str, Any] | None:
    for a in _unstick_alerts(stack, state):
        if a["labels"]["alertname"] == name and all(
            a["labels"].get(k) == v for k, v in labels.items()
        ):
            return a
    return None


def _evaluations_after(stack: Stack, since: float) -> bool:
    """Every rule group has been evaluated after `since` (Unix time)."""
    groups = stack.prometheus.api("rules")["groups"]
    return bool(groups) and all(
        datetime.fromisoformat(g["lastEvaluation"].replace("Z", "+00:00")).timestamp() > since
        for g in groups
    )


def test_healthy_no_unstick_alert_fires(stack: Stack) -> None:
    """Both targets up, the chart's rules loaded verbatim, nothing stuck: after the rules
    have been evaluated for longer than their (test) `for:` durations, no unstick alert is
    pending or firing — in particular the agent alerts, which name the agent job as the
    chart's ServiceMonitor does."""
    loaded = {r["name"] for r in stack.prometheus.rules()}
    shipped = {r["alert"] for g in stack.chart.rule_groups for r in g["rules"]}
    assert shipped <= loaded and "UnstickRequestsRefused" in shipped
    since = time.time() + 6  # longer than every test `for:` (4 s)
    wait_until(
        lambda: _evaluations_after(stack, since), timeout=60, what="rule evaluations after 6 s"
    )
    assert _unstick_alerts(stack) == []
    assert stack.prometheus.query("up == 0") == []


def test_stuck_pod_not_opted_in_goes_pending_then_firing(stack: Stack, namespace: str) -> None:
    node = f"gone-{uuid.uuid4().hex[:6]}"  # no Node object: the pod's node is gone
    pod = stack.objects.pod(namespace, node, finalizers=[HOLD])
    stack.objects.core.delete_namespaced_pod(pod["name"], namespace)
    pending = _alert_when(stack, "UnstickPodStuck", "pending", namespace=namespace)
    firing = _alert_when(stack, "UnstickPodStuck", "firing", namespace=namespace)
    assert pending["labels"]["cause"] == firing["labels"]["cause"]
    assert firing["annotations"]["runbook_url"].endswith("#unstickpodstuck")
    assert stack.controller.sample("unstick_stuck_pods", namespace=namespace,
                                   cause=firing["labels"]["cause"]) == 1  # fmt: skip


def test_failing_action_fires_the_failure_alert(stack: Stack, namespace: str) -> None:
    """The test plays the node's agent (a node without one): it answers the probe request
    with a stale volume dir, and reports the rmdir-stale the controller asks for as failed.
    The controller's first failure creates the counter's series already at 1."""
    objects = stack.objects
    node = f"fail-{uuid.uuid4().hex[:6]}"
    objects.core.create_node({"metadata": {"name": node}})
    try:
        node_ready(objects, node)
        pod = objects.stuck_pod(namespace, node, remediate="true", finalizers=[HOLD])
        rem = objects.remediation_when(
            namespace, pod, spec_has="probeRequestedAt", timeout=60, what="a probe request"
        )
        stale = f"/var/lib/kubelet/pods/{pod['uid']}/volumes/kubernetes.io~empty-dir/cache"
        probe = agent_probe(node, [{"path": stale, "empty": True}], pod["uid"])
        write_as_agent(objects, namespace, rem, {"probe": probe})
        rem = objects.remediation_when(
            namespace, pod, spec_has="nodeSteps", timeout=60, what="node steps"
        )
        failed = {"action": "rmdir-stale", "target": stale, "result": "failed",
                  "message": "rmdir: device or resource busy", "time": utc_now()}  # fmt: skip
        write_as_agent(
            objects, namespace, rem, {"nodeActions": [failed], "nodeStepsDoneAt": utc_now()}
        )
        alert = _alert_when(stack, "UnstickRemediationsFailing", "firing", action="rmdir-stale")
        assert alert["labels"]["cause"] == "StaleVolumeDirs"
        assert alert["annotations"]["runbook_url"].endswith("#unstickremediationsfailing")
    finally:
        objects.core.delete_node(node)


def _forge(stack: Stack, namespace: str) -> str:
    """A Remediation of a pod that does not exist, dressed up as a remediation under way."""
    name = f"ghost-{uuid.uuid4().hex[:8]}"
    body = remediation("ghost", "0badf00d-0000-4000-8000-000000000000", "nowhere", name=name)
    stack.objects.record(namespace, body, {"phase": "Remediating", "cause": "NodeGone"})
    return name


def test_forged_remediation_fires_the_refusal_alert(stack: Stack, namespace: str) -> None:
    _forge(stack, namespace)
    alert = _alert_when(stack, "UnstickRequestsRefused", "firing", reason="forged")
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"].endswith("#unstickrequestsrefused")


# --- the Grafana dashboard ------------------------------------------------------------------

# Grafana's own variables, as Grafana would substitute them for a 5-minute view.
GRAFANA_VARS = {"$__rate_interval": "5m", "$__range": "5m", "$__interval": "15s"}
# Metrics whose situation this test creates: their panels must return series (histogram
# quantiles: a finite value). The §9 aftermath metrics (unstick_blocked_replacements,
# unstick_blocked_namespaces, unstick_node_orphaned_pod_dirs) need situations this module
# does not create (a replacement pod waiting on a volume, a namespace being deleted, a pod
# dir orphaned for 5 minutes): their queries must not fail, and those exported while
# nothing is blocked or orphaned (as 0) must return that series.
CREATED = (
    "unstick_stuck_pods",
    "unstick_remediations_total",
    "unstick_detection_lag_seconds",
    "unstick_time_to_resolution_seconds",
    "unstick_refusals_total",
    "unstick_node_orphaned_mounts",
    "unstick_node_probe_duration_seconds",
)
EXPORTED_AT_ZERO = ("unstick_blocked_namespaces", "unstick_node_orphaned_pod_dirs")


def _panel_targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def _situations(stack: Stack, namespace: str) -> None:
    """A pod stuck on the agent's node (opted in: the real agent probes it), a pod seen
    stuck and then gone (time to resolution), a forged record (a refusal)."""
    objects = stack.objects
    node_ready(objects, stack.agent_node)
    objects.stuck_pod(namespace, stack.agent_node, remediate="true", finalizers=[HOLD])
    gone = objects.pod(namespace, f"gone-{uuid.uuid4().hex[:6]}", finalizers=[HOLD])
    objects.core.delete_namespaced_pod(gone["name"], namespace)
    wait_until(
        lambda: objects.remediation(namespace, gone), timeout=60, what="the gone pod's Remediation"
    )
    objects.core.patch_namespaced_pod(gone["name"], namespace, {"metadata": {"finalizers": None}})
    objects.core.delete_namespaced_pod(gone["name"], namespace, grace_period_seconds=0)
    _forge(stack, namespace)
    prom = stack.prometheus
    for what in (
        f'unstick_stuck_pods{{namespace="{namespace}"}}',
        "unstick_node_probe_duration_seconds_count",
        "unstick_time_to_resolution_seconds_count",
        'unstick_refusals_total{reason="forged"}',
    ):
        wait_until(lambda what=what: prom.query(f"{what} > 0"), timeout=60, what=f"{what} scraped")


def test_every_dashboard_panel_query_runs_and_shows_its_situation(
    stack: Stack, namespace: str
) -> None:
    assert stack.chart.dashboard is not None, "grafanaDashboard.enabled renders no ConfigMap"
    _situations(stack, namespace)
    targets = _panel_targets(stack.chart.dashboard)
    errors, empty = [], []
    for title, expr in targets:
        try:
            series = stack.prometheus.query(expr)
        except PrometheusError as err:
            errors.append(f"{title}: {err}")
            continue
        if any(m in expr for m in CREATED + EXPORTED_AT_ZERO) and not any(
            math.isfinite(float(s["value"][1])) for s in series
        ):
            empty.append(f"{title}: {expr} -> {series}")
    assert errors == []
    assert empty == []
    aftermath = ("unstick_blocked_replacements", *EXPORTED_AT_ZERO)
    queried = {m for _, e in targets for m in CREATED + aftermath if m in e}
    assert queried == {*CREATED, *aftermath}, "a panel is missing"
