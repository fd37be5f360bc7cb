"""diagnose(): the edges of design.md §1-2 that scenarios do not pin down."""

from __future__ import annotations

import pytest

from tests.support.bundles import (
    OTHER_UID,
    UID,
    bundle,
    csi_mount_path,
    inline_csi_volume,
    mount_line,
    node,
    pod,
    probe,
)
from unstick.core.durations import human
from unstick.core.model.snapshot import BundleError, parse_bundle, parse_probe
from unstick.core.rules.diagnosis import diagnose
from unstick.core.rules.settings import DiagnosisSettings
from unstick.core.vocabulary import Cause


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


def test_a_probe_of_another_uid_never_overrides_the_apis_running_containers() -> None:
    """Invariant 7: the agent probed another UID (a forged spec.podUID) and found nothing;
    that says nothing about this pod, whose API status still shows a running container."""
    running = pod(statuses=[("app", "running")])
    forged = probe(containers=[], uid=OTHER_UID)
    d = diagnose(parse_bundle(bundle(the_pod=running, the_probe=forged)))
    assert d.cause is Cause.ContainersStillRunning
    assert not d.probe_fresh and not d.nothing_left
    assert any(
        f"probe ignored: it is of pod uid {OTHER_UID}, not of this pod {UID}" in e.message
        for e in d.evidence
    )
    # and with nothing running per the API: Unknown, never "nothing left"
    assert cause(bundle(the_probe=forged)) is Cause.Unknown


@pytest.mark.parametrize(
    ("sight", "why"),
    [
        ({"podDirsSeen": 0, "podDirExists": False}, "holds no pod dirs"),
        ({"runtime": "unanswered"}, "container runtime did not answer"),
        ({"holderScan": "incomplete"}, "holder scan was incomplete"),
        ({"podUID": None}, "which pod UID"),
        ({"runtime": None}, "whether the container runtime answered"),
        ({"holderScan": None}, "whether its holder scan was complete"),
        ({"podDirsSeen": None}, "whether the kubelet root holds pod dirs"),
    ],
)
def test_a_blind_empty_probe_is_unknown_with_what_it_could_not_see(
    sight: dict[str, object], why: str
) -> None:
    d = diagnose(parse_bundle(bundle(the_probe=probe(containers=[], sight=sight))))
    assert d.cause is Cause.Unknown and not d.nothing_left
    assert any(why in e.message for e in d.evidence), d.evidence


def test_a_fully_sighted_empty_probe_is_kubelet_not_progressing() -> None:
    for sight in ({}, {"runtime": "cgroup"}, {"runtime": "cri+cgroup"}, {"podDirExists": False}):
        d = diagnose(parse_bundle(bundle(the_probe=probe(containers=[], sight=sight))))
        assert d.cause is Cause.KubeletNotProgressing and d.nothing_left, sight


def test_an_older_probe_still_finds_mounts_but_never_nothing_left() -> None:
    m = csi_mount_path("scratch")
    held = probe(mounts=[mount_line(1, m)], containers=[], legacy=True)
    held["holders"] = [{"mountPoint": m, "pid": 5, "comm": "sh", "via": "cwd"}]
    assert cause(bundle(the_probe=held)) is Cause.MountBusy
    empty = probe(containers=[], legacy=True)
    assert cause(bundle(the_probe=empty)) is Cause.Unknown


def test_no_listed_holder_is_not_no_holder_when_the_scan_or_runtime_was_blind() -> None:
    m = csi_mount_path("scratch")
    the_pod = pod(volumes=[inline_csi_volume("scratch")])
    for sight, expected in (
        ({}, Cause.OrphanedMount),
        ({"holderScan": "incomplete"}, Cause.Unknown),
        ({"runtime": "unanswered"}, Cause.Unknown),
    ):
        p = probe(mounts=[mount_line(1, m)], containers=[("app", "exited")], sight=sight)
        d = diagnose(parse_bundle(bundle(the_pod=the_pod, the_probe=p)))
        assert d.cause is expected, (sight, d.evidence)


