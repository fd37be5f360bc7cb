"""The controller keeps a stuck pod's bound claims and volumes for a minute (caches.py
BoundVolumes): the passes over one pod read each once a minute, not once per pass; those
its list+watch of claims and volumes holds (WatchedVolumes) not at all."""

from __future__ import annotations

from typing import Any

from unstick.controller.deciding.caches import (
    CLAIMS,
    VOLUMES,
    BoundVolumes,
    WatchedVolumes,
    volume_fact,
    volume_object,
    volume_path,
)
from unstick.core.model.snapshot import _claims, _pv_drivers

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


# --- claims and volumes kept by a list+watch (caches.WatchedVolumes, issue 34) ---------------


def _watched_claim(volume: str | None) -> dict[str, Any]:
    return {"metadata": {"name": "data", "namespace": "ns", "managedFields": [{}]},
            **_claim("Bound", volume)}  # fmt: skip


def _watched_volume() -> dict[str, Any]:
    return {"metadata": {"name": "pv-1", "uid": "u"}, **_volume("Bound")}


def test_watched_claims_and_volumes_cost_no_request() -> None:
    """A bound claim and any volume the watches delivered: read from them, only their
    volumeName and driver kept; a claim without a volumeName is not kept (read every
    time); a deleted one is forgotten; a relist replaces everything."""
    claims = WatchedVolumes(None, CLAIMS, "claims")
    volumes = WatchedVolumes(None, VOLUMES, "volumes")
    claims.relist_begin()
    claims.listed(_watched_claim("pv-1"))
    claims.listed({**_watched_claim(None), "metadata": {"name": "new", "namespace": "ns"}})
    claims.relist_end()
    volumes.changed("ADDED", _watched_volume())
    api = Api({CLAIM: _claim("Bound", "pv-1"), VOLUME: _volume("Bound")})
    cache = BoundVolumes(api.get, watched=lambda p: claims.peek(p) or volumes.peek(p))
    assert cache.get(CLAIM) == {
        "metadata": {"name": "data", "namespace": "ns"},
        "spec": {"volumeName": "pv-1"},
    }
    assert cache.peek(VOLUME) == {"metadata": {"name": "pv-1"}, "spec": {"csi": {"driver": "d"}}}
    assert api.reads == [] and len(claims) == 1
    cache.get("/api/v1/namespaces/ns/persistentvolumeclaims/new")
    assert api.reads == ["/api/v1/namespaces/ns/persistentvolumeclaims/new"]
    volumes.changed("DELETED", _watched_volume())
    claims.relist_begin()
    claims.relist_end()  # the claim is gone too
    assert claims.peek(CLAIM) is None and volumes.peek(VOLUME) is None
    cache.get(VOLUME)
    assert api.reads[-1] == VOLUME


def test_what_the_diagnosis_reads_of_a_watched_claim_and_volume_is_what_a_get_gives() -> None:
    """The bundle parser finds the same driver in the kept facts as in the objects."""
    full = {"persistentVolumeClaims": [_watched_claim("pv-1")],
            "persistentVolumes": [_watched_volume()]}  # fmt: skip
    kept = {
        key: [volume_object(str(volume_path(o)), str(volume_fact(o))) for o in objs]
        for key, objs in full.items()
    }
    assert _claims(kept, "ns") == _claims(full, "ns") == {"data": "pv-1"}
    assert _pv_drivers(kept) == _pv_drivers(full) == {"pv-1": "d"}
    assert volume_path(_watched_claim("pv-1")) == CLAIM and volume_path(_watched_volume()) == VOLUME
