"""A pod's own Remediation whose pod went while no controller ran (docs/controller.md,
"What survives a crash"), on the real API server with the real controller process.

Its record is marked `Resolved` when the pod watch sees the pod go; a controller that was
SIGKILLed meanwhile never sees that (before: the record check marked it `Refused` as
forged, 10 s after the next start). The next one, before its first pass, looks up each
unresolved per-pod record whose pod its watch did not list: gone (404, or another pod
with that name) → `Resolved`, with `resolvedAt`, and nothing in the time-to-resolution
histogram (nobody knows when the pod went). A record whose pod is still Terminating is
left to its pass as usual. And the start-up's write itself (podrecord.resolve_left_behind),
called on records listed before someone else wrote them: 409 → read again, decide again.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import (
    Controller,
    Objects,
    first_and_next,
    policy_spec,
    utc_now,
    write_as_agent,
)
from unstick.controller.records import pod_record as podrecord
from unstick.controller.records import writer as records
from unstick.kube.client import ClientSettings, Kube

pytestmark = pytest.mark.envtest

KEEP = "example.com/keep"  # not on the allowlist: FinalizerBlocked, observed only
HISTOGRAM = "unstick_time_to_resolution_seconds_count"


POLICIES = {"default": policy_spec()}


def _stuck(objects: Objects, namespace: str, name: str | None = None) -> dict[str, Any]:
    pod = objects.stuck_pod(namespace, None, remediate="true", finalizers=[KEEP], name=name)
    return pod


def _release(objects: Objects, namespace: str, pod: dict[str, Any]) -> None:
    """Its finalizer removed: the pod goes for good."""
    objects.core.patch_namespaced_pod(pod["name"], namespace, {"metadata": {"finalizers": None}})
    objects.pod_gone(namespace, pod, timeout=30, what=f"{pod['name']} gone")


def _phase(objects: Objects, namespace: str, pod: dict[str, Any]) -> str | None:
    return objects.status(namespace, pod).get("phase")


def _sigkill(ctl: Controller) -> None:
    assert ctl.proc is not None
    ctl.proc.kill()
    ctl.proc.wait(timeout=10)
    ctl.proc = None


def test_records_of_pods_gone_while_no_controller_ran_are_resolved_at_start(
    control_plane: ControlPlane, objects: Objects, namespace: str, tmp_path: Path
) -> None:
    gone = _stuck(objects, namespace)  # released for good while no controller runs
    renamed = _stuck(objects, namespace)  # released, and a new pod takes its name
    still = _stuck(objects, namespace)  # still Terminating when the next one starts
    pods = (gone, renamed, still)
    with first_and_next(control_plane, tmp_path) as (first, second):
        first.start()
        wait_until(
            lambda: all(_phase(objects, namespace, p) == "Observing" for p in pods),
            timeout=60,
            what="the three pods observed by their passes",
        )
        _sigkill(first)

        _release(objects, namespace, gone)
        _release(objects, namespace, renamed)
        successor = objects.pod(namespace, None, name=renamed["name"])  # not Terminating
        assert successor["uid"] != renamed["uid"]

        second.start()
        wait_until(
            lambda: all(_phase(objects, namespace, p) == "Resolved" for p in (gone, renamed)),
            timeout=30,
            what="the records of the pods gone while no controller ran Resolved",
        )
        for pod in (gone, renamed):
            assert objects.status(namespace, pod).get("resolvedAt"), objects.status(namespace, pod)
        summary = wait_until(
            lambda: re.search(
                r"resolved (\d+) records whose pods went while no controller ran", second.log()
            ),
            timeout=10,
            what="the start-up's summary line",
        )
        # at least these two (the control plane is shared: other modules' leftovers count)
        assert int(summary.group(1)) >= 2, second.log()[-3000:]

        # The pod still there is decided by its pass as usual, not by the start-up.
        assert objects.read_pod(namespace, still["name"]) is not None
        status = objects.status(namespace, still)
        assert status.get("phase") == "Observing" and not status.get("resolvedAt"), status
        assert second.sample(HISTOGRAM) == 0.0  # no pod was seen going by this process

        _release(objects, namespace, still)  # now its watch sees it go
        wait_until(
            lambda: _phase(objects, namespace, still) == "Resolved",
            timeout=30,
            what="still Resolved",
        )
        # observed right after that write: this pod was seen going
        wait_until(
            lambda: second.sample(HISTOGRAM) == 1.0, timeout=10, what="its time to resolution"
        )


def test_the_start_up_write_reads_again_on_a_newer_version(
    control_plane: ControlPlane, objects: Objects, namespace: str
) -> None:
    kube = Kube(ClientSettings(kubeconfig=str(control_plane.kubeconfig)))
    try:

        def record(pod: dict[str, Any], phase: str) -> dict[str, Any]:
            """The pod's record as a pass leaves it, as the start-up's LIST reads it."""
            rem = records.create_remediation(
                kube, namespace, pod["name"], pod["uid"], node="", dry_run=False
            )
            return records.patch_status(kube, rem, {"phase": phase, "cause": "Unknown"})

        def gone_pod() -> dict[str, Any]:
            pod = objects.pod(namespace, None)  # unscheduled: a DELETE removes it at once
            objects.core.delete_namespaced_pod(pod["name"], namespace)
            assert objects.read_pod(namespace, pod["name"]) is None
            return pod

        written, refused = gone_pod(), gone_pod()
        there = _stuck(objects, namespace)  # Terminating, as if its watch had not listed it
        listed = {
            "written": record(written, "Remediating"),
            "refused": record(refused, "Observing"),
            "there": record(there, "Observing"),
        }
        # Others write after the LIST: the agent's key in one, a refusal in the other.
        write_as_agent(objects, namespace, listed["written"], {"nodeStepsDoneAt": utc_now()})
        write_as_agent(objects, namespace, listed["refused"], {"phase": "Refused"})

        left = podrecord.left_behind(list(listed.values()), lambda uid: False)
        assert len(left) == 3
        assert podrecord.left_behind(left, {written["uid"], there["uid"]}.__contains__) == [
            listed["refused"]
        ]
        assert podrecord.resolve_left_behind(kube, left, time.time()) == 1

        status = objects.status(namespace, written)
        assert status["phase"] == "Resolved" and status.get("resolvedAt"), status
        assert status.get("nodeStepsDoneAt"), status  # the newer version's key kept
        assert objects.status(namespace, refused)["phase"] == "Refused"
        status = objects.status(namespace, there)
        assert status["phase"] == "Observing" and not status.get("resolvedAt"), status
    finally:
        kube.close()
