"""Issue #25, hung mounts, on real parts: a real FUSE filesystem (fuse_stub.py speaks the
kernel's protocol over /dev/fuse) serves a pod volume in a private mount namespace, and
SIGSTOP turns its daemon into a dead server — the stand-in for a hard NFS mount whose
server is gone. The probe finds it without touching the mount (mountinfo, the fusectl
connection's `waiting`, /proc of its holders); the diagnosis names the source; the node
step `lazy-unmount` is refused while a process holds the mount and detaches it once none
does. Every process (daemon included) is killed and every mount goes with the namespace."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from unstick.core.model.snapshot import parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Action, Cause

pytestmark = [
    pytest.mark.mountns,
    pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse on this machine"),
]

HUNG = Path(__file__).parent / "mountns_hung.py"
UID_A = "aaaaaaaa-1111-4111-8111-aaaaaaaaaaaa"


def _bundle(probe: dict[str, Any], containers: str = "terminated") -> dict[str, Any]:
    """Pod A (deleted long ago) on a Ready node; its volume `data` is an NFS-style PV."""
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    return {
        "apiVersion": "unstick.dev/v1alpha1", "kind": "Snapshot",
        "capturedAt": probe["probedAt"],
        "pod": {
            "metadata": {
                "name": "web-0", "namespace": "default", "uid": UID_A,
                "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 30,
            },
            "spec": {
                "nodeName": "test-node",
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            },
            "status": {"containerStatuses": [{"name": "app", "state": {containers: {}}}]},
        },
        "node": {"metadata": {"name": "test-node"}, "status": {"conditions": [ready]}},
        "csiNode": None,
        "persistentVolumeClaims": [{
            "metadata": {"name": "data", "namespace": "default"}, "spec": {"volumeName": "pv-data"},
        }],
        "persistentVolumes": [{"metadata": {"name": "pv-data"}, "spec": {"nfs": {}}}],
        "volumeAttachments": [], "events": [],
        "probe": probe,
    }  # fmt: skip


def _diagnosed(probe: dict[str, Any]) -> tuple[Any, Any]:
    d = diagnose(parse_bundle(_bundle(probe)))
    return d, plan(d, None)


def _run_once(name: str, prefix: str) -> Any:
    """A module fixture: the result of HUNG's scenario `name`, run once for the module in a
    short work dir `/tmp/<prefix>-<pid>` (removed afterwards), no mount of it leaked into
    the host's namespace. (The conftest's helpers come as fixtures, not `from conftest
    import ...`: in a whole-suite run `conftest` may be another directory's, found first.)"""

    @pytest.fixture(scope="module")
    def run(
        scenario: Callable[..., dict[str, Any]], host_mounts: Callable[[Path], list[str]]
    ) -> dict[str, Any]:
        work = Path("/tmp") / f"{prefix}-{os.getpid()}"
        try:
            result = scenario(name, work, script=HUNG)
            assert host_mounts(work) == [], "a mount leaked into the host namespace"
            return result
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return run


stopped = _run_once("fuse_stopped", "uh")


def test_the_probe_finds_a_held_hung_fuse_mount_without_touching_it(stopped: dict) -> None:
    hung = stopped["held"]["hungMounts"]
    assert [h["mountPoint"] for h in hung] == [stopped["vol"]]
    assert hung[0]["fstype"] == "fuse.stub" and hung[0]["source"] == stopped["source"]
    assert hung[0]["waiting"] >= 1
    blocked = {(b["pid"], b["via"], b["wchan"]) for b in hung[0]["blocked"]}
    assert (stopped["holder"], "cwd", "request_wait_answer") in blocked


def test_a_held_hung_mount_is_diagnosed_with_its_server_and_not_unmounted(stopped: dict) -> None:
    d, p = _diagnosed(stopped["held"])
    assert d.cause is Cause.HungMount
    words = " ".join(e.message for e in d.evidence)
    assert f"the FUSE daemon serving {stopped['source']} (fuse.stub) does not answer" in words
    assert f"pid {stopped['holder']} (" in words
    assert ", holds it via cwd) waits in `request_wait_answer`" in words
    assert p.actions == (Action.OBSERVE,)
    assert {r.action for r in p.refused} >= {
        Action.LAZY_UNMOUNT,
        Action.UNMOUNT,
        Action.FORCE_DELETE,
    }
    r = stopped["refused_held"]
    assert r["result"] == "refused" and f"pid {stopped['holder']} (" in r["message"], r
    assert "via cwd" in r["message"], r


