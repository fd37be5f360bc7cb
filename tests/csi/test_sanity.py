"""The project's CSI plugin (devcluster.csi_hostpath) against the real csi-sanity of
github.com/kubernetes-csi/csi-test/v5 (built by `make tools`), with real mounts in a private
mount namespace: every spec that applies to the capabilities it declares passes, the others
are skipped for a capability it does not declare. Plus what sanity does not check: unknown
volumes, conflicts, and the lost-state NodeUnpublishVolume the OrphanedMount seed needs."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import run_unshared

pytestmark = [pytest.mark.mountns, pytest.mark.csi, pytest.mark.timeout(180)]

SCRIPT = Path(__file__).with_name("mountns_sanity.py")
# Why a spec may be skipped: a capability the plugin does not declare (and nothing else).
UNDECLARED = re.compile(
    r"^(GetSnapshot|CreateSnapshot|ControllerModifyVolume|ListSnapshots|NodeGetVolume|"
    r"NodeExpandVolume|NodeGetVolumeHealth|NodeGetStorageHealth|GroupControllerService|"
    r"GetCapacity|ListVolumes|Snapshot|Volume Cloning|Modify [vV]olume|ControllerPublishVolume|"
    r"Controller Publish, UnpublishVolume|ControllerUnpublishVolume|ControllerExpandVolume|"
    r"DeleteSnapshot|ControllerGetVolumeHealth|ControllerListVolumeHealth) not supported$"
    r"|^Service does not have single node multi writer capability$"
)
# Specs that exercise what the plugin declares; each must have run and passed.
MUST_PASS = [
    "Identity Service GetPluginCapabilities should return appropriate capabilities",
    "Identity Service Probe should return appropriate information",
    "Controller Service [Controller Server] CreateVolume should fail when requesting to create "
    "a volume with already existing name and different capacity",
    "Controller Service [Controller Server] CreateVolume should return appropriate values "
    "SingleNodeWriter WithCapacity 1Gi",
    "Controller Service [Controller Server] ValidateVolumeCapabilities should fail when the "
    "requested volume does not exist",
    "Node Service NodeUnpublishVolume should remove target path",
    "Node Service should work",
    "Node Service should be idempotent",
]


@pytest.fixture
def work() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for real mounts in a private mount namespace")
    path = Path(tempfile.mkdtemp(prefix="unstick-csi-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(work: Path, *args: str) -> dict[str, Any]:
    """mountns_sanity.py in its own mount namespace and process group, killed at the end."""
    done = run_unshared([sys.executable, str(SCRIPT), args[0], str(work), *args[1:]], 150)
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}:\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_csi_sanity_passes_every_spec_for_the_declared_capabilities(work: Path) -> None:
    binary = shutil.which("csi-sanity")
    if binary is None:
        pytest.skip("csi-sanity is not on PATH: run `make tools`")
    r = run(work, "sanity", binary)
    specs = r["specs"]
    counts = Counter(s["state"] for s in specs)
    print(f"csi-sanity: {dict(counts)} of {len(specs)} specs")
    failed = [f"{s['name']}: {s['message']}" for s in specs if s["state"] != "passed"
              and s["state"] not in ("skipped", "pending")]  # fmt: skip
    assert not failed, "\n".join(failed) + "\n" + r["output"]
    assert r["returncode"] == 0, r["output"]
    bad_skips = [f"{s['name']}: {s['message']}" for s in specs
                 if s["state"] == "skipped" and not UNDECLARED.match(s["message"])]  # fmt: skip
    assert not bad_skips, "skipped for a declared capability:\n" + "\n".join(bad_skips)
    passed = {s["name"] for s in specs if s["state"] == "passed"}
    assert [n for n in MUST_PASS if n not in passed] == []
    assert counts["passed"] >= 33
    assert r["mounts_after"] == [], "csi-sanity's mounts must all be gone"
    assert r["volumes_after"] == [], "csi-sanity's volumes must all be deleted"


def test_unknown_volumes_conflicts_and_the_lost_state_unpublish(work: Path) -> None:
    r = run(work, "behaviour")
    assert r["publish_unstaged"] == "FAILED_PRECONDITION"
    assert r["stage_unknown"] == "NOT_FOUND"
    assert r["stage_escape"] == "NOT_FOUND"  # a volume id never names a path outside data/
    assert (r["stage_a"], r["stage_a_again"]) == ("OK", "OK")
    assert r["stage_b_same_path"] == "ALREADY_EXISTS"
    assert (r["publish_a"], r["publish_a_again"]) == ("OK", "OK")
    assert r["delete_published"] == "FAILED_PRECONDITION"
    assert r["block_create"] == "INVALID_ARGUMENT"
    staging, target = str(work / "staging"), str(work / "target")
    assert sorted(r["mounts_published"]) == [staging, target]
    # the csi-driver-host-path bug, kept: state lost -> OK, and the mount stays
    assert r["unpublish_forgotten"] == "OK"
    assert target in r["mounts_after_forgotten_unpublish"]
