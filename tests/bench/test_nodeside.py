"""The node-side benchmark end to end at its tiny preset: real etcd + kube-apiserver, the
real `unstick controller` and `unstick agent`, real mounts in a private mount namespace,
the project's CSI plugin. Asserts behaviour, never timings: every stuck pod resolved by the
agent's node steps (replay-unpublish, unmount, rmdir-stale), nothing of the pods left on
the node, the volumes' data kept, every process, mount and directory gone at the end."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.nodeside import PRESETS, act_checks, run_node_side, run_once

pytestmark = [pytest.mark.envtest, pytest.mark.mountns, pytest.mark.timeout(300)]


def _mounts() -> set[str]:
    """The bench's own mounts seen in this namespace (its nodes' kubelet roots are
    /tmp/ubn-*; other engineers' containers may mount and unmount elsewhere meanwhile)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = {line.split()[4] for line in f if line.strip()}
    return {p for p in points if p.startswith(("/tmp/ubn-", "/tmp/unstick-bench"))}


def _check_run(run: dict[str, Any], pods: int) -> None:
    assert run["pods_gone"] == pods and run["pods_left"] == 0, run
    assert run["all_resolved_s"] is not None
    assert run["node_actions_done_s"]["n"] == pods  # every pod's steps done, all succeeded
    assert run["node_actions"]["replay-unpublish succeeded"] == pods
    assert run["node_actions"]["unmount succeeded"] == pods  # the driver forgot: agent unmounts
    assert run["node_actions"]["rmdir-stale succeeded"] >= 2 * pods  # CSI and emptyDir dirs
    assert not [k for k in run["node_actions"] if not k.endswith(" succeeded")], run
    assert run["remediation_phases"] == {"Resolved": pods}
    assert run["leftovers_on_node"] == []  # no mount, no volume dir of any stuck pod
    assert run["volumes_data_kept"] == pods  # the driver's data dirs untouched
    agent, controller = run["agent"], run["controller"]
    assert agent["probes"] >= pods and agent["rss_peak_mib"] > 0 and agent["cpu_s"] > 0
    assert agent["requests"]["patch"] >= pods  # its answers, counted from the audit log
    assert agent["requests"]["delete"] == 0  # the agent never deletes pods
    assert controller["requests"]["create"] >= pods and controller["rss_peak_mib"] > 0
    assert run["direct_probe"]["probes"] == pods


def test_tiny_node_side_benchmark_resolves_every_pod_and_leaves_nothing(tmp_path: Path) -> None:
    me = psutil.Process()
    before_children = {p.pid for p in me.children(recursive=True)}
    before_mounts = _mounts()
    before_roots = set(Path("/tmp").glob("ubn-*"))
    settings = replace(PRESETS["tiny"], logs_dir=tmp_path / "logs")
    # one of the two runs, the one with extra host mounts (the other differs only by them;
    # `make test` has no time for both)
    result = run_once(settings, settings.extra_mounts, tmp_path / "logs" / "many_mounts", print)

    _check_run(result, settings.pods)
    assert result["host_mounts"] >= settings.extra_mounts + settings.pods
    left = [p for p in me.children(recursive=True) if p.pid not in before_children]
    assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], left
    assert not _mounts() - before_mounts  # the node's mounts lived only in its namespace
    # the node's kubelet root is gone (only new ones count: another run on the machine may
    # make and remove its own meanwhile)
    assert not set(Path("/tmp").glob("ubn-*")) - before_roots


def test_tiny_node_side_benchmark_removes_its_temporary_dir() -> None:
    """Without `logs_dir` the whole work dir goes too (here: the run fails at once)."""
    before = set(Path(tempfile.gettempdir()).glob("unstick-bench-nodeside-*"))
    settings = replace(PRESETS["tiny"], setup_timeout_s=0.0)
    with pytest.raises(RuntimeError, match="did not come up"):
        run_node_side(settings, print)
    assert set(Path(tempfile.gettempdir()).glob("unstick-bench-nodeside-*")) == before


@pytest.mark.parametrize("peer", ["naive", "kubelet"])
def test_tiny_peer_runs_resolve_every_pod_and_leave_nothing_running(
    tmp_path: Path, peer: str
) -> None:
    """The peers of issue 23 at the tiny size: the naive loop force-deletes every pod after
    its lazy unmounts (the staging mounts and the kubelet's files stay behind: it calls no
    driver); the kubelet's own teardown with a healthy driver leaves nothing."""
    from bench.nodeside_peers import run_peer

    me = psutil.Process()
    before_children = {p.pid for p in me.children(recursive=True)}
    before_mounts = _mounts()
    settings = replace(PRESETS["tiny"], logs_dir=tmp_path / "logs")
    r = run_peer(settings, settings.extra_mounts, tmp_path / "logs" / peer, print, peer)

    assert r["pods_gone"] == settings.pods and r["pods_left"] == 0, r
    assert r["all_resolved_s"] is not None and r["all_gone_after_deletion_s"] is not None
    assert r["volumes_data_kept"] == settings.pods
    assert r["agent"]["rss_peak_mib"] > 0 and r["host_mounts"] >= settings.extra_mounts
    if peer == "naive":
        assert r["staging_mounts_left"] == settings.pods  # no NodeUnstageVolume
        assert r["leftovers_on_node"] == settings.pods  # each CSI volume dir (vol_data.json)
    else:
        assert r["staging_mounts_left"] == 0 and r["leftovers_on_node"] == 0
    left = [p for p in me.children(recursive=True) if p.pid not in before_children]
    assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], left
    assert _mounts() == before_mounts


def test_act_checks_are_counted_from_the_node_steps_messages() -> None:
    rems = [
        {"status": {"nodeActions": [
            {"message": "unmounted /a [acts 1, each right after its own checks: table "
                        "re-read 1]"},
            {"message": "removed 3 empty directories [acts 3, each right after its own "
                        "checks: table re-read 1, table unchanged 2]"},
        ]}},
        {"status": {"nodeActions": [
            {"message": "x [acts 2, only 1 right after their own checks: table unchanged 1]"},
            {"message": "no volume directories left (nothing to do)"},
        ]}},
        {"status": {}},
    ]  # fmt: skip
    assert act_checks(rems) == {
        "acts": 6, "after_fresh_checks": 5, "table_re_read": 2, "table_unchanged": 3,
    }  # fmt: skip