def test_an_unanswered_runtime_does_not_override_the_apis_running_container() -> None:
    running = pod(statuses=[("app", "running")])
    blind = probe(containers=[("app", "exited")], sight={"runtime": "unanswered"})
    assert cause(bundle(the_pod=running, the_probe=blind)) is Cause.ContainersStillRunning
    answered = probe(containers=[("app", "exited")])
    assert cause(bundle(the_pod=running, the_probe=answered)) is Cause.KubeletNotProgressing


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


@pytest.mark.parametrize(
    ("sight", "message"),
    [
        ({"podUID": 7}, r"probe\.podUID: must be a string, got a number"),
        ({"podUID": ""}, r"probe\.podUID: must not be empty"),
        ({"podDirExists": "yes"}, r"probe\.podDirExists: must be true, false or null"),
        ({"podDirsSeen": -1}, r"probe\.podDirsSeen: -1 must be >= 0"),
        ({"podDirsSeen": True}, r"probe\.podDirsSeen: must be an integer"),
        ({"runtime": "maybe"}, r"probe\.runtime: 'maybe' is not one of cri\+cgroup, cri, cgroup"),
        ({"holderScan": "partial"}, r"probe\.holderScan: 'partial' is not one of complete"),
        ({"blindSpots": [3]}, r"probe\.blindSpots\[0\]: must be a string"),
    ],
)
def test_bad_visibility_keys_name_the_field(sight: dict[str, object], message: str) -> None:
    with pytest.raises(BundleError, match=message):
        parse_probe(probe(containers=[], sight=sight))


def test_visibility_keys_are_optional_and_read() -> None:
    old = parse_probe(probe(containers=[], legacy=True))
    assert (old.pod_uid, old.runtime, old.holder_scan, old.pod_dirs_seen) == (None,) * 4
    assert old.unseen()
    new = parse_probe(probe(containers=[], sight={"blindSpots": ["x"]}))
    assert (new.pod_uid, new.runtime, new.holder_scan) == (UID, "cri", "complete")
    assert new.pod_dir_exists is True and new.pod_dirs_seen == 12 and new.blind_spots == ("x",)
    assert new.unseen() == ()


def test_human_durations() -> None:
    assert [human(x) for x in (0, 4.4, 60, 812, 7300, -90)] == [
        "0s", "4s", "1m0s", "13m32s", "2h1m40s", "1m30s",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("reported", "says"),
    [
        (
            {"working": {"sync": 2, "terminating": 3, "terminated": 0},
             "orphaned": {"sync": 0, "terminating": 0, "terminated": 0},
             "desired": 5, "active": 5, "orphanedRuntimeTotal": 0, "restartedTotal": 0,
             "unread": ""},
            "the kubelet itself reports 2 pod(s) syncing, 3 terminating, 0 terminated; "
            "5 desired, 5 active, 0 found orphaned in the runtime since it started, "
            "0 restarted with the same UID since it started",
        ),
        (
            {"unread": "the kubelet's https://10.0.0.2:10250/metrics did not answer: timed out"},
            "the kubelet's own pod-worker counts are unknown: the kubelet's "
            "https://10.0.0.2:10250/metrics did not answer: timed out",
        ),
    ],
)  # fmt: skip
def test_kubelet_not_progressing_says_what_the_kubelet_itself_reports(
    reported: dict[str, object], says: str
) -> None:
    """Evidence only: the cause, the plan's inputs and the other evidence are those of the
    same probe without the kubelet's counts."""
    told = probe(containers=[])
    told["kubeletPods"] = reported
    d = diagnose(parse_bundle(bundle(the_probe=told)))
    without = diagnose(parse_bundle(bundle(the_probe=probe(containers=[]))))
    assert d.cause is without.cause is Cause.KubeletNotProgressing
    assert d.nothing_left and without.nothing_left
    assert d.evidence[-1].kind == "kubelet" and d.evidence[-1].message == says
    assert d.evidence[:-1] == without.evidence
