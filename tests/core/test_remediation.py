"""unstick.core.remediation: the Remediation's names, the one time format, and the typed
node-steps request (what the controller writes is what the agent reads)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from unstick.core import remediation as r
from unstick.core.vocabulary import Action


def test_the_resource_names_are_the_contracts() -> None:
    assert r.API_VERSION == "unstick.dev/v1alpha1"
    assert (r.GROUP, r.VERSION, r.PLURAL, r.KIND) == (
        "unstick.dev",
        "v1alpha1",
        "remediations",
        "Remediation",
    )
    assert r.ALL_REMEDIATIONS == "/apis/unstick.dev/v1alpha1/remediations"
    assert r.POLICIES == "/apis/unstick.dev/v1alpha1/remediationpolicies"


def test_the_crd_file_agrees_with_the_names() -> None:
    import pathlib

    import yaml

    crd = yaml.safe_load(
        (pathlib.Path(__file__).parents[2] / "operator/unstick/crds/remediations.yaml").read_text()
    )
    assert crd["spec"]["group"] == r.GROUP
    assert crd["spec"]["names"]["plural"] == r.PLURAL
    assert crd["spec"]["names"]["kind"] == r.KIND
    assert [v["name"] for v in crd["spec"]["versions"]] == [r.VERSION]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for field in (r.POD_NAME, r.POD_UID, r.NODE_NAME, r.NODE_STEPS, r.NODE_STEPS_REQUESTED_AT):
        assert field in spec["properties"], field


def test_a_new_remediation_carries_its_identity_and_labels() -> None:
    body = r.new_remediation("shop", "web-0-3f2c0000", "web-0", "3f2c", node="", dry_run=True)
    assert body["metadata"]["labels"] == {
        "unstick.dev/node": "none",
        "unstick.dev/pod-uid": "3f2c",
        "pod.unstick.dev/web-0": "",
    }
    assert body["spec"] == {"podName": "web-0", "podUID": "3f2c", "nodeName": "", "dryRun": True}


def test_long_pod_names_make_valid_labels_and_names() -> None:
    name = "a" * 60 + "-" + "b" * 10
    label = r.pod_label(name)
    assert len(label.removeprefix(r.POD_LABEL_PREFIX)) <= 63
    assert label != r.pod_label(name + "c")  # the hash keeps them apart
    assert r.remediation_name("x" * 52 + ".-y", "0123456789") == "x" * 52 + "-01234567"


def test_times_are_written_one_way_and_read_back() -> None:
    stamp = r.rfc3339(1764057600.25)
    assert stamp == "2025-11-25T08:00:00.250000Z"
    assert r.parse_time(stamp) == 1764057600.25
    moment = datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    assert r.rfc3339(moment) == "2026-01-01T00:00:00.000000Z"
    assert r.parse_datetime("2026-01-01T00:00:00") == datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="timezone"):
        r.rfc3339(datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        r.parse_time("yesterday")


def test_the_request_the_controller_writes_is_what_the_agent_reads() -> None:
    request = r.NodeStepsRequest(
        steps=(
            r.NodeStep(Action.UNMOUNT, "/var/lib/kubelet/pods/u/volumes/x", "orphaned"),
            r.NodeStep(Action.RMDIR_STALE, "/var/lib/kubelet/pods/u/volumes/x"),
        ),
        requested_at=datetime(2026, 11, 25, 8, 0, 1, 500, tzinfo=UTC),
        lazy_unmount=True,
    )
    spec = request.to_spec()
    assert spec["nodeStepsRequestedAt"] == "2026-11-25T08:00:01.000500Z"
    assert spec["nodeSteps"][0] == {
        "action": "unmount",
        "target": "/var/lib/kubelet/pods/u/volumes/x",
        "reason": "orphaned",
    }
    assert r.parse_node_steps(spec) == request


def test_no_request_without_its_time() -> None:
    assert r.parse_node_steps({"nodeSteps": [{"action": "unmount"}]}) is None
    assert r.parse_node_steps({}) is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"nodeStepsRequestedAt": 5}, "spec.nodeStepsRequestedAt"),
        ({"nodeStepsRequestedAt": "soon"}, "spec.nodeStepsRequestedAt"),
        ({"nodeStepsRequestedAt": "2026-01-01T00:00:00Z", "nodeSteps": {}}, "spec.nodeSteps"),
        (
            {"nodeStepsRequestedAt": "2026-01-01T00:00:00Z", "nodeSteps": ["unmount"]},
            "spec.nodeSteps[0]",
        ),
        (
            {"nodeStepsRequestedAt": "2026-01-01T00:00:00Z", "nodeSteps": [{"action": "rm -rf"}]},
            "spec.nodeSteps[0].action",
        ),
        (
            # force-delete is the controller's, never a node step
            {
                "nodeStepsRequestedAt": "2026-01-01T00:00:00Z",
                "nodeSteps": [{"action": "force-delete"}],
            },
            "spec.nodeSteps[0].action",
        ),
        (
            {
                "nodeStepsRequestedAt": "2026-01-01T00:00:00Z",
                "nodeSteps": [{"action": "unmount", "target": 7}],
            },
            "spec.nodeSteps[0].target",
        ),
        ({"nodeStepsRequestedAt": "2026-01-01T00:00:00Z", "dryRun": "no"}, "spec.dryRun"),
    ],
)
def test_a_malformed_request_names_its_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(r.RemediationError) as caught:
        r.parse_node_steps(spec)
    assert caught.value.field == field
    assert str(caught.value).startswith(field + ": ")


def test_steps_are_answered_once_done_is_not_before_the_request() -> None:
    spec = {"nodeStepsRequestedAt": "2026-01-01T00:00:01Z"}
    assert not r.steps_answered(spec, {})
    assert not r.steps_answered(spec, {"nodeStepsDoneAt": "2026-01-01T00:00:00.5Z"})
    assert r.steps_answered(spec, {"nodeStepsDoneAt": "2026-01-01T00:00:01.000000Z"})
    assert not r.steps_answered(spec, {"nodeStepsDoneAt": "garbage"})
    assert not r.steps_answered({}, {"nodeStepsDoneAt": "2026-01-01T00:00:01Z"})


@pytest.mark.parametrize("value", [None, "", 7, "yesterday", "2026-13-01T00:00:00Z"])
def test_a_bad_time_is_no_time_where_it_may_be(value: object) -> None:
    assert r.time_or_none(value) is None


def test_a_time_without_a_zone_is_utc_where_it_may_be() -> None:
    assert r.time_or_none("2026-11-25T08:00:00") == datetime(2026, 11, 25, 8, tzinfo=UTC)
    assert r.time_or_none("2026-11-25T09:00:00+01:00") == datetime(2026, 11, 25, 8, tzinfo=UTC)


def test_the_probe_the_agent_writes_carries_the_stamp_the_controller_reads() -> None:
    at = datetime(2026, 11, 25, 8, 0, 0, 123456, tzinfo=UTC)
    probe = {r.NODE_NAME: "node-1", r.POD_UID: "uid-1", r.PROBED_AT: r.rfc3339(at)}
    assert probe == {"nodeName": "node-1", "podUID": "uid-1", "probedAt": r.rfc3339(at)}
    assert r.probe_stamp(probe) == r.ProbeStamp("uid-1", "node-1", at)


def test_a_malformed_probe_stamp_is_empty_not_an_error() -> None:
    forged = {"podUID": 5, "nodeName": ["node-1"], "probedAt": "soon"}
    assert r.probe_stamp(forged) == r.ProbeStamp(None, None, None)
    assert r.probe_stamp({}) == r.ProbeStamp(None, None, None)
