"""CSIDriverMissing after unstick's unmount (docs/csi.md): the agent kept the kubelet's
vol_data.json, so the CSI volume dir is left, not empty, and nothing is mounted. The cause
stays CSIDriverMissing (not StaleVolumeDirs): no step, rmdir-stale and force-delete refused
with the reason, until the driver is back and the kubelet finishes."""

from __future__ import annotations

from tests.support.bundles import (
    DRIVER,
    PV,
    bundle,
    csi_mount_path,
    csi_node,
    pod,
    pod_path,
    probe,
    pv,
    pvc,
    pvc_volume,
)
from unstick.core.model.snapshot import parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.rules.diagnosis import diagnose
from unstick.core.vocabulary import Action, Cause

PV_DIR = csi_mount_path().rsplit("/", 1)[0]
CSI_DIR = pod_path("volumes/kubernetes.io~csi")


def left_after_unmount(*, registered: bool, empty: bool = False) -> dict[str, object]:
    drivers = [DRIVER] if registered else []
    return bundle(
        the_pod=pod(volumes=[pvc_volume()]),
        pvcs=[pvc()],
        pvs=[pv()],
        the_csi_node=csi_node(drivers),
        the_probe=probe(
            plugins=drivers,
            dirs=[(CSI_DIR, False), (PV_DIR, empty)],
            containers=[("app", "exited")],
        ),
    )


def test_the_kept_vol_data_keeps_the_cause_and_asks_for_nothing() -> None:
    d = diagnose(parse_bundle(left_after_unmount(registered=False)))
    assert d.cause is Cause.CSIDriverMissing
    assert any(PV in e.message and "kubelet still holds" in e.message for e in d.evidence)
    p = plan(d, None)
    assert [s.action for s in p.steps if s.action is not Action.OBSERVE] == []
    refused = {r.action: r.reason for r in p.refused}
    for action in (Action.RMDIR_STALE, Action.FORCE_DELETE):
        assert "once the driver is back" in refused[action], refused


def test_with_the_driver_back_the_dirs_are_stale_as_before() -> None:
    d = diagnose(parse_bundle(left_after_unmount(registered=True)))
    assert d.cause is Cause.StaleVolumeDirs


def test_an_empty_csi_volume_dir_is_not_the_kubelets() -> None:
    d = diagnose(parse_bundle(left_after_unmount(registered=False, empty=True)))
    assert d.cause is Cause.StaleVolumeDirs
