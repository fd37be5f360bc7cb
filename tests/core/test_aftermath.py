"""The pure side of design.md §9: orphan selection, blocker linking, messages, the policy field."""

from __future__ import annotations

import json

import pytest

from unstick.agent.orphans.events import ANNOTATION, OrphanReporter
from unstick.core.policy.remediation_policy import PolicyError, parse_policy
from unstick.core.rules.aftermath import (
    Claim,
    HolderState,
    OrphanDir,
    PodRef,
    block_message,
    find_blocks,
    live_pod_uids,
    namespace_message,
    orphan_steps,
    orphan_uids,
)
from unstick.core.vocabulary import Action

UID = "aaaaaaaa-1111-4111-8111-aaaaaaaaaaaa"


def test_orphans_need_a_fresh_list_and_a_minimum_age() -> None:
    ages = {UID: 600.0, "young": 10.0, "live": 900.0, "..": 900.0}
    assert orphan_uids(ages, None) == ()  # the pod list could not be read: no orphan
    assert orphan_uids(ages, {"live"}) == (UID,)
    assert orphan_uids(ages, {"live"}, min_age_s=0) == (UID, "young")


def test_a_static_pod_dir_is_known_by_its_mirror_pods_hash() -> None:
    mirror = {"metadata": {"uid": "m", "annotations": {"kubernetes.io/config.mirror": "h"}}}
    assert live_pod_uids([mirror]) == {"m", "h"}


def test_orphan_steps_replay_only_with_a_registered_driver() -> None:
    assert orphan_steps(True, True) == (Action.REPLAY_UNPUBLISH, Action.UNMOUNT, Action.RMDIR_STALE)
    assert orphan_steps(False, True) == (Action.UNMOUNT, Action.RMDIR_STALE)
    assert orphan_steps(False, False) == (Action.RMDIR_STALE,)


def test_policy_orphaned_pod_dirs_field() -> None:
    assert parse_policy({}).orphaned_pod_dirs == "observe"
    assert parse_policy({"orphanedPodDirs": "clean"}).orphaned_pod_dirs == "clean"
    with pytest.raises(PolicyError) as err:
        parse_policy({"orphanedPodDirs": "delete"})
    assert err.value.field == "spec.orphanedPodDirs"


RWO = Claim("shop", "data", "pv-1", frozenset({"ReadWriteOnce"}))
WAITER = PodRef("shop", "db-0", "new", "node-1", ("data",))
HOLDER = PodRef("shop", "db-0", "old", "node-3", ("data",))


def test_a_terminating_pod_on_another_node_blocks_a_rwo_claim() -> None:
    (block,) = find_blocks(WAITER, {("shop", "data"): RWO}, [HOLDER], {"pv-1": ["node-3"]})
    assert block.holder == HOLDER and block.attached_node == "node-3"
    msg = block_message(block, HolderState(cause="NodeUnreachable", fenced=False))
    assert msg == (
        "volume pvc/data is held by shop/db-0, stuck Terminating on node-3 (NodeUnreachable, "
        "not fenced): it is freed when node-3 is fenced (node.kubernetes.io/out-of-service) "
        "or by the attach/detach controller's force-detach after 6 min"
    )


def test_rwx_claims_and_the_waiter_itself_do_not_block() -> None:
    rwx = Claim("shop", "data", "pv-1", frozenset({"ReadWriteMany"}))
    assert find_blocks(WAITER, {("shop", "data"): rwx}, [HOLDER], {"pv-1": ["node-3"]}) == ()
    assert find_blocks(WAITER, {("shop", "data"): RWO}, [WAITER], {}) == ()
    same_node = PodRef("shop", "db-0", "old", "node-1", ("data",))
    assert find_blocks(WAITER, {("shop", "data"): RWO}, [same_node], {}) == ()


def test_an_attachment_elsewhere_without_a_holder_is_reported_with_the_node() -> None:
    (block,) = find_blocks(WAITER, {("shop", "data"): RWO}, [], {"pv-1": ["node-1", "node-7"]})
    assert block.holder is None and block.attached_node == "node-7"
    assert "never detaches" in block_message(block, None)


def test_namespace_message_names_pods_and_causes() -> None:
    msg = namespace_message("shop", [("db-0", "MountBusy"), ("web", "NodeGone")])
    assert "2 stuck pod(s): db-0 (MountBusy), web (NodeGone)" in msg


def test_the_node_event_is_posted_once_per_change() -> None:
    posted: list[dict[str, object]] = []
    reporter = OrphanReporter("node-1", lambda _path, body: posted.append(body))
    d = OrphanDir(UID, f"/var/lib/kubelet/pods/{UID}", 600.0, data=(("f", 3),), data_bytes=3)
    assert not reporter.report([], "observe")  # nothing to say yet
    assert reporter.report([d], "observe")
    assert not reporter.report([d], "observe")
    assert reporter.report([], "observe")  # cleared: a Normal Event
    first = posted[0]
    report = json.loads(first["metadata"]["annotations"][ANNOTATION])  # type: ignore[index]
    assert report["dirs"][0]["files"] == [{"path": "f", "bytes": 3}]
    assert first["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node-1",
        "uid": "node-1",
    }
    assert [p["type"] for p in posted] == ["Warning", "Normal"]


def test_containers_still_running_says_what_the_runtime_says_and_for_how_long() -> None:
    from pathlib import Path

    from unstick.core.model.snapshot import parse_bundle
    from unstick.core.rules.diagnosis import diagnose

    path = Path(__file__).parents[1] / "scenarios" / "containers-running-per-probe.json"
    bundle = json.loads(path.read_text())
    bundle["probe"]["containers"][0].update(createdAt="2026-11-20T09:00:00Z", runtimeState="exited")
    d = diagnose(parse_bundle(bundle))
    assert str(d.cause) == "ContainersStillRunning"
    (runtime,) = [e.message for e in d.evidence if e.kind == "runtime"]
    assert runtime == (
        "container app: running by its processes, though the runtime "
        "says exited (created 1h0m0s ago) — 15m0s past the deletion deadline: "
        "StopContainer has not ended it"
    )


def test_an_old_bundle_without_the_new_container_fields_still_reads() -> None:
    from pathlib import Path

    from unstick.core.model.snapshot import parse_bundle

    path = Path(__file__).parents[1] / "scenarios" / "containers-running-per-probe.json"
    facts = parse_bundle(json.loads(path.read_text()))
    assert facts.probe is not None and facts.probe.containers is not None
    assert facts.probe.containers[0].created_at is None


def test_bundle_aftermath_is_optional_and_checked() -> None:
    from unstick.core.fields import FieldError
    from unstick.core.rules.aftermath import bundle_aftermath

    assert bundle_aftermath({"pod": {}}) == {
        "waiters": [],
        "attachedElsewhere": [],
        "namespaceTerminating": False,
        "orphanedPodDirs": [],
    }
    with pytest.raises(FieldError) as err:
        bundle_aftermath({"aftermath": {"waiters": "db-0"}})
    assert err.value.field == "aftermath.waiters"
