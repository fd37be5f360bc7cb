"""The chart's PrometheusRule: its spec is a valid rule file (`promtool check rules`),
and its alerts fire, and stay quiet, as documented (`promtool test rules` on synthetic
series). The expected annotations are the rule's own templates expanded with the alert's
labels, which also proves Helm left the Prometheus templating intact."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .render import one, template

AGENT_JOB = "unstick-agent-metrics"


@pytest.fixture(scope="module")
def rules(helm: str) -> dict[str, Any]:
    objects = template(helm, "--set", "prometheusRule.enabled=true")
    return one(objects, "PrometheusRule", "unstick")["spec"]


@pytest.fixture(scope="module")
def rule_file(rules: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "unstick-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    return path


def _alert(rules: dict[str, Any], name: str) -> dict[str, Any]:
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                return rule
    raise AssertionError(f"no alert {name}")


def _expand(text: str, labels: dict[str, str], value: str) -> str:
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    return text.replace("{{ $value }}", value)


def _expected(rules: dict[str, Any], name: str, labels: dict[str, str], value: str) -> dict:
    rule = _alert(rules, name)
    annotations = {k: _expand(v, labels, value) for k, v in rule["annotations"].items()}
    for text in annotations.values():
        assert "{{" not in text, text
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)


def test_rule_file_validates(promtool: str, rule_file: Path, rules: dict[str, Any]) -> None:
    proc = _promtool(promtool, "check", "rules", str(rule_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    count = sum(len(g["rules"]) for g in rules["groups"])
    assert f"SUCCESS: {count} rules found" in proc.stdout


def test_a_broken_rule_is_caught(promtool: str, rules: dict[str, Any], tmp_path: Path) -> None:
    broken = yaml.safe_load(yaml.safe_dump(rules))
    broken["groups"][0]["rules"][0]["expr"] = "max by (namespace (unstick_stuck_pods)"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert _promtool(promtool, "check", "rules", str(path)).returncode != 0


def test_descriptions_explain_the_time_past_the_deadline(rules: dict[str, Any]) -> None:
    text = _alert(rules, "UnstickPodStuckNotRemediable")["annotations"]["description"]
    assert "deletionTimestamp + slack (60s" in text
    assert "past their deadline by at" in text and "60s + 10m" in text


def test_alerts_fire_as_documented(
    promtool: str, rules: dict[str, Any], rule_file: Path, tmp_path: Path
) -> None:
    shop_busy = {"namespace": "shop", "cause": "MountBusy"}
    shop_orphaned = {"namespace": "shop", "cause": "OrphanedMount"}
    data_csi = {"namespace": "data", "cause": "CSIDriverMissing"}
    failed = {"action": "unmount", "cause": "OrphanedMount"}
    n1 = {"job": AGENT_JOB, "node": "n1", "pod": "unstick-agent-x"}
    ds = {"namespace": "unstick", "daemonset": "unstick-agent"}

    def sel(name: str, labels: dict[str, str]) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    series = [
        # stuck from t=1m, a cause unstick does not remediate
        (sel("unstick_stuck_pods", shop_busy), "0 1x40"),
        # stuck from t=0, remediable (but not resolved: dry-run, say)
        (sel("unstick_stuck_pods", shop_orphaned), "1x40"),
        # two pods from t=2m
        (sel("unstick_stuck_pods", data_csi), "0 0 2x40"),
        (sel("unstick_remediations_total", {**failed, "result": "failed"}), "0 0 0 1 2 2x40"),
        (sel("unstick_remediations_total", {**failed, "result": "succeeded"}), "0+1x40"),
        # agent on n1 down from t=2m, n2 fine
        (sel("up", n1), "1 1 0x40"),
        (sel("up", {"job": AGENT_JOB, "node": "n2", "pod": "unstick-agent-y"}), "1x40"),
        (sel("kube_daemonset_status_desired_number_scheduled", ds), "3x40"),
        (sel("kube_daemonset_status_number_ready", ds), "3 3 2x40"),
        # unstick's out-of-service taint on w1 longer than fencedTaintMaxSeconds from t=2m
        (sel("unstick_node_fenced_too_long", {"node": "w1"}), "0 0 1x10 0x30"),
    ]
    cases = [
        # for: 10m from t=1m -> firing from t=11m; OrphanedMount is remediable
        (9, "UnstickPodStuckNotRemediable", []),
        (12, "UnstickPodStuckNotRemediable", [(shop_busy, "1")]),
        (12, "UnstickPodStuck", []),
        # for: 30m -> every stuck (namespace, cause) by t=33m
        (33, "UnstickPodStuck", [(shop_busy, "1"), (shop_orphaned, "1"), (data_csi, "2")]),
        (6, "UnstickCSIDriverMissing", []),
        (8, "UnstickCSIDriverMissing", [({"namespace": "data"}, "2")]),
        (5, "UnstickRemediationsFailing", [(failed, "")]),
        # no failure in the last 15m: quiet again
        (25, "UnstickRemediationsFailing", []),
        (11, "UnstickAgentDown", []),
        (13, "UnstickAgentDown", [(n1, "0")]),
        (13, "UnstickAgentMissingOnNodes", [(ds, "1")]),
        (13, "UnstickAgentsAbsent", []),
        (1, "UnstickNodeFencedTooLong", []),
        (3, "UnstickNodeFencedTooLong", [({"node": "w1"}, "1")]),
        (20, "UnstickNodeFencedTooLong", []),  # removed (node back, nothing left)
    ]
    absent_cases = [
        (14, "UnstickAgentsAbsent", []),
        (16, "UnstickAgentsAbsent", [({"job": AGENT_JOB}, "1")]),
    ]

    def alert_tests(case_list: list) -> list[dict[str, Any]]:
        out = []
        for minute, name, alerts in case_list:
            exp = [_expected(rules, name, labels, value) for labels, value in alerts]
            out.append({"eval_time": f"{minute}m", "alertname": name, "exp_alerts": exp})
        return out

    spec = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": alert_tests(cases),
            },
            {
                "interval": "1m",
                "input_series": [
                    {"series": sel("unstick_stuck_pods", shop_busy), "values": "0x20"}
                ],
                "alert_rule_test": alert_tests(absent_cases),
            },
        ],
    }
    test_file = tmp_path / "unstick-rules.test.yaml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = _promtool(promtool, "test", "rules", str(test_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
