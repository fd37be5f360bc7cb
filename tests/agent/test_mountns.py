"""The agent against real mounts in a private mount namespace (see conftest.run_scenario):
probe, unmount, rmdir-stale, holders, symlinks, another pod's UID, and a real CSI node
server over gRPC including the lost-state bug."""

from __future__ import annotations

from pathlib import Path

import pytest

from unstick.core.model.snapshot import parse_probe

pytestmark = pytest.mark.mountns

UID_A = "aaaaaaaa-1111-4111-8111-aaaaaaaaaaaa"
UID_B = "bbbbbbbb-2222-4222-8222-bbbbbbbbbbbb"


def _points(mountinfo: str) -> set[str]:
    return {line.split()[4] for line in mountinfo.splitlines()}


def test_probe_finds_exactly_this_pods_mounts_and_cleanup_leaves_dirs_clean(
    scenario, work: Path
) -> None:
    r = scenario("layout", work)
    paths, probe = r["paths"], r["probe"]
    assert _points(probe["mountinfo"]) == {paths["a_csi"], paths["a_projected"], paths["a_subpath"]}
    assert set(probe) >= {
        "nodeName", "probedAt", "kubeletRoot", "kubeletHealthy", "registeredPlugins",
        "mountinfo", "volumeDirs", "holders", "containers",
    }  # fmt: skip
    assert probe["nodeName"] == "test-node"
    parsed = parse_probe(probe)  # what the core reads from status.probe
    assert {m.mount_point for m in parsed.mounts} == _points(probe["mountinfo"])
    assert probe["kubeletHealthy"] is None  # nothing listens: unknown, not False
    assert probe["holders"] == []
    assert probe["containers"] == [] and probe["containersSource"] == "proc-cgroup"
    dirs = {d["path"]: d["empty"] for d in probe["volumeDirs"]}
    assert dirs[paths["a_stale"]] is True
    assert dirs[paths["a_csi"]] is False  # a mount point: listed, never opened
    assert all(UID_A in p for p in dirs)
    assert r["unmount"]["result"] == "succeeded", r["unmount"]
    assert r["rmdir"]["result"] == "succeeded", r["rmdir"]
    mounts_after = set(r["mounts_after"])
    assert not any(UID_A in m for m in mounts_after)
    assert {paths["b_csi"], paths["b_projected"], paths["staging"]} <= mounts_after
    pod_a = str(work / "kubelet" / "pods" / UID_A)
    # volumes/ itself and the pod dir stay; so does the kubelet's vol_data.json of the CSI
    # volume: no driver is registered here, so the kubelet cannot have torn it down
    csi = pod_a + "/volumes/kubernetes.io~csi"
    kept = [csi, csi + "/pvc-a", csi + "/pvc-a/vol_data.json"]
    assert r["pod_a_tree_after"] == [pod_a + "/volumes", *kept]
    assert "CSI driver hostpath.csi.k8s.io is not registered" in r["rmdir"]["message"]
    assert r["probe_after"]["mountinfo"] == ""
    assert {d["path"] for d in r["probe_after"]["volumeDirs"]} == {csi, csi + "/pvc-a"}


def test_dry_run_changes_nothing(scenario, work: Path) -> None:
    r = scenario("dry_run", work)
    unmount, rmdir, replay = r["results"]
    assert unmount["result"] == "dry_run" and "would unmount" in unmount["message"], unmount
    assert rmdir["result"] == "dry_run", rmdir
    # no driver registered: refused even in dry-run (nothing it could call)
    assert replay["result"] == "refused" and "not registered" in replay["message"], replay
    assert r["unchanged"] is True


def test_held_mounts_are_reported_and_not_unmounted(scenario, work: Path) -> None:
    r = scenario("holders", work)
    held = {(h["mountPoint"], h["pid"], h["via"]) for h in r["probe"]["holders"]}
    assert len(parse_probe(r["probe"]).holders) == len(r["probe"]["holders"])
    comms = {(h["pid"], h["comm"]) for h in r["probe"]["holders"]}
    paths, pids = r["paths"], r["pids"]
    assert (paths["cwd"], pids["cwd"], "cwd") in held
    assert (paths["fd"], pids["fd"], "fd") in held
    assert (paths["mountns"], pids["mountns"], "mountns") in held
    assert (pids["cwd"], "sleep") in comms and (pids["fd"], "tail") in comms
    for name, result in r["refused"].items():
        assert result["result"] == "refused", (name, result)
        assert "held" in result["message"]
    assert {paths["cwd"], paths["fd"], paths["mountns"]} <= set(r["mounts_while_held"])
    # once the other namespace is gone, the same unmount goes through
    assert r["after_release"]["result"] == "succeeded", r["after_release"]
    assert paths["mountns"] not in r["mounts_after"]
    assert paths["cwd"] in r["mounts_after"]


