"""Issue 33 finding 6: a finalizer owner's Lease is judged on the reader's clock, as
client-go's leader election does — never by comparing the holder's `renewTime` with the
reader's clock. Over a real kube-apiserver: an owner whose node's clock lags by years
renews its Lease (renewTime "2020-…", resourceVersion moving); `OwnerLeases` (the
controller's reader, `controller/deciding/owner_leases.py`) remembers when it saw the
Lease change, and the diagnosis keeps the allowlisted finalizer while the Lease moves. Once
the reader has seen it unchanged for longer than twice its duration (timed on the reader's
clock, injected here) the owner is gone from that read on, and after
`finalizerOwnerGoneSeconds` more the finalizer may be removed.

On main the renewTime of 2020 made the owner "gone for years" at the first read: the
finalizer was removable while its owner was renewing."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import ControlPlane
from tests.support.bundles import bundle, pod
from unstick.controller.deciding.owner_leases import OwnerLeases, bundle_keys
from unstick.core.model.facts import LEASE
from unstick.core.model.snapshot import parse_bundle
from unstick.core.policy.planner import plan
from unstick.core.policy.remediation_policy import parse_policy
from unstick.core.remediation import rfc3339
from unstick.core.rules.diagnosis import diagnose
from unstick.core.rules.finalizer_owners import FinalizerOwner, OwnerRef
from unstick.core.vocabulary import Action
from unstick.kube.client import ClientSettings, Kube

pytestmark = pytest.mark.envtest

OWNED = "example.com/protect"
T0 = 1_800_000_000.0  # the reader's wall clock at the first read (2027-01-15T08:00:00Z)


def _lease(namespace: str, renewed: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "example-leader", "namespace": namespace},
        "spec": {"holderIdentity": "op-1", "leaseDurationSeconds": 15, "renewTime": renewed},
    }


def test_a_lease_renewed_by_a_lagging_clock_is_alive_until_it_stops_changing(
    control_plane: ControlPlane, namespace: str
) -> None:
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    ref = {"namespace": namespace, "name": "example-leader"}
    mapping = [FinalizerOwner("example.com/", OwnerRef(LEASE, namespace, "example-leader"))]
    wall = [T0]
    owners = OwnerLeases(kube, lambda: mapping, ttl_s=0.0, wall=lambda: wall[0])
    the_pod = {"metadata": {"finalizers": [OWNED], "deletionGracePeriodSeconds": 0}, "spec": {}}
    policy = parse_policy(
        {
            "actions": ["observe", "remove-finalizer"],
            "finalizerAllowlist": [OWNED],
            "finalizerOwners": [{"prefix": "example.com/", "lease": ref}],
            "finalizerOwnerGoneSeconds": 60,
        }
    )

    def read(at: float) -> tuple[list[Action], str]:
        """The reader reads at `at` (its wall clock); the diagnosis of a bundle captured
        then: the plan's actions and the owner's evidence."""
        wall[0] = at
        b = bundle(the_pod=pod(node=None, grace=0, finalizers=[OWNED]))
        b |= {"capturedAt": rfc3339(at)} | bundle_keys(owners.for_pod(the_pod))
        d = diagnose(parse_bundle(b), policy.settings)
        words = " ".join(e.message for e in d.evidence if e.kind == "finalizer")
        return [s.action for s in plan(d, policy).steps], words

    try:
        kube.request("POST", path, body=_lease(namespace, "2020-01-01T00:00:00.000000Z"))
        actions, words = read(T0)  # first sight: held (client-go), whatever renewTime says
        assert actions == [Action.OBSERVE], words
        assert "was first read 0s ago and has not changed since" in words
        assert "its renewTime says" in words and "by its holder's clock" in words
        for i in range(1, 4):  # the owner renews every 20 s (its clock: 2020, slow)
            lease = kube.get(f"{path}/example-leader")
            lease["spec"]["renewTime"] = f"2020-01-01T00:0{i}:00.000000Z"
            kube.request("PUT", f"{path}/example-leader", body=lease)
            actions, words = read(T0 + 20 * i)
            assert actions == [Action.OBSERVE], words  # alive: not removable
            assert "was seen renewed 0s ago by op-1" in words, words
        last_change = T0 + 60
        actions, words = read(last_change + 30)  # unchanged for 30 s: not yet > 2x15 s
        assert actions == [Action.OBSERVE] and "it is alive" in words, words
        actions, words = read(last_change + 31)  # > 2x15 s: gone since the last change
        assert "has not changed for 31s on this reader's clock" in words, words
        assert "seems gone" in words and actions == [Action.OBSERVE]  # 31 s ≤ 60 s
        actions, words = read(last_change + 61)  # gone for longer than the 60 s setting
        assert actions == [Action.REMOVE_FINALIZER], words
    finally:
        kube.request("DELETE", f"{path}/example-leader")
        kube.close()
