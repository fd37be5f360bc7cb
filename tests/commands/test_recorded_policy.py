"""`unstick diagnose` uses the RemediationPolicy `unstick snapshot` recorded in the bundle
(optional top-level `policy`): a bundle captured 40 s after the deadline under a 5 s
slack is stuck, not `NotStuck` under the built-in 60 s. Old bundles (no `policy`) read
as before; --policy FILE and --no-policy override the recorded one."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from unstick.cli import main

SCENARIO = Path(__file__).parents[1] / "scenarios" / "node-gone-with-allowlisted-finalizer.json"
ALL = ["observe", "replay-unpublish", "unmount", "rmdir-stale", "force-delete", "remove-finalizer"]
POLICY = {
    "apiVersion": "unstick.dev/v1alpha1",
    "kind": "RemediationPolicy",
    "metadata": {"name": "default", "resourceVersion": "42"},
    "spec": {
        "actions": ALL,
        "dryRun": False,
        "slackSeconds": 5,
        "finalizerAllowlist": ["example.com/protect"],
    },
    "status": {"conditions": [{"type": "Valid", "status": "True"}]},
}


def _bundle(tmp_path: Path, policy: Any = "absent") -> Path:
    bundle = json.loads(SCENARIO.read_text())
    bundle.pop("expect")
    # deletionTimestamp 09:45:00 (grace included): 40 s after the deadline
    bundle["capturedAt"] = "2026-11-20T09:45:40Z"
    if policy != "absent":
        bundle["policy"] = policy
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle))
    return path


def _diagnose(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["diagnose", *args, "--output", "json"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if code == 0 else {})


def test_the_recorded_policy_is_used_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _diagnose(capsys, "--snapshot", str(_bundle(tmp_path, POLICY)))
    assert code == 0
    assert report["stuck"] is True and report["cause"] == "NodeGone"
    assert [s["action"] for s in report["plan"]] == ["force-delete", "remove-finalizer"]


def test_an_old_bundle_without_policy_uses_the_builtin_slack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bundle in (_bundle(tmp_path), _bundle(tmp_path, None)):
        code, report = _diagnose(capsys, "--snapshot", str(bundle))
        assert code == 0 and report["cause"] == "NotStuck", report


def test_no_policy_and_a_policy_file_override_the_recorded_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = str(_bundle(tmp_path, POLICY))
    code, report = _diagnose(capsys, "--snapshot", bundle, "--no-policy")
    assert code == 0 and report["cause"] == "NotStuck"
    slow = copy.deepcopy(POLICY)
    slow["spec"]["slackSeconds"] = 300
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    code, report = _diagnose(capsys, "--snapshot", bundle, "--policy", str(tmp_path / "slow.json"))
    assert code == 0 and report["cause"] == "NotStuck"


def test_a_bad_recorded_policy_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = copy.deepcopy(POLICY)
    bad["spec"]["slackSeconds"] = "soon"
    code = main(["diagnose", "--snapshot", str(_bundle(tmp_path, bad))])
    err = capsys.readouterr().err
    assert code == 2
    assert "recorded in snapshot" in err and "slackSeconds" in err and "Traceback" not in err


def test_text_output_says_which_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--snapshot", str(_bundle(tmp_path, POLICY))]) == 0
    assert "(diagnosed under policy default)" in capsys.readouterr().out
