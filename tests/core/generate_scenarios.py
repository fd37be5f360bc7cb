"""Writes tests/scenarios/*.json: one bundle per case of design.md §2-3, each with `expect`.

Run `.venv/bin/python tests/unit/generate_scenarios.py` after changing a case; the test
`test_committed_scenarios_are_generated` fails when the files and this script disagree.

`expect` keys: cause; planAnyOf (one of these must be planned, if non-empty); mustNotPlan;
plan (the exact ordered list of planned actions); refused (actions that must appear in
`refused`); evidence (substrings that must appear in some evidence message); policy (a
RemediationPolicy spec to apply, with opt-in from the pod's annotation, as
`unstick diagnose --policy` does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.bundles import (
    CLOUD_SHUTDOWN,
    DRIVER,
    OTHER_UID,
    PV,
    ROOT,
    UID,
    bundle,
    claimed_volume,
    csi_mount_path,
    csi_node,
    far,
    holder,
    hung_mount,
    inline_csi_volume,
    mount_line,
    node,
    pod,
    pod_path,
    probe,
    pv,
    pvc,
    pvc_volume,
    snr,
    staging_line,
)
from tests.support.cni_events import kill_pod_event

OUT = Path(__file__).resolve().parent.parent / "scenarios"
ALL_NODE = [
    "replay-unpublish",
    "unmount",
    "lazy-unmount",
    "rmdir-stale",
    "thaw",
    "restart-kubelet",
]
CHANGING = [*ALL_NODE, "force-delete", "remove-finalizer"]
EVERYTHING = {"actions": ["observe", *CHANGING], "dryRun": False}
CSI = claimed_volume()
DATA = [pvc_volume()]
MOUNT = csi_mount_path()
SUBPATH = pod_path("volume-subpaths/data/app/0")
PROJECTED = pod_path("volumes/kubernetes.io~projected/kube-api-access-x7k2p")


D_TASK = {"pid": 4711, "comm": "dd", "container": "id-app", "wchan": "nfs_wait_bit_killable"}


def frozen(path: str, container: str = "id-app") -> dict[str, Any]:
    """A frozenCgroups entry of the probe (issue #25), v1 freezer, frozen itself."""
    return {
        "path": path,
        "state": "FROZEN",
        "version": "v1",
        "container": container,
        "selfFrozen": True,
    }


NFS_VOLUME = pod_path(f"volumes/kubernetes.io~nfs/{PV}")


def with_records(b: dict[str, Any], **records: list[dict[str, Any]]) -> dict[str, Any]:
    """`b` with the optional keys `fenceAgentsRemediations`/`selfNodeRemediations` (given
    by their names), `expect` kept last."""
    expect = b.pop("expect")
    return b | records | {"expect": expect}


LOST = {"ready": "Unknown", "since": "2026-11-20T09:40:00Z", "reason": "NodeStatusUnknown"}
#: a policy that trusts every fencing source, FARs from namespace medik8s
ALL_FENCING = EVERYTHING | {
    "fencingEvidence": [
        "outOfServiceTaint",
        "cloudShutdown",
        "fenceAgentsRemediation",
        "selfNodeRemediation",
    ],
    "fenceAgentsRemediationNamespaces": ["medik8s"],
}


def fencing_cases(c: dict[str, dict[str, Any]]) -> None:
    """NodeUnreachable fenced by each source the policy may trust (docs/fencing.md), and
    the same record when it proves nothing."""
    fenced = e("NodeUnreachable", plan=["force-delete"], never=ALL_NODE, policy=ALL_FENCING)
    observed = e(
        "NodeUnreachable",
        plan=["observe"],
        never=CHANGING,
        refused=["force-delete"],
        policy=ALL_FENCING,
    )
    c["node-unreachable-fenced-by-cloud-shutdown"] = bundle(
        the_node=node(**LOST, taints=[CLOUD_SHUTDOWN]),
        expect=fenced | {"evidence": ["fenced by cloudShutdown", CLOUD_SHUTDOWN["key"]]},
    )
    c["node-unreachable-cloud-shutdown-not-trusted"] = bundle(
        the_node=node(**LOST, taints=[CLOUD_SHUTDOWN]),
        expect=observed
        | {
            "policy": EVERYTHING,
            "evidence": ["NOT fenced", "the policy does not list cloudShutdown"],
        },
    )
    c["node-unreachable-fenced-by-fence-agents-remediation"] = with_records(
        bundle(
            the_node=node(**LOST),
            expect=fenced
            | {
                "evidence": [
                    "fenced by fenceAgentsRemediation",
                    "FenceAgentsRemediation medik8s/node-1",
                    "2026-11-20T09:44:00Z",
                ]
            },
        ),
        fenceAgentsRemediations=[far(succeeded="2026-11-20T09:44:00Z")],
    )
    c["node-unreachable-fence-agents-remediation-before-last-ready"] = with_records(
        bundle(
            the_node=node(**LOST),
            expect=observed | {"evidence": ["NOT fenced", "predates the node's last Ready"]},
        ),
        fenceAgentsRemediations=[far(succeeded="2026-11-19T09:44:00Z")],
    )
    c["node-unreachable-fence-agents-remediation-namespace-not-named"] = with_records(
        bundle(
            the_node=node(**LOST),
            expect=observed | {"evidence": ["NOT fenced", "namespace tenant is not one"]},
        ),
        fenceAgentsRemediations=[far(namespace="tenant")],
    )
    c["node-unreachable-fenced-by-self-node-remediation"] = with_records(
        bundle(
            the_node=node(**LOST),
            expect=fenced
            | {"evidence": ["fenced by selfNodeRemediation", "SelfNodeRemediation medik8s/node-1"]},
        ),
        selfNodeRemediations=[snr(rebooted="2026-11-20T09:46:00Z")],
    )
    c["node-unreachable-self-node-remediation-not-yet-rebooted"] = with_records(
        bundle(
            the_node=node(**LOST),
            expect=observed | {"evidence": ["NOT fenced", "has not passed yet"]},
        ),
        selfNodeRemediations=[snr(rebooted="2026-11-20T10:03:00Z")],
    )


def e(cause: str, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"cause": cause, "planAnyOf": [], "mustNotPlan": []}
    for key, value in kw.items():
        out[{"any": "planAnyOf", "never": "mustNotPlan"}.get(key, key)] = value
    return out


def cases() -> dict[str, dict[str, Any]]:
    c: dict[str, dict[str, Any]] = {}
    # NotStuck
    c["not-stuck-within-slack"] = bundle(
        the_pod=pod(deletion="2026-11-20T09:59:30Z"),
        expect=e("NotStuck", never=["observe", *CHANGING], refused=["force-delete"]),
    )
    c["not-stuck-not-deleted"] = bundle(
        the_pod=pod(deletion=None), expect=e("NotStuck", never=["observe", *CHANGING])
    )
    # Grace period counted once: 70 s past deletionTimestamp with 30 s grace is stuck.
    c["grace-period-not-added-twice"] = bundle(
        the_pod=pod(deletion="2026-11-20T09:58:50Z", grace=30),
        the_node=None,
        expect=e("NodeGone", any=["force-delete"]),
    )
    # FinalizerBlocked
    c["finalizer-after-final-delete"] = bundle(
        the_pod=pod(grace=0, finalizers=["example.com/protect"]),
        expect=e(
            "FinalizerBlocked",
            plan=["observe"],
            refused=["force-delete", "remove-finalizer"],
            evidence=["example.com/protect", "deletionGracePeriodSeconds is 0"],
        ),
    )
    c["finalizer-unscheduled-allowlisted"] = bundle(
        the_pod=pod(node=None, finalizers=["example.com/protect", "other.io/keep"]),
        the_node=None,
        expect=e(
            "FinalizerBlocked",
            plan=["remove-finalizer"],
            refused=["force-delete", "remove-finalizer"],
            never=["force-delete"],
            policy={**EVERYTHING, "finalizerAllowlist": ["example.com/protect"]},
        ),
    )
    # NodeGone
    c["node-gone-with-allowlisted-finalizer"] = bundle(
        the_pod=pod(finalizers=["example.com/protect"]),
        the_node=None,
        expect=e(
            "NodeGone",
            plan=["force-delete", "remove-finalizer"],
            never=ALL_NODE,
            refused=ALL_NODE,
            policy={**EVERYTHING, "finalizerAllowlist": ["example.com/protect"]},
        ),
    )
    c["node-gone-stale-probe-ignored"] = bundle(
        the_node=None,
        the_probe=probe(mounts=[mount_line(1200, MOUNT)], probed_at="2026-11-19T00:00:00Z"),
        **CSI,
        the_pod=pod(volumes=DATA),
        expect=e("NodeGone", plan=["force-delete"], never=ALL_NODE),
    )
    # NodeUnreachable
    c["node-unreachable-fenced"] = bundle(
        the_node=node(
            ready="Unknown", since="2026-11-20T09:40:00Z", fenced=True, reason="NodeStatusUnknown"
        ),
        expect=e(
            "NodeUnreachable", plan=["force-delete"], never=ALL_NODE, evidence=["fenced", "20m0s"]
        ),
    )
    c["node-unreachable-not-fenced"] = bundle(
        the_node=node(ready="False", since="2026-11-20T09:40:00Z", reason="KubeletNotReady"),
        expect=e(
            "NodeUnreachable",
            plan=["observe"],
            never=CHANGING,
            refused=["force-delete", "unmount"],
            evidence=["NOT fenced"],
        ),
    )
    fencing_cases(c)
    c["node-without-ready-condition"] = bundle(
        the_node=node(ready=None, created="2026-11-20T09:50:00Z", fenced=True),
        expect=e("NodeUnreachable", plan=["force-delete"], evidence=["no Ready condition"]),
    )
    # Not ready for only 2 minutes: not lost; a fresh probe decides.
    c["node-notready-recently-orphaned-mount"] = bundle(
        the_node=node(ready="False", since="2026-11-20T09:58:00Z", fenced=True),
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(
            mounts=[mount_line(1200, MOUNT)], dirs=[(MOUNT, False)], containers=[("app", "exited")]
        ),
        expect=e(
            "OrphanedMount",
            never=["force-delete"],
            any=["unmount"],
            evidence=["under nodeLostAfter"],
        ),
    )
    # ContainersStillRunning
    c["containers-running-per-probe"] = bundle(
        the_pod=pod(statuses=[("app", "terminated")]),
        the_probe=probe(containers=[("app", "running")]),
        expect=e(
            "ContainersStillRunning",
            plan=["observe"],
            never=CHANGING,
            refused=["force-delete", "unmount"],
        ),
    )
    c["init-container-running-no-probe"] = bundle(
        the_pod=pod(statuses=[("app", "waiting")], init_statuses=[("migrate", "running")]),
        expect=e(
            "ContainersStillRunning",
            plan=["observe"],
            never=CHANGING,
            evidence=["init container migrate"],
        ),
    )
    # Probe (the node's truth) says nothing runs although the API still says running.
    c["api-running-but-probe-says-exited"] = bundle(
        the_pod=pod(statuses=[("app", "running")]),
        the_probe=probe(containers=[("app", "exited")]),
        expect=e(
            "KubeletNotProgressing", any=["force-delete"], evidence=["has not updated the status"]
        ),
    )
    # Tasks in D state (issue #25): evidence of ContainersStillRunning, no action
    c["containers-running-task-in-d-state"] = bundle(
        the_pod=pod(statuses=[("app", "running")]),
        the_probe=probe(containers=[("app", "running")], sight={"dTasks": [D_TASK]}),
        expect=e(
            "ContainersStillRunning",
            plan=["observe"],
            never=CHANGING,
            refused=["force-delete", "unmount"],
            evidence=[
                "container id-app cannot be killed: pid 4711 (dd) in uninterruptible sleep "
                "on `nfs_wait_bit_killable`"
            ],
        ),
    )
    # ContainerFrozen (issue #25): before ContainersStillRunning; thaw where permitted
    c["container-frozen-v1-freezer"] = bundle(
        the_pod=pod(statuses=[("app", "running")]),
        the_probe=probe(
            containers=[("app", "running")],
            sight={"frozenCgroups": [frozen("/kubepods/pod" + UID + "/cri-containerd-id-app")]},
        ),
        expect=e(
            "ContainerFrozen",
            plan=["thaw"],
            never=[a for a in CHANGING if a != "thaw"],
            refused=["force-delete", "unmount"],
            evidence=["(container id-app) is FROZEN (cgroup v1 freezer, frozen itself)"],
        ),
    )
    c["container-frozen-v2-pod-freezing-status-lags"] = bundle(
        the_pod=pod(statuses=[("app", "terminated")]),
        the_probe=probe(
            containers=[("app", "exited")],
            sight={
                "frozenCgroups": [
                    frozen(f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice", "")
                    | {"version": "v2", "state": "FREEZING"}
                ],
                "dTasks": [D_TASK],
            },
        ),
        expect=e(
            "ContainerFrozen",
            plan=["observe"],
            never=CHANGING,
            refused=["force-delete", "unmount", "thaw"],
            evidence=["(the pod's own cgroup) is FREEZING", "uninterruptible sleep"],
            policy=EVERYTHING | {"actions": ["observe", "force-delete", "unmount"]},
        ),
    )
    # FinalizerBlocked with its owner's lease (issue #25): evidence only, the allowlist decides
    c["finalizer-job-tracking-controller-gone"] = bundle(
        the_pod=pod(node=None, grace=0, finalizers=["batch.kubernetes.io/job-tracking"]),
        expect=e(
            "FinalizerBlocked",
            plan=["observe"],
            never=CHANGING,
            refused=["force-delete"],
            evidence=[
                "finalizer batch.kubernetes.io/job-tracking is removed by the Job controller of "
                "kube-controller-manager",
                "held by cp-1_8f2c has not changed for 3h0m0s on this reader's clock",
                "the Job controller of kube-controller-manager seems gone",
            ],
        ),
    )
    c["finalizer-job-tracking-controller-gone"]["leases"] = [
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"namespace": "kube-system", "name": "kube-controller-manager"},
            "spec": {
                "holderIdentity": "cp-1_8f2c",
                "leaseDurationSeconds": 15,
                "renewTime": "2026-11-20T07:00:00.000000Z",
            },
        }
    ]
    # the reader's memory (issue 33 finding 6): unchanged for 3 h on its own clock
    c["finalizer-job-tracking-controller-gone"]["leasesObserved"] = [
        {
            "namespace": "kube-system",
            "name": "kube-controller-manager",
            "unchangedSince": "2026-11-20T07:00:00Z",
            "changeSeen": True,
        }
    ]
    # FinalizerBlocked, the policy's finalizerOwners and finalizerOwnerGoneSeconds (issue #25):
    # the mapped Deployment at 0 of 1 available for 3 h (> 1 h) -> removal (allowlisted);
    # alive -> wait
    owned = "example.com/protect"
    owner_policy = EVERYTHING | {
        "finalizerAllowlist": [owned],
        "finalizerOwners": [
            {"prefix": "example.com/", "deployment": {"namespace": "ops", "name": "example-op"}}
        ],
        "finalizerOwnerGoneSeconds": 3600,
    }
    for name, available, expected in (
        ("finalizer-owner-deployment-gone-past-threshold", 0, (["remove-finalizer"], [], [
            "served by the Deployment ops/example-op (spec.finalizerOwners): 0 of 1 replicas "
            "available since 2026-11-20T07:00:00Z (3h0m0s): it seems gone",
        ])),
        ("finalizer-owner-deployment-alive-waits", 1, (["observe"], ["remove-finalizer"], [
            "served by the Deployment ops/example-op (spec.finalizerOwners): 1 of 1 replicas "
            "available: it is alive — wait for it",
        ])),
    ):  # fmt: skip
        plan_, refused, evidence = expected
        c[name] = bundle(
            the_pod=pod(node=None, grace=0, finalizers=[owned]),
            expect=e(
                "FinalizerBlocked",
                plan=plan_,
                refused=["force-delete", *refused],
                evidence=evidence,
                policy=owner_policy,
            ),
        )
        condition = {
            "type": "Available",
            "status": "False",
            "lastTransitionTime": "2026-11-20T07:00:00Z",
        }
        c[name]["deployments"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"namespace": "ops", "name": "example-op"},
                "spec": {"replicas": 1},
                "status": {"replicas": 1, "availableReplicas": available}
                | ({} if available else {"conditions": [condition]}),
            }
        ]
    # HungMount (issue #25): after ContainerFrozen, before ContainersStillRunning
    c["hung-nfs-server-gone-container-blocked"] = bundle(
        the_pod=pod(volumes=DATA, statuses=[("app", "running")]),
        pvcs=[pvc()],
        pvs=[pv(driver=None)],
        the_probe=probe(
            mounts=[mount_line(1200, NFS_VOLUME, "nfs4", "10.0.0.5:/exports/x")],
            holders=[holder(NFS_VOLUME, 4711, "dd", "cwd")],
            containers=[("app", "running")],
            sight={
                "dTasks": [D_TASK],
                "hungMounts": [
                    hung_mount(
                        NFS_VOLUME,
                        "nfs4",
                        blocked=[
                            {"pid": 4711, "comm": "dd", "state": "D", "via": "cwd"}
                            | {"wchan": "rpc_wait_bit_killable"}
                        ],
                    )
                ],
            },
        ),
        expect=e(
            "HungMount",
            plan=["observe"],
            never=CHANGING,
            refused=["lazy-unmount", "unmount", "force-delete"],
            evidence=[
                "NFS server 10.0.0.5 (10.0.0.5:/exports/x) does not answer",
                "pid 4711 (dd, holds it via cwd) waits in `rpc_wait_bit_killable`",
            ],
        ),
    )
    c["hung-fuse-daemon-stopped-unheld"] = bundle(
        the_pod=pod(volumes=DATA, statuses=[("app", "terminated")]),
        **CSI,
        the_probe=probe(
            mounts=[mount_line(1200, MOUNT, "fuse.s3fs", "s3fs")],
            containers=[("app", "exited")],
            sight={"hungMounts": [hung_mount(MOUNT, "fuse.s3fs", waiting=2)]},
        ),
        expect=e(
            "HungMount",
            plan=["lazy-unmount"],
            never=[a for a in CHANGING if a != "lazy-unmount"],
            refused=["unmount", "force-delete"],
            evidence=["the FUSE daemon serving s3fs (fuse.s3fs) does not answer", "2 request(s)"],
            policy=EVERYTHING | {"actions": ["observe", *CHANGING]},
        ),
    )
    c["hung-fuse-held-by-a-process"] = bundle(
        the_pod=pod(volumes=DATA, statuses=[("app", "terminated")]),
        **CSI,
        the_probe=probe(
            mounts=[mount_line(1200, MOUNT, "fuse.s3fs", "s3fs")],
            holders=[holder(MOUNT, 4242, "backup-agent", "fd")],
            containers=[("app", "exited")],
            sight={"hungMounts": [hung_mount(MOUNT, "fuse.s3fs", waiting=1)]},
        ),
        expect=e(
            "HungMount",
            plan=["observe"],
            never=CHANGING,
            refused=["lazy-unmount", "unmount", "force-delete"],
            evidence=["pid 4242 (backup-agent) holds"],
        ),
    )
    # HungMount whose only waiter is outside the pod and holds nothing: the kubelet's own
    # stat of an NFS mount point (no FUSE count for NFS): found from its blocked syscall
    c["hung-nfs-kubelet-outside-waiter"] = bundle(
        the_pod=pod(volumes=DATA, statuses=[("app", "terminated")]),
        pvcs=[pvc()],
        pvs=[pv(driver=None)],
        the_probe=probe(
            mounts=[mount_line(1200, NFS_VOLUME, "nfs4", "10.0.0.5:/exports/x")],
            containers=[("app", "exited")],
            sight={
                "hungMounts": [
                    hung_mount(
                        NFS_VOLUME,
                        "nfs4",
                        blocked=[
                            {"pid": 812, "comm": "kubelet", "state": "D", "via": "path"}
                            | {"wchan": "rpc_wait_bit_killable", "path": NFS_VOLUME}
                        ],
                    )
                ]
            },
        ),
        expect=e(
            "HungMount",
            plan=["lazy-unmount"],
            never=[a for a in CHANGING if a != "lazy-unmount"],
            refused=["unmount", "force-delete"],
            evidence=[
                "NFS server 10.0.0.5 (10.0.0.5:/exports/x) does not answer",
                "pid 812 (kubelet, outside the pod, holding nothing) waits in "
                f"`rpc_wait_bit_killable` on {NFS_VOLUME}",
            ],
            policy=EVERYTHING,
        ),
    )
    # An NFS mount a blocked task may wait on whose path the agent could not read (issue
    # #25, `waitersUnknown`): still OrphanedMount, but no plain unmount (it could hang)
    unread = f"cannot tell whether blocked tasks wait on {NFS_VOLUME}: pid 812 (kubelet) in "
    c["hung-nfs-waiter-path-unread"] = bundle(
        the_pod=pod(volumes=DATA, statuses=[("app", "terminated")]),
        pvcs=[pvc()],
        pvs=[pv(driver=None)],
        the_probe=probe(
            mounts=[mount_line(1200, NFS_VOLUME, "nfs4", "10.0.0.5:/exports/x")],
            containers=[("app", "exited")],
            sight={
                "waitersUnknown": [NFS_VOLUME],
                "blindSpots": [unread + "rpc_wait_bit_killable: its path could not be read"],
            },
        ),
        expect=e(
            "OrphanedMount",
            never=["unmount", "replay-unpublish", "lazy-unmount", "force-delete"],
            refused=["unmount", "force-delete"],
            evidence=["the agent could not see: " + unread],
            policy=EVERYTHING,
        ),
    )
    # CNITeardownFailed (issue #25): the kubelet's real FailedKillPod text; observe only
    c["cni-teardown-failing-calico"] = bundle(
        the_pod=pod(volumes=DATA, statuses=[("app", "terminated")]),
        **CSI,
        the_probe=probe(
            mounts=[mount_line(1200, MOUNT)], dirs=[(MOUNT, False)], containers=[("app", "exited")]
        ),
        expect=e(
            "CNITeardownFailed",
            plan=["observe"],
            never=CHANGING,
            refused=["force-delete", "unmount", "replay-unpublish", "rmdir-stale"],
            evidence=["CNI plugin calico fails to delete its network (7 times): error getting"],
            policy=EVERYTHING,
        ),
    )
    c["cni-teardown-failing-calico"]["events"] = [kill_pod_event(UID, "2026-11-20T09:50:00Z")]
    c["cni-teardown-failing-multus-no-probe"] = bundle(
        the_pod=pod(statuses=[("app", "terminated")]),
        expect=e(
            "CNITeardownFailed",
            plan=["observe"],
            never=CHANGING,
            evidence=["CNI plugin multus (network multus-cni-network) fails to delete"],
        ),
    )
    c["cni-teardown-failing-multus-no-probe"]["events"] = [
        kill_pod_event(
            UID, "2026-11-20T09:59:00Z", 1, "multus", "error in DelegateDel", "multus-cni-network"
        )
    ]
    # MountBusy
    c["mount-busy-holder"] = bundle(
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(
            mounts=[mount_line(1200, MOUNT)],
            dirs=[(MOUNT, False)],
            holders=[holder(MOUNT, 4242, "backup-agent", "cwd")],
            containers=[("app", "exited")],
        ),
        expect=e(
            "MountBusy",
            plan=["observe"],
            never=CHANGING,
            refused=["unmount", "force-delete"],
            evidence=["pid 4242 (backup-agent)"],
        ),
    )
    spaced_root = "/var/lib/my kubelet"
    spaced_sub = pod_path("volume-subpaths/data/app/0", root=spaced_root)
    c["mount-busy-subpath-escaped-root"] = bundle(
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(
            root=spaced_root,
            mounts=[mount_line(1201, spaced_sub)],
            holders=[holder(spaced_sub, 77, "tail", "fd")],
            containers=[("app", "exited")],
        ),
        expect=e("MountBusy", never=CHANGING, evidence=["my kubelet/pods", "via fd"]),
    )
    # CSIDriverMissing
    c["csi-driver-missing-pvc"] = bundle(
        the_pod=pod(volumes=DATA),
        pvcs=[pvc()],
        pvs=[pv()],
        the_csi_node=csi_node([]),
        the_probe=probe(
            mounts=[mount_line(1200, MOUNT), staging_line()],
            plugins=[],
            dirs=[(MOUNT, False)],
            containers=[("app", "exited")],
        ),
        expect=e(
            "CSIDriverMissing",
            plan=["unmount", "rmdir-stale"],
            never=["replay-unpublish", "force-delete"],
            refused=["replay-unpublish"],
            evidence=[DRIVER],
        ),
    )
    inline = csi_mount_path("scratch")
    c["csi-driver-missing-inline-volume"] = bundle(
        the_pod=pod(volumes=[inline_csi_volume("scratch", "secrets-store.csi.k8s.io")]),
        the_csi_node=csi_node([DRIVER]),
        the_probe=probe(
            mounts=[mount_line(1210, inline, "tmpfs", "tmpfs")], containers=[("app", "exited")]
        ),
        expect=e(
            "CSIDriverMissing",
            plan=["unmount", "rmdir-stale"],
            never=["replay-unpublish"],
            evidence=["secrets-store.csi.k8s.io"],
        ),
    )
    # OrphanedMount
    decoy = csi_mount_path(PV, uid=OTHER_UID)
    c["orphaned-mount-with-decoys"] = bundle(
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(
            mounts=[
                mount_line(1100, decoy),
                staging_line(),
                mount_line(1200, MOUNT),
                mount_line(1201, PROJECTED, "tmpfs", "tmpfs"),
            ],
            holders=[holder(decoy, 99, "postgres", "fd")],
            dirs=[(MOUNT, False), (PROJECTED, False), (pod_path("volumes"), False)],
            containers=[("app", "exited"), ("app", "exited")],
        ),
        expect=e(
            "OrphanedMount",
            plan=["replay-unpublish", "unmount", "unmount", "rmdir-stale", "rmdir-stale"],
            never=["force-delete"],
            refused=["force-delete"],
        ),
    )
    c["orphaned-subpath-and-volume"] = bundle(
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(mounts=[mount_line(1200, MOUNT), mount_line(1202, SUBPATH)], containers=[]),
        expect=e(
            "OrphanedMount",
            plan=["replay-unpublish", "unmount", "unmount", "rmdir-stale", "rmdir-stale"],
            never=["force-delete"],
        ),
    )
    c["orphaned-nfs-no-replay"] = bundle(
        the_pod=pod(volumes=DATA),
        pvcs=[pvc()],
        pvs=[pv(driver=None)],
        the_probe=probe(
            mounts=[
                mount_line(
                    1200,
                    pod_path(f"volumes/kubernetes.io~nfs/{PV}"),
                    "nfs4",
                    "nfs.example:/exports/x",
                )
            ],
            containers=[("app", "exited")],
        ),
        expect=e(
            "OrphanedMount",
            plan=["unmount", "rmdir-stale"],
            never=["replay-unpublish", "force-delete"],
        ),
    )
    # StaleVolumeDirs
    c["stale-volume-dirs-empty"] = bundle(
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(dirs=[(MOUNT, True)], containers=[("app", "exited")]),
        expect=e(
            "StaleVolumeDirs",
            plan=["rmdir-stale"],
            never=["force-delete", "unmount"],
            refused=["force-delete"],
        ),
    )
    c["stale-volume-dirs-one-not-empty"] = bundle(
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(
            dirs=[(MOUNT, True), (pod_path("volumes/kubernetes.io~empty-dir/cache"), False)],
            containers=[],
        ),
        expect=e(
            "StaleVolumeDirs",
            plan=["rmdir-stale"],
            refused=["rmdir-stale", "force-delete"],
            evidence=["NOT empty"],
        ),
    )
    # KubeletNotProgressing
    c["kubelet-not-progressing"] = bundle(
        the_probe=probe(
            containers=[("app", "exited")],
            healthy=False,
            mounts=[mount_line(1100, csi_mount_path(PV, uid=OTHER_UID))],
        ),
        expect=e("KubeletNotProgressing", plan=["force-delete", "restart-kubelet"]),
    )
    c["kubelet-not-progressing-policy-without-restart"] = bundle(
        the_probe=probe(containers=[]),
        expect=e(
            "KubeletNotProgressing",
            plan=["force-delete"],
            never=["restart-kubelet"],
            refused=["restart-kubelet"],
            policy=EVERYTHING | {"actions": ["observe", "force-delete", "unmount"]},
        ),
    )
    # Unknown
    c["unknown-no-probe"] = bundle(
        expect=e(
            "Unknown",
            plan=["observe"],
            never=CHANGING,
            refused=CHANGING,
            evidence=["no node probe"],
        ),
    )
    c["unknown-stale-probe"] = bundle(
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(mounts=[mount_line(1200, MOUNT)], probed_at="2026-11-20T09:50:00Z"),
        expect=e("Unknown", plan=["observe"], never=CHANGING, evidence=["probeMaxAge"]),
    )
    c["unknown-probe-of-another-node"] = bundle(
        the_probe=probe(node_name="node-2", containers=[]),
        expect=e("Unknown", plan=["observe"], never=CHANGING, evidence=["node-2"]),
    )
    c["unknown-runtime-not-asked"] = bundle(
        the_probe=probe(containers=None),
        expect=e("Unknown", plan=["observe"], never=CHANGING, evidence=["could not list"]),
    )
    # Invariant 7: a probe of another pod UID is ignored; the API's running container stands.
    c["probe-of-another-pod-ignored"] = bundle(
        the_pod=pod(statuses=[("app", "running")]),
        the_probe=probe(containers=[], uid=OTHER_UID),
        expect=e(
            "ContainersStillRunning",
            plan=["observe"],
            never=CHANGING,
            evidence=[f"probe ignored: it is of pod uid {OTHER_UID}, not of this pod {UID}"],
        ),
    )
    # Invariant 8: a probe that cannot prove it could see never reads as "nothing left".
    c["unknown-blind-probe-wrong-root"] = bundle(
        the_probe=probe(
            containers=[], root="/var/lib/kubelt", sight={"podDirExists": False, "podDirsSeen": 0}
        ),
        expect=e("Unknown", plan=["observe"], never=CHANGING, evidence=["holds no pod dirs"]),
    )
    c["unknown-blind-probe-runtime-unanswered"] = bundle(
        the_probe=probe(
            containers=[],
            sight={
                "runtime": "unanswered",
                "blindSpots": ["the CRI socket /run/containerd/containerd.sock did not answer"],
            },
        ),
        expect=e(
            "Unknown",
            plan=["observe"],
            never=CHANGING,
            evidence=["container runtime did not answer", "containerd.sock did not answer"],
        ),
    )
    c["unknown-holder-scan-incomplete"] = bundle(
        the_pod=pod(volumes=DATA),
        **CSI,
        the_probe=probe(
            mounts=[mount_line(1200, MOUNT)],
            containers=[("app", "exited")],
            sight={"holderScan": "incomplete"},
        ),
        expect=e(
            "Unknown",
            plan=["observe"],
            never=CHANGING,
            refused=["unmount", "force-delete"],
            evidence=["holder scan was incomplete"],
        ),
    )
    c["unknown-older-probe-cannot-prove-nothing-left"] = bundle(
        the_probe=probe(containers=[("app", "exited")], legacy=True),
        expect=e(
            "Unknown",
            plan=["observe"],
            never=CHANGING,
            evidence=["does not say which pod UID"],
        ),
    )
    c["unknown-csi-driver-unresolvable"] = bundle(
        the_pod=pod(volumes=DATA),
        the_probe=probe(mounts=[mount_line(1200, MOUNT)], containers=[]),
        expect=e("Unknown", plan=["observe"], never=CHANGING, evidence=["cannot tell"]),
    )
    # Opt-in (with a policy)
    c["not-opted-in-with-policy"] = bundle(
        the_pod=pod(opt_in=None),
        the_node=None,
        expect=e(
            "NodeGone",
            plan=["observe"],
            never=CHANGING,
            refused=["force-delete"],
            policy=EVERYTHING,
        ),
    )
    c["opted-in-by-policy-name"] = bundle(
        the_pod=pod(opt_in="default"),
        the_node=None,
        expect=e("NodeGone", plan=["force-delete"], policy=EVERYTHING),
    )
    return c


def render(b: dict[str, Any]) -> str:
    return json.dumps(b, indent=2) + "\n"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, b in cases().items():
        (OUT / f"{name}.json").write_text(render(b))
    print(f"wrote {len(cases())} scenarios to {OUT} (kubelet root {ROOT}, pod uid {UID})")


if __name__ == "__main__":
    main()