def test_lazy_unmount_refuses_what_is_not_a_hung_mount_of_the_pod(stopped: dict) -> None:
    assert stopped["refused_tmpfs"]["result"] == "refused"
    assert "not one network or FUSE mount (tmpfs)" in stopped["refused_tmpfs"]["message"]
    assert stopped["refused_other"]["result"] == "refused"
    assert "not under this pod's volumes/" in stopped["refused_other"]["message"]
    assert stopped["projected_mounted_after"] is True


def test_an_unheld_hung_mount_is_lazily_unmounted(stopped: dict) -> None:
    hung = stopped["unheld"]["hungMounts"]
    assert [h["mountPoint"] for h in hung] == [stopped["vol"]] and hung[0]["waiting"] >= 1
    # the waiting `stat` holds nothing: found by its blocked system call (agent/mount_waiters)
    assert [(b["pid"], b["via"], b["path"]) for b in hung[0]["blocked"]] == [
        (stopped["checker"], "path", stopped["vol"])
    ]
    assert stopped["unheld"]["holders"] == []
    d, p = _diagnosed(stopped["unheld"])
    assert d.cause is Cause.HungMount
    assert [(s.action, s.target) for s in p.steps] == [(Action.LAZY_UNMOUNT, stopped["vol"])]
    assert stopped["dry"]["result"] == "dry_run" and stopped["mounted_after_dry"] is True
    assert stopped["done"]["result"] == "succeeded", stopped["done"]
    assert stopped["mounted_after"] is False


def test_a_fuse_mount_whose_daemon_answers_is_not_hung(scenario, work: Path) -> None:
    r = scenario("fuse_answering", work, script=HUNG)
    assert r["probe"]["hungMounts"] == []
    assert [h["via"] for h in r["probe"]["holders"]] == ["cwd"]
    d, _ = _diagnosed(r["probe"])
    assert d.cause is Cause.MountBusy


def test_only_a_client_waiting_for_its_server_counts_as_blocked() -> None:
    from unstick.agent.probe.hung_mounts import waits_in

    asked = ("request_wait_answer", "__fuse_simple_request", "fuse_lookup_name")
    assert waits_in("fuse", "request_wait_answer", asked) == "request_wait_answer"
    assert waits_in("fuse", "", asked) == "request_wait_answer"
    # a FUSE daemon (a sidecar of the pod, say) idle, waiting for requests: not blocked
    assert waits_in("fuse", "fuse_dev_do_read", ("fuse_dev_do_read", "fuse_dev_read")) is None
    assert waits_in("nfs", "rpc_wait_bit_killable", ()) == "rpc_wait_bit_killable"
    assert waits_in("nfs", "do_wait", ("do_wait", "kernel_wait4")) is None
    assert waits_in("ext4", "request_wait_answer", ()) is None


@pytest.mark.skipif(
    not os.access("/sys/fs/cgroup/pids", os.W_OK), reason="needs a writable pids cgroup"
)
def test_a_process_of_the_pod_waiting_on_the_dead_server_is_named(scenario, work: Path) -> None:
    r = scenario("fuse_pod_process", work, script=HUNG)
    hung = r["probe"]["hungMounts"]
    assert [h["mountPoint"] for h in hung] == [r["vol"]]
    assert [(b["pid"], b["via"], b["wchan"]) for b in hung[0]["blocked"]] == [
        (r["pid"], "pod", "request_wait_answer")
    ]
    assert r["probe"]["holders"] == []  # it holds nothing: only its wait ties it to the mount
    d, p = _diagnosed(r["probe"])
    assert d.cause is Cause.HungMount
    words = " ".join(e.message for e in d.evidence)
    assert f"pid {r['pid']} (stat, a process of the pod) waits in `request_wait_answer`" in words
    assert p.actions == (Action.OBSERVE,)  # its container still runs: no lazy unmount
    assert r["refused"]["result"] == "refused", r["refused"]


outside = _run_once("fuse_outside_waiter", "uw")


def test_waiters_outside_the_pod_are_found_from_their_blocked_system_calls(outside: dict) -> None:
    vol = outside["vol"]
    want = {(outside["stat"], "stat", vol), (outside["cat"], "cat", f"{vol}/missing.txt")}
    assert {(w["pid"], w["comm"], w["path"]) for w in outside["waiters"]} == want
    assert {w["wchan"] for w in outside["waiters"]} == {"request_wait_answer"}
    assert f"pid {outside['stat']} (stat) waits in request_wait_answer on {vol}" in [
        w["words"] for w in outside["waiters"]
    ]
    for probe in (outside["probe"], outside["probe_no_fusectl"]):
        assert probe["holders"] == [] and probe["containers"] == []
        (hung,) = probe["hungMounts"]
        assert hung["mountPoint"] == vol
        blocked = {(b["pid"], b["via"], b["path"]) for b in hung["blocked"]}
        assert blocked == {(pid, "path", path) for pid, _, path in want}
    assert outside["probe"]["hungMounts"][0]["waiting"] >= 2
    assert outside["probe_no_fusectl"]["hungMounts"][0]["waiting"] is None