def test_symlinks_in_the_pod_dir_are_never_followed(scenario, work: Path) -> None:
    r = scenario("symlinks", work)
    res = r["results"]
    assert res["unmount_through_symlink"]["result"] == "refused", res
    assert res["rmdir_through_symlink"]["result"] == "refused", res
    assert res["unmount_all"]["result"] == "succeeded"  # nothing of pod A is mounted
    assert res["rmdir_all"]["result"] == "failed"  # empty-dir/ holds the symlink: kept
    assert r["etc_unchanged"] is True
    assert set(r["b_mounts"]) <= set(r["mounts_after"])
    assert r["b_token"] == "secret\n"
    listed = [d["path"] for d in r["probe"]["volumeDirs"]]
    assert not any("kubernetes.io~secret" in p or p.endswith("/evil") for p in listed), listed
    assert not any(p.endswith("volume-subpaths/data/app/0") for p in listed), listed
    assert any(p.endswith("/evil") for p in r["pod_a_tree_after"])  # symlink left as it was


def test_targets_of_another_pod_are_refused(scenario, work: Path) -> None:
    r = scenario("other_uid", work)
    for key in ("unmount_b_as_a", "replay_b_as_a", "rmdir_b_as_a", "staging_as_a", "bad_uid"):
        assert r[key]["result"] == "refused", (key, r[key])
    mounts = set(r["mounts_after"])
    p = r["paths"]
    assert {p["b_csi"], p["b_projected"], p["staging"], p["a_csi"]} <= mounts


def test_replay_unpublish_with_a_healthy_driver_unmounts_and_unstages(scenario, work: Path) -> None:
    r = scenario("csi_replay", work)
    assert r["probe"]["registeredPlugins"] == ["hostpath.csi.k8s.io"]
    assert _points(r["probe"]["mountinfo"]) == {r["target"]}
    assert len(r["patches"]) == 1, "the same request must be served once"
    patch = r["patches"][0]
    replay, unmount, *rmdirs = patch["nodeActions"]
    assert replay["action"] == "replay-unpublish" and replay["result"] == "succeeded", replay
    assert "NodeUnstageVolume" in replay["message"]
    # the driver already unmounted: the planned unmount has nothing left to do
    assert unmount["result"] == "succeeded" and "nothing to do" in unmount["message"], unmount
    assert [x["result"] for x in rmdirs] == ["succeeded"] * 3, rmdirs
    assert r["target"] not in r["mounts_after"] and r["staging"] not in r["mounts_after"]
    assert patch["nodeStepsDoneAt"] >= "2026-01-01T00:00:00Z"
    assert patch["probe"]["mountinfo"] == ""
    # a driver that unpublishes now was not asked by a TearDown that succeeded: the kubelet
    # still holds the volume, and its next retry removes vol_data.json and the dir itself
    assert "vol_data.json left for it" in replay["message"], replay
    pv_dir = str(Path(r["target"]).parent)
    left = {d["path"] for d in patch["probe"]["volumeDirs"]}
    assert left == {pv_dir, str(Path(pv_dir).parent)}, left
    assert all("left for the kubelet" in x["message"] for x in rmdirs[1:]), rmdirs


def test_driver_that_lost_its_state_falls_through_to_unmount(scenario, work: Path) -> None:
    r = scenario("csi_lost_state", work)
    (patch,) = r["patches"]
    replay, unmount, rmdir = patch["nodeActions"]
    assert replay["result"] == "succeeded"
    assert "driver answered OK but the mount is still there" in replay["message"]
    assert unmount["action"] == "unmount" and unmount["result"] == "succeeded", unmount
    assert rmdir["action"] == "rmdir-stale" and rmdir["result"] == "succeeded", rmdir
    mounts = set(r["mounts_after"])
    assert r["target"] not in mounts
    assert {r["other"], r["staging"]} <= mounts  # another pod's mount and the staging stay
    assert patch["probe"]["mountinfo"] == "" and patch["probe"]["volumeDirs"] == []
    assert r["pod_a_tree_after"] == [str(work / "kubelet" / "pods" / UID_A / "volumes")]


def test_the_cores_plan_runs_through_the_agent(scenario, work: Path) -> None:
    """Live probe -> core diagnosis (OrphanedMount) and plan -> the plan's node steps via
    the handler -> fresh probe -> nothing of the pod left (KubeletNotProgressing)."""
    r = scenario("core_plan", work)
    assert r["cause_before"] == "OrphanedMount"
    actions = [a for a, _ in r["steps"]]
    assert actions[0] == "replay-unpublish" and "unmount" in actions and "rmdir-stale" in actions
    (patch,) = r["patches"]
    results = [(a["action"], a["result"]) for a in patch["nodeActions"]]
    assert len(results) == len(r["steps"])
    assert all(result == "succeeded" for _, result in results), patch["nodeActions"]
    assert r["target"] not in r["mounts_after"] and r["token"] not in r["mounts_after"]
    assert r["cause_after"] == "KubeletNotProgressing"
