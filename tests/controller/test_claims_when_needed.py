"""The controller's decisions read a stuck pod's claims and volumes only when the diagnosis
reads a CSI volume's driver (deciding/inputs.py `drivers_needed`): with the round trip the
agent's answer shows nothing of the pod left, as a rule, and its claim and volume were two
GETs per pod for nothing (issue 34: 11.9 requests per pod in the 100-pod bench, 2.0 of
them these)."""

from __future__ import annotations

from typing import Any

import pytest

from unstick.controller.deciding.inputs import NodeInputs, build_bundle, drivers_needed

CLAIM = "/api/v1/namespaces/ns/persistentvolumeclaims/data"
VOLUME = "/api/v1/persistentvolumes/pv-1"
UID = "0e684b68-d78a-4be6-a7b3-da1cdb3c590b"
ROOT = "/var/lib/kubelet"
MOUNT = f"{ROOT}/pods/{UID}/volumes/kubernetes.io~csi/pv-1/mount"

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": UID},
    "spec": {
        "nodeName": "n",
        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}],
    },
}


def _probe(mountinfo: str = "", dirs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"podUID": UID, "nodeName": "n", "kubeletRoot": ROOT, "mountinfo": mountinfo,
            "volumeDirs": dirs or []}  # fmt: skip


NOTHING_LEFT = _probe()
A_MOUNT = _probe(f"4021 29 0:52 / {MOUNT} rw,relatime shared:1 - tmpfs tmpfs rw\n")
A_FULL_DIR = _probe(dirs=[{"path": MOUNT.removesuffix("/mount"), "empty": False}])
EMPTY_DIRS = _probe(dirs=[{"path": MOUNT.removesuffix("/mount"), "empty": True}])


def _reads(probe: Any, *, if_needed: bool = True) -> list[str]:
    reads: list[str] = []
    objects = {CLAIM: {"spec": {"volumeName": "pv-1"}}, VOLUME: {"spec": {"csi": {"driver": "d"}}}}

    def get(path: str) -> Any:
        reads.append(path)
        return objects.get(path)

    sources = NodeInputs(node=lambda _n: None, csi_node=lambda _n: None, get=get)
    bundle = build_bundle(None, POD, probe, 0.0, sources, with_attachments=False,
                          claims_if_needed=if_needed)  # fmt: skip
    assert len(bundle["persistentVolumeClaims"]) == len(reads) // 2
    return reads


@pytest.mark.parametrize(
    "probe", [None, NOTHING_LEFT, EMPTY_DIRS], ids=["none", "nothing", "empty"]
)
def test_no_claim_or_volume_is_read_when_no_driver_is_needed(probe: Any) -> None:
    assert not drivers_needed(probe)
    assert _reads(probe) == []


@pytest.mark.parametrize(
    "probe", [A_MOUNT, A_FULL_DIR, "not an object"], ids=["mount", "dir", "bad"]
)
def test_claim_and_volume_are_read_when_the_diagnosis_reads_a_driver(probe: Any) -> None:
    assert drivers_needed(probe)
    assert _reads(probe) == [CLAIM, VOLUME]


def test_a_snapshot_for_people_has_them_always() -> None:
    assert _reads(NOTHING_LEFT, if_needed=False) == [CLAIM, VOLUME]