def test_outside_waiters_alone_make_it_hung_and_plan_a_lazy_unmount(outside: dict) -> None:
    d, p = _diagnosed(outside["probe_no_fusectl"])  # the waiting count not read at all
    assert d.cause is Cause.HungMount
    words = " ".join(e.message for e in d.evidence)
    assert f"the FUSE daemon serving {outside['source']} (fuse.stub) does not answer" in words
    assert (
        f"pid {outside['stat']} (stat, outside the pod, holding nothing) waits in "
        f"`request_wait_answer` on {outside['vol']}"
    ) in words
    assert [(s.action, s.target) for s in p.steps] == [(Action.LAZY_UNMOUNT, outside["vol"])]
    assert Action.UNMOUNT in {r.action for r in p.refused}


def test_the_executor_refuses_a_plain_unmount_of_a_mount_with_waiters(outside: dict) -> None:
    for step in (outside["plain"], outside["plain_all"]):
        assert step["result"] == "refused", step
        assert f"pid {outside['stat']} (stat) waits in request_wait_answer on" in step["message"]
        assert "a plain unmount would hang too" in step["message"]
    assert outside["mounted_after_refusals"] is True
    assert outside["done"]["result"] == "succeeded", outside["done"]
    assert outside["mounted_after"] is False


def test_a_waiter_whose_path_cannot_be_told_blocks_the_plain_unmount(scenario, work: Path) -> None:
    r = scenario("fuse_unreadable_waiter", work, script=HUNG)
    assert r["waiters"] == []  # `..` is never resolved: nobody is named
    assert len(r["unknown"]) == 1 and f"pid {r['pid']} (stat)" in r["unknown"][0]
    assert "is not resolved (`..`)" in r["unknown"][0]
    (hung,) = r["probe"]["hungMounts"]  # hung by FUSE's count, nobody blocked by name
    assert hung["blocked"] == [] and hung["waiting"] >= 1
    assert r["plain"]["result"] == "refused", r["plain"]
    assert "cannot tell whether tasks blocked in a path lookup wait on" in r["plain"]["message"]
    assert r["mounted_after"] is True
    # the probe says so: a blind spot naming the mount, and the mount in waitersUnknown
    assert r["probe"]["waitersUnknown"] == [r["vol"]]
    assert [b for b in r["probe"]["blindSpots"] if r["vol"] in b and f"pid {r['pid']}" in b]
    d, p = _diagnosed(r["probe"])
    assert [m.waiters_unknown for m in d.mounts] == [True]
    assert not {Action.UNMOUNT, Action.REPLAY_UNPUBLISH} & set(p.actions), p


def test_replay_unpublish_refuses_a_mount_with_a_waiter_and_never_calls_the_driver(
    scenario, work: Path
) -> None:
    r = scenario("fuse_csi_replay_waiter", work, script=HUNG)
    for refused in (r["refused"], r["refused_dry"]):
        assert refused["result"] == "refused", refused
        assert (
            f"pid {r['stat']} (stat) waits in request_wait_answer on {r['vol']}"
            in (refused["message"])
        )
        assert "a plain unmount would hang too, not unmounting" in refused["message"]
    assert r["calls_after_refusals"] == []  # the driver was never called
    # the waiter gone, the same step calls the driver (which answers OK, changing nothing)
    assert r["replayed"]["result"] == "succeeded", r["replayed"]
    assert ["NodeUnpublishVolume", "vol-fuse", r["vol"]] in r["calls"]


def test_lazy_unmount_refuses_when_a_mount_below_the_hung_one_is_held(scenario, work: Path) -> None:
    """MNT_DETACH takes the hung mount's whole subtree: a holder of a mount below it (an
    NFSv4 submount, say) holds what the step would detach, so the step is refused and
    names it (design.md §3 invariant 2: no holders)."""
    r = scenario("fuse_held_submount", work, script=HUNG)
    assert r["step"]["result"] == "refused", r["step"]
    assert f"{r['sub']} is held: pid {r['holder']} (sleep) via cwd" in r["step"]["message"]
    assert r["vol_mounted_after"] is True and r["sub_mounted_after"] is True
