"""The controller keeps a stuck pod's bound claims and volumes for a minute (caches.py
BoundVolumes): the passes over one pod read each once a minute, not once per pass."""

from __future__ import annotations

from typing import Any

from unstick.controller.deciding.caches import BoundVolumes

CLAIM = "/api/v1/namespaces/ns/persistentvolumeclaims/data"
VOLUME = "/api/v1/persistentvolumes/pv-1"


class Api:
    """The answers of an API server by path, counting the reads."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.reads: list[str] = []

    def get(self, path: str) -> Any:
        self.reads.append(path)
        return self.objects.get(path)


def _claim(phase: str, volume: str | None) -> dict[str, Any]:
    spec = {"volumeName": volume} if volume else {}
    return {"kind": "PersistentVolumeClaim", "spec": spec, "status": {"phase": phase}}


def _volume(phase: str) -> dict[str, Any]:
    spec = {"csi": {"driver": "d"}, "claimRef": {"name": "data"}}
    return {"kind": "PersistentVolume", "spec": spec, "status": {"phase": phase}}


def test_bound_claims_and_volumes_are_read_once_per_ttl() -> None:
    now = [0.0]
    api = Api({CLAIM: _claim("Bound", "pv-1"), VOLUME: _volume("Bound")})
    cache = BoundVolumes(api.get, ttl_s=60.0, clock=lambda: now[0])
    for _ in range(5):
        assert cache.get(CLAIM)["spec"]["volumeName"] == "pv-1"
        assert cache.get(VOLUME)["spec"]["csi"]["driver"] == "d"
    assert api.reads == [CLAIM, VOLUME]
    now[0] = 61.0
    cache.get(CLAIM)
    assert api.reads == [CLAIM, VOLUME, CLAIM]


def test_claims_without_a_volume_name_or_absent_objects_are_read_every_time() -> None:
    api = Api({CLAIM: _claim("Pending", None)})
    cache = BoundVolumes(api.get)
    for path in (CLAIM, "/api/v1/persistentvolumes/missing"):
        cache.get(path)
        cache.get(path)
    assert len(api.reads) == 4


def test_a_claims_volume_name_and_a_volumes_driver_are_kept_whatever_the_phase() -> None:
    """The API server lets neither change for the object's life: a claim bound without a
    status (no PV controller), a Lost claim, a Released volume are read once per ttl."""
    lost = "/api/v1/namespaces/ns/persistentvolumeclaims/lost"
    bare = "/api/v1/namespaces/ns/persistentvolumeclaims/bare"
    api = Api(
        {
            lost: _claim("Lost", "pv-1"),
            bare: {"spec": {"volumeName": "pv-1"}},
            VOLUME: _volume("Released"),
        }
    )
    cache = BoundVolumes(api.get)
    for _ in range(3):
        assert cache.get(lost)["spec"]["volumeName"] == "pv-1"
        assert cache.get(bare)["spec"]["volumeName"] == "pv-1"
        assert cache.get(VOLUME)["spec"]["csi"]["driver"] == "d"
    assert api.reads == [lost, bare, VOLUME]
