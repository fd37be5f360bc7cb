"""Record before act on the per-pod path (design.md §3 invariant 10), with the real
controller SIGKILLed right after the intent of its finalizer removal was written: the
intent is on record (and counted by the next controller's budget), nothing was done to
the pod, and the next controller carries the action out; its answer replaces the
intent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.controller import Objects, first_and_next, policy_spec

pytestmark = pytest.mark.envtest

POLICY = "t-pod-intent"
KEEP = "example.com/keep"


POLICIES = {POLICY: policy_spec(finalizerAllowlist=[KEEP])}


def test_a_finalizer_removal_is_on_record_before_it_is_sent(
    control_plane: ControlPlane, objects: Objects, namespace: str, tmp_path: Path
) -> None:
    # unscheduled: deleted at once but for its finalizer (FinalizerBlocked, allowlisted)
    pod = objects.stuck_pod(namespace, None, remediate=POLICY, finalizers=[KEEP])
    env = {"UNSTICK_TEST_FAILPOINTS": "pod-intent-durable=kill@1"}
    with first_and_next(control_plane, tmp_path, env) as (first, second):
        try:
            first.start()
        except AssertionError:  # killed while starting: fine if at its fail point
            assert "fail point pod-intent-durable" in first.log(), first.log()[-3000:]
        assert first.proc is not None
        first.proc.wait(timeout=60)
        assert "fail point pod-intent-durable" in first.log(), first.log()[-3000:]
        first.proc = None
        actions = objects.status(namespace, pod).get("actions") or []
        assert [(a["action"], a["result"]) for a in actions] == [("remove-finalizer", "removing")]
        left = objects.read_pod(namespace, pod["name"])
        assert left is not None and left.metadata.finalizers == [KEEP]

        second.start()
        objects.pod_gone(namespace, pod, timeout=60, what="finalizer removal")
        rebuilt = re.search(r"action budget rebuilt: (\d+) actions", second.log())
        assert rebuilt is not None and int(rebuilt.group(1)) >= 1, second.log()[-2000:]

        def answered() -> list[Any]:
            done = objects.status(namespace, pod).get("actions") or []
            return [(a["action"], a["result"]) for a in done]

        wait_until(
            lambda: answered() == [("remove-finalizer", "succeeded")],
            timeout=30,
            what="the intent replaced by its answer",
        )
