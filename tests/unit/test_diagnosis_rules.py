"""diagnose(): the edges of DESIGN §1-2 that scenarios do not pin down."""

from __future__ import annotations

import pytest

from unstick.core.diagnosis import DiagnosisSettings, diagnose
from unstick.core.durations import human
from unstick.core.snapshot import BundleError, parse_bundle, parse_probe
from unstick.core.vocabulary import Cause

from .bundles import UID, bundle, csi_mount_path, mount_line, node, pod, probe


def cause(b: dict[str, object], **settings: float) -> Cause:
    return diagnose(parse_bundle(b), DiagnosisSettings(**settings)).cause


@pytest.mark.parametrize(
    ("deletion", "slack", "stuck"),
    [
        ("2026-11-20T09:59:00Z", 60, False),  # exactly at slack: not yet
        ("2026-11-20T09:58:59Z", 60, True),
        ("2026-11-20T09:59:59Z", 0, True),
        ("2026-11-20T10:00:00Z", 0, False),
    ],
)
def test_stuck_is_now_past_deletion_timestamp_plus_slack(
    deletion: str, slack: float, stuck: bool
) -> None:
    d = diagnose(
        parse_bundle(bundle(the_pod=pod(deletion=deletion), the_node=None)),
        DiagnosisSettings(slack_s=slack),
    )
    assert d.stuck is stuck
    assert (d.cause is Cause.NotStuck) is not stuck


def test_overdue_seconds_is_signed() -> None:
    d = diagnose(parse_bundle(bundle(the_pod=pod(deletion="2026-11-20T10:05:00Z"))))
    assert d.overdue_seconds == -300.0 and not d.stuck


def test_node_lost_after_boundary_and_setting() -> None:
    down = node(ready="False", since="2026-11-20T09:55:00Z", fenced=True)
    assert cause(bundle(the_node=down)) is Cause.NodeUnreachable  # 300 s >= 300 s
    assert cause(bundle(the_node=down), node_lost_after_s=301) is Cause.Unknown


def test_node_without_ready_counts_from_creation() -> None:
    young = node(ready=None, created="2026-11-20T09:58:00Z")
    assert cause(bundle(the_node=young)) is Cause.Unknown
    old = node(ready=None, created="2026-11-20T09:00:00Z")
    assert cause(bundle(the_node=old)) is Cause.NodeUnreachable


def test_finalizers_with_nonzero_grace_on_a_live_node_are_not_finalizer_blocked() -> None:
    b = bundle(the_pod=pod(finalizers=["example.com/x"], grace=30))
    assert cause(b) is Cause.Unknown  # no probe: the kubelet's part is unknown


def test_probe_max_age_boundary() -> None:
    at = probe(containers=[], probed_at="2026-11-20T09:58:00Z")  # 120 s old
    assert cause(bundle(the_probe=at)) is Cause.KubeletNotProgressing
    assert cause(bundle(the_probe=at), probe_max_age_s=119) is Cause.Unknown


def test_container_of_another_pod_running_does_not_count() -> None:
    p = probe(containers=[])
    p["containers"] = [{"podUID": "someone-else", "name": "app", "id": "x", "state": "running"}]
    assert cause(bundle(the_probe=p)) is Cause.KubeletNotProgressing


def test_mount_point_with_trailing_slash_in_holder_still_matches() -> None:
    m = csi_mount_path("scratch")
    p = probe(mounts=[mount_line(1, m)], containers=[])
    p["holders"] = [{"mountPoint": m + "/", "pid": 5, "comm": "sh", "via": "root"}]
    assert cause(bundle(the_probe=p)) is Cause.MountBusy


def test_evidence_names_the_holder_pid_and_comm() -> None:
    m = csi_mount_path("scratch")
    p = probe(mounts=[mount_line(1, m)], containers=[])
    p["holders"] = [{"mountPoint": m, "pid": 31337, "comm": "rsync", "via": "maps"}]
    d = diagnose(parse_bundle(bundle(the_probe=p)))
    assert any("pid 31337 (rsync)" in e.message and m in e.message for e in d.evidence)


def test_parse_probe_alone_and_its_errors() -> None:
    p = parse_probe(probe(containers=[("app", "running")]))
    assert p.containers is not None and p.containers[0].pod_uid == UID
    with pytest.raises(BundleError, match=r"probe.containers\[0\].state: 'zombie'"):
        parse_probe(probe(containers=[("app", "zombie")]))
    with pytest.raises(BundleError, match=r"probe\.kubeletRoot: 'relative' must be an absolute"):
        parse_probe(probe(root="relative"))


def test_human_durations() -> None:
    assert [human(x) for x in (0, 4.4, 60, 812, 7300, -90)] == [
        "0s", "4s", "1m0s", "13m32s", "2h1m40s", "1m30s",
    ]  # fmt: skip
