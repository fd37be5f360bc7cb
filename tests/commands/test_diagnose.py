"""`unstick diagnose` as a user runs it: a subprocess, exit codes, messages, output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.bundles import bundle, node, pod

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "tests" / "scenarios" / "orphaned-mount-with-decoys.json"


def unstick(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unstick", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
        check=False,
    )


def write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_json_output_has_exactly_the_design_keys() -> None:
    r = unstick("diagnose", "--snapshot", str(SCENARIO), "--output", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert list(report) == [
        "pod",
        "uid",
        "node",
        "overdueSeconds",
        "stuck",
        "cause",
        "evidence",
        "plan",
        "refused",
    ]
    assert report["pod"] == "default/app-0"
    assert report["cause"] == "OrphanedMount"
    assert report["overdueSeconds"] == 900.0
    assert report["stuck"] is True
    assert {"kind", "message"} == set(report["evidence"][0])
    assert report["plan"][0]["action"] == "replay-unpublish"
    assert set(report["plan"][0]) == {"action", "target", "reason"}
    assert report["refused"] == [
        {"action": "force-delete", "reason": "the pod's mounts are not gone yet"}
    ]


def test_text_output_names_cause_evidence_plan_and_refusals() -> None:
    r = unstick("diagnose", "--snapshot", str(SCENARIO))
    assert r.returncode == 0, r.stderr
    for text in ("cause: OrphanedMount", "evidence:", "plan:", "refused:", "force-delete"):
        assert text in r.stdout


def test_reads_the_bundle_from_stdin() -> None:
    r = unstick("diagnose", "--snapshot", "-", "--output", "json", stdin=SCENARIO.read_text())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cause"] == "OrphanedMount"


def test_unknown_top_level_fields_are_ignored(tmp_path: Path) -> None:
    b = bundle(the_node=None)
    b["somethingNew"] = {"x": 1}
    r = unstick("diagnose", "--snapshot", str(write(tmp_path, "b.json", b)), "--output", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cause"] == "NodeGone"


def _without(b: dict[str, Any], *path: str) -> dict[str, Any]:
    obj = b
    for key in path[:-1]:
        obj = obj[key]
    del obj[path[-1]]
    return b


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON: line 1 column 2"),
        ("[]", "bundle: must be an object"),
        (_without(bundle(), "pod", "metadata", "uid"), "pod.metadata.uid: missing"),
        (_without(bundle(), "capturedAt"), "capturedAt: missing"),
        (_without(bundle(), "node"), "node: missing"),
        ({**bundle(), "capturedAt": "yesterday"}, "capturedAt: 'yesterday' is not an RFC 3339"),
        ({**bundle(), "capturedAt": "2026-11-20T10:00:00"}, "capturedAt: '2026-11-20T10:00:00'"),
        ({**bundle(), "pod": pod() | {"metadata": "x"}}, "pod.metadata: must be an object"),
        (
            {**bundle(), "node": node() | {"status": {"conditions": [{"type": "Ready"}]}}},
            "node.status.conditions[0].status: missing",
        ),
        ({**bundle(), "probe": {"nodeName": "n"}}, "probe.kubeletRoot: missing"),
        (
            {
                **bundle(),
                "probe": {
                    "nodeName": "n",
                    "probedAt": "2026-11-20T10:00:00Z",
                    "kubeletRoot": "/k",
                    "mountinfo": "1 2 3\n",
                },
            },
            "probe.mountinfo: mountinfo line 1:",
        ),
        (
            {
                **bundle(),
                "probe": {
                    "nodeName": "n",
                    "probedAt": "2026-11-20T10:00:00Z",
                    "kubeletRoot": "/k",
                    "mountinfo": "",
                    "holders": [{"mountPoint": "/x", "pid": "1", "comm": "a", "via": "cwd"}],
                },
            },
            "probe.holders[0].pid: must be an integer",
        ),
        (
            {**bundle(), "persistentVolumes": [{"metadata": {}}]},
            "persistentVolumes[0].metadata.name: missing",
        ),
    ],
)
def test_bad_bundles_exit_2_with_the_field_named(
    tmp_path: Path, content: Any, message: str
) -> None:
    r = unstick("diagnose", "--snapshot", str(write(tmp_path, "b.json", content)))
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_missing_snapshot_file_exits_2(tmp_path: Path) -> None:
    r = unstick("diagnose", "--snapshot", str(tmp_path / "nope.json"))
    assert r.returncode == 2
    assert "cannot read snapshot" in r.stderr and "No such file" in r.stderr


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("spec: [unclosed", "is not valid YAML/JSON: line 1"),
        ("spec:\n  actions: [nuke]\n", "spec.actions[0]: unknown action 'nuke'"),
        ("slackSeconds: -1\n", "spec.slackSeconds: must be a non-negative number"),
        ("slackSeconds: '60'\n", "spec.slackSeconds: must be a non-negative number"),
        (
            "rateLimits: {nodePerMinute: -2}\n",
            "spec.rateLimits.nodePerMinute: must be a positive integer",
        ),
        # 0 would stop every action, and the CRD's minimum is 1: rejected alike.
        ("rateLimits: {clusterPerMinute: 0}\n", "spec.rateLimits.clusterPerMinute: must be a"),
        # NaN/inf would make any probe "fresh" or no pod ever stuck.
        ("probeMaxAgeSeconds: .nan\n", "spec.probeMaxAgeSeconds: must be a number >= 1"),
        ("slackSeconds: .inf\n", "spec.slackSeconds: must be a non-negative number"),
        ("nodeLostAfterSeconds: 0\n", "spec.nodeLostAfterSeconds: must be a number >= 1"),
        ("rateLimits: {perHour: 2}\n", "spec.rateLimits.perHour: unknown field"),
        (
            "finalizerAllowlist: [protect]\n",
            "spec.finalizerAllowlist[0]: 'protect' is not a qualified",
        ),
        ("dryRun: yes please\n", "spec.dryRun: must be true or false"),
        ("bogus: 1\n", "spec.bogus: unknown field"),
        ("kind: Pod\nspec: {}\n", "kind: must be RemediationPolicy"),
        ("- observe\n", "policy: must be an object"),
    ],
)
def test_bad_policies_exit_2_with_the_field_named(
    tmp_path: Path, policy: str, message: str
) -> None:
    r = unstick(
        "diagnose",
        "--snapshot",
        str(SCENARIO),
        "--policy",
        str(write(tmp_path, "policy.yaml", policy)),
    )
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def test_policy_applies_permitted_actions_and_opt_in(tmp_path: Path) -> None:
    policy = write(
        tmp_path,
        "policy.yaml",
        "apiVersion: unstick.dev/v1alpha1\nkind: RemediationPolicy\nmetadata: {name: strict}\n"
        "spec:\n  actions: [observe, unmount]\n",
    )
    r = unstick(
        "diagnose", "--snapshot", str(SCENARIO), "--policy", str(policy), "--output", "json"
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert {s["action"] for s in report["plan"]} == {"unmount"}
    reasons = {(x["action"], x["reason"]) for x in report["refused"]}
    assert ("replay-unpublish", "not permitted by policy strict (spec.actions)") in reasons


def test_pod_opted_into_another_policy_is_observed_only(tmp_path: Path) -> None:
    b = bundle(the_pod=pod(opt_in="gold"), the_node=None)
    policy = write(
        tmp_path,
        "p.json",
        {"metadata": {"name": "silver"}, "spec": {"actions": ["observe", "force-delete"]}},
    )
    r = unstick(
        "diagnose",
        "--snapshot",
        str(write(tmp_path, "b.json", b)),
        "--policy",
        str(policy),
        "--output",
        "json",
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert [s["action"] for s in report["plan"]] == ["observe"]
    assert {"action": "force-delete", "reason": "pod has not opted in"} in report["refused"]


def test_help_explains_the_command() -> None:
    r = unstick("diagnose", "--help")
    assert r.returncode == 0
    assert "--snapshot" in r.stdout and "--policy" in r.stdout and "Exit status" in r.stdout


def with_probe(probe: dict[str, Any]) -> dict[str, Any]:
    return {**bundle(), "probe": probe}


def test_unicode_digits_in_paths_and_ids_are_not_a_crash(tmp_path: Path) -> None:
    """`'²'.isdigit()` is true but `int('²')` raises: a subpath index or a mount id made of
    such characters must give a diagnosis or a clear error, never a traceback."""
    uid = bundle()["pod"]["metadata"]["uid"]
    probe = {
        "nodeName": bundle()["pod"]["spec"]["nodeName"],
        "probedAt": bundle()["capturedAt"],
        "kubeletRoot": "/k",
        "mountinfo": f"36 25 0:32 / /k/pods/{uid}/volume-subpaths/v/c/² rw - tmpfs tmpfs rw\n",
    }
    ok = unstick(
        "diagnose", "--snapshot", str(write(tmp_path, "a.json", bundle() | {"probe": probe}))
    )
    assert ok.returncode == 0, ok.stderr
    probe["mountinfo"] = "²6 25 0:32 / /x rw - tmpfs tmpfs rw\n"
    bad = unstick(
        "diagnose", "--snapshot", str(write(tmp_path, "b.json", bundle() | {"probe": probe}))
    )
    assert bad.returncode == 2
    assert "probe.mountinfo: mountinfo line 1: mount id '²6'" in bad.stderr
    assert "Traceback" not in ok.stderr + bad.stderr
