"""core/model/probe.py, the probe's one schema: what the agent writes (`to_json`) is what the
controller and `unstick diagnose` read (`from_json`), key for key; an older probe still
reads; a bad field is named."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from unstick.core import fields as f
from unstick.core.model import probe as schema
from unstick.core.model.kubelet_pods import ByLifecycle, KubeletPods
from unstick.core.model.probe import (
    BlockedTask,
    Container,
    DTask,
    FrozenCgroup,
    Holder,
    HungMount,
    Probe,
    VolumeDir,
)

REPO = Path(__file__).resolve().parents[2]
UID = "6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"
POD = f"/var/lib/kubelet/pods/{UID}"
LINE = f"812 29 0:52 / {POD}/volumes/kubernetes.io~nfs/data rw,relatime - nfs4 10.0.0.5:/x rw\n"

#: A probe as the agent writes it (agent/probe/collect.py): every key, in its order.
AGENT_PROBE: dict[str, Any] = {
    "nodeName": "node-a",
    "podUID": UID,
    "probedAt": "2026-11-20T10:00:00.123456Z",
    "kubeletRoot": "/var/lib/kubelet",
    "kubeletHealthy": True,
    "registeredPlugins": ["hostpath.csi.k8s.io"],
    "mountinfo": LINE,
    "volumeDirs": [{"path": f"{POD}/volumes/kubernetes.io~nfs", "empty": False}],
    "holders": [
        {
            "mountPoint": f"{POD}/volumes/kubernetes.io~nfs/data",
            "pid": 9,
            "comm": "sh",
            "via": "cwd",
        }
    ],
    "containers": [
        {
            "podUID": UID,
            "name": "app",
            "id": "c0ffee",
            "state": "running",
            "createdAt": "2026-11-20T09:00:00.000001Z",
            "runtimeState": "exited",
        },
        {"podUID": UID, "name": "(pod)", "id": "", "state": "running"},
    ],
    "podDirExists": True,
    "podDirsSeen": 3,
    "runtime": "cri+cgroup",
    "holderScan": "complete",
    "blindSpots": ["cannot read /proc/77/cgroup"],
    "containersSource": "cri+proc-cgroup",
    "dTasks": [
        {"pid": 9, "comm": "dd", "container": "c0ffee", "wchan": "rpc_wait", "stack": ["a", "b"]},
        {"pid": 10, "comm": "sh", "container": "", "wchan": ""},
    ],
    "frozenCgroups": [
        {
            "path": "/kubepods/pod1/c0ffee",
            "state": "FROZEN",
            "version": "v1",
            "container": "c0ffee",
            "selfFrozen": None,
        }
    ],
    "hungMounts": [
        {
            "mountPoint": f"{POD}/volumes/kubernetes.io~nfs/data",
            "fstype": "nfs4",
            "source": "10.0.0.5:/x",
            "waiting": None,
            "blocked": [
                {"pid": 9, "comm": "dd", "state": "D", "wchan": "rpc_wait", "via": "pod"},
                {
                    "pid": 812,
                    "comm": "kubelet",
                    "state": "D",
                    "wchan": "",
                    "via": "path",
                    "path": POD,
                },
            ],
        }
    ],
    "waitersUnknown": [f"{POD}/volumes/kubernetes.io~nfs/data"],
    "cgroupLayout": "v2",
    "cgroupDriver": "systemd",
    "kubeletPods": {
        "working": {"sync": 3, "terminating": 1, "terminated": 0},
        "orphaned": {"sync": 0, "terminating": 1, "terminated": 0},
        "desired": 3,
        "active": 3,
        "orphanedRuntimeTotal": 0,
        "restartedTotal": None,
        "unread": "the kubelet's /metrics lacks kubelet_restarted_pods_total",
    },
}


def test_what_the_agent_writes_reads_back_to_the_same_bytes() -> None:
    probe = Probe.from_json(AGENT_PROBE)
    assert json.dumps(probe.to_json()) == json.dumps(AGENT_PROBE)
    assert probe.mounts[0].mount_point == f"{POD}/volumes/kubernetes.io~nfs/data"
    assert probe.containers is not None
    assert probe.containers[0].created_at == datetime(2026, 11, 20, 9, 0, 0, 1, tzinfo=UTC)


def test_an_older_probe_with_only_the_required_keys_reads_with_nothing_reported() -> None:
    old = {k: AGENT_PROBE[k] for k in ("nodeName", "probedAt", "kubeletRoot", "mountinfo")}
    probe = Probe.from_json(old)
    assert probe.containers is None and probe.pod_uid is None and probe.runtime is None
    assert probe.holders == () and probe.hung_mounts == () and probe.waiters_unknown == ()
    assert "the probe does not say which pod UID it probed" in probe.unseen()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"holders": [{"mountPoint": "/x", "pid": 1, "comm": "", "via": "door"}]},
            r"probe\.holders\[0\]\.via",
        ),
        (
            {"containers": [{"podUID": UID, "name": "a", "id": "", "state": "gone"}]},
            r"probe\.containers\[0\]\.state",
        ),
        ({"dTasks": [{"pid": 0, "comm": "dd"}]}, r"probe\.dTasks\[0\]\.pid"),
        (
            {"frozenCgroups": [{"path": "rel", "state": "FROZEN", "version": "v1"}]},
            r"probe\.frozenCgroups\[0\]\.path",
        ),
        (
            {
                "hungMounts": [
                    AGENT_PROBE["hungMounts"][0]
                    | {"blocked": [{"pid": 1, "comm": "", "state": "R", "via": "pod"}]}
                ]
            },
            r"probe\.hungMounts\[0\]\.blocked\[0\]\.state",
        ),
        ({"volumeDirs": [{"path": "/x"}]}, r"probe\.volumeDirs\[0\]\.empty"),
        ({"mountinfo": "not mountinfo"}, r"probe\.mountinfo"),
        ({"probedAt": "yesterday"}, r"probe\.probedAt"),
        ({"runtime": "maybe"}, r"probe\.runtime"),
        ({"podDirsSeen": -1}, r"probe\.podDirsSeen"),
        ({"cgroupLayout": "v3"}, r"probe\.cgroupLayout"),
        ({"cgroupDriver": "docker"}, r"probe\.cgroupDriver"),
        ({"kubeletPods": {"desired": -1}}, r"probe\.kubeletPods\.desired"),
        ({"kubeletPods": {"working": {"sync": 1}}}, r"probe\.kubeletPods\.working\.terminating"),
    ],
)
def test_a_bad_field_is_named(change: dict[str, Any], field: str) -> None:
    with pytest.raises(f.FieldError, match=field):
        Probe.from_json(AGENT_PROBE | change)


def test_a_long_waiter_path_is_cut_on_the_wire() -> None:
    long = "/" + "p" * (2 * schema.MAX_PATH)
    written = BlockedTask(1, "ls", "D", "", "path", long).to_json()["path"]
    assert isinstance(written, str) and len(written) == schema.MAX_PATH
    assert written.endswith("…")


_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_maybe_text = st.one_of(st.just(""), _text)
_path = _text.map(lambda t: "/" + t)
_pid = st.integers(1, 2**22)
_time = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)

_volume_dirs = st.builds(VolumeDir, _path, st.booleans())
_holders = st.builds(Holder, _path, _pid, _maybe_text, st.sampled_from(schema.HOLDER_VIA))
_containers = st.builds(
    Container,
    _text,
    _text,
    _maybe_text,
    st.sampled_from(schema.CONTAINER_STATES),
    st.none() | _time,
    _maybe_text,
)
_d_tasks = st.builds(
    DTask, _pid, _maybe_text, _maybe_text, _maybe_text, st.lists(_text, max_size=3).map(tuple)
)
_frozen = st.builds(
    FrozenCgroup,
    _path,
    st.sampled_from(schema.FREEZER_STATES),
    st.sampled_from(schema.CGROUP_VERSIONS),
    _maybe_text,
    st.none() | st.booleans(),
)
_blocked = st.builds(
    BlockedTask,
    _pid,
    _maybe_text,
    st.sampled_from(schema.BLOCKED_STATES),
    _maybe_text,
    _text,
    st.one_of(st.just(""), _path),
)
_hung = st.builds(
    HungMount,
    _path,
    _text,
    _maybe_text,
    st.none() | st.integers(0, 99),
    st.lists(_blocked, max_size=3).map(tuple),
)


_counts = st.none() | st.integers(0, 2**31 - 1)
_lifecycles = st.none() | st.builds(ByLifecycle, *(st.integers(0, 99),) * 3)
_kubelet_pods = st.builds(
    KubeletPods, _lifecycles, _lifecycles, _counts, _counts, _counts, _counts, _maybe_text
)


def _tuple(s: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(s, max_size=3).map(tuple)


_PROBE_FIELDS: dict[str, st.SearchStrategy[Any]] = dict(
    node_name=_text,
    probed_at=_time,
    kubelet_root=_path,
    kubelet_healthy=st.none() | st.booleans(),
    registered_plugins=_tuple(_text),
    mountinfo=st.sampled_from(["", LINE]),
    volume_dirs=_tuple(_volume_dirs),
    holders=_tuple(_holders),
    containers=st.none() | _tuple(_containers),
    pod_uid=st.none() | _text,
    pod_dir_exists=st.none() | st.booleans(),
    pod_dirs_seen=st.none() | st.integers(0, 999),
    runtime=st.none() | st.sampled_from((*schema.RUNTIME_ANSWERED, schema.RUNTIME_UNANSWERED)),
    holder_scan=st.none()
    | st.sampled_from((schema.HOLDER_SCAN_COMPLETE, schema.HOLDER_SCAN_INCOMPLETE)),
    blind_spots=_tuple(_text),
    containers_source=st.none() | _text,
    d_tasks=_tuple(_d_tasks),
    frozen_cgroups=_tuple(_frozen),
    hung_mounts=_tuple(_hung),
    waiters_unknown=_tuple(_path),
    cgroup_layout=st.none() | st.sampled_from(schema.CGROUP_LAYOUTS),
    cgroup_driver=st.none() | st.sampled_from(schema.CGROUP_DRIVERS),
    kubelet_pods=st.none() | _kubelet_pods,
)
_probes = st.builds(Probe, **_PROBE_FIELDS)


@settings(max_examples=300, deadline=None)
@given(_probes)
def test_every_probe_survives_its_json(probe: Probe) -> None:
    """A fact missed by its class's to_json or from_json fails here."""
    wire = json.loads(json.dumps(probe.to_json()))
    assert Probe.from_json(wire) == probe
    assert Probe.from_json(wire).to_json() == wire


def test_the_generated_probes_set_every_field() -> None:
    """A new field of Probe fails here until `_PROBE_FIELDS` generates it (then the round
    trip above covers it)."""
    assert {x.name for x in dataclasses.fields(Probe) if x.init} == set(_PROBE_FIELDS)


def test_the_crd_bounds_every_key_the_probe_writes() -> None:
    """The Remediation CRD's `status.probe` lists exactly the keys of `Probe.to_json` (a new
    probe field is given its bounds there too)."""
    crd = yaml.safe_load((REPO / "operator/unstick/crds/remediations.yaml").read_text())
    schema_ = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    listed = schema_["properties"]["status"]["properties"]["probe"]["properties"]
    assert set(listed) == set(Probe.from_json(AGENT_PROBE).to_json())
