"""replay-unpublish never unstages a volume another pod on the node publishes, or is about
to (#33 finding 8c; mountns_replay_unstage.py: the project's CSI driver, real mounts in a
private mount namespace). The kubelet stages a volume once per node and publishes it per
pod; it writes a pod's vol_data.json right before NodePublishVolume, and believes the
volume staged until it unstages it itself."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.mountns

UNSTAGE = Path(__file__).parent / "mountns_replay_unstage.py"


@pytest.mark.parametrize("case", ["published", "publishing"])
def test_replay_keeps_the_staging_of_another_pods_volume(scenario, work: Path, case: str) -> None:
    r = scenario(case, work, script=UNSTAGE)
    replay = r["replay"]
    assert replay["result"] == "succeeded", replay
    assert "NodeUnpublishVolume(vol-1): unmounted" in replay["message"], replay
    assert r["a_mounted"] is False
    assert "not unstaged" in replay["message"], replay
    assert r["staged_after_replay"] is True
    assert r["publish_b"] in ("ok", "done before"), r["publish_b"]
    assert r["b_mounted"] is True and r["b_sees_data"] is True, r
