"""The agent judges a pod's deletionTimestamp (the API server's) in the API server's time
(issue #31): an agent whose clock is 20 s ahead does not take a pod for past its grace
period 20 s early. agent/loop.py hands the handler its Kube's ServerClock
(kube/server_clock.py, measured on the real API server in tests/kube/test_server_clock.py);
here the translation is given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from unstick.agent.authority.request import BadRemediation
from unstick.agent.handler import Handler
from unstick.agent.settings import AgentSettings
from unstick.core.remediation import rfc3339

SERVER_NOW = datetime(2026, 11, 28, 7, 0, 0, tzinfo=UTC)
AHEAD = timedelta(seconds=20)
UID = "dddddddd-4444-4444-8444-dddddddddddd"


def handler(pod: dict[str, Any], *, corrected: bool) -> Handler:
    """A handler on node-1 whose clock is 20 s ahead of the API server's."""
    return Handler(
        AgentSettings(node_name="node-1"),
        None,  # type: ignore[arg-type]  # no steps run: only the pod check
        lambda ns, name, status: None,
        lambda ns, name: pod,
        clock=lambda: SERVER_NOW + AHEAD,
        server_time=(lambda now: now - AHEAD) if corrected else (lambda now: now),
    )


def pod(deleted: datetime) -> dict[str, Any]:
    meta = {"name": "web-0", "uid": UID, "deletionTimestamp": rfc3339(deleted.timestamp())}
    return {"metadata": meta, "spec": {"nodeName": "node-1"}}


def test_a_pod_within_its_grace_period_by_the_servers_clock_is_refused() -> None:
    within = pod(SERVER_NOW + timedelta(seconds=10))  # 10 s of grace left, server time
    spec = {"podName": "web-0", "podUID": UID}
    with pytest.raises(BadRemediation, match="still within its grace period"):
        handler(within, corrected=True).checked_pod("shop", spec)
    # by its own clock, 20 s ahead, the grace period looked over
    assert handler(within, corrected=False).checked_pod("shop", spec) is within
    past = pod(SERVER_NOW - timedelta(seconds=1))
    assert handler(past, corrected=True).checked_pod("shop", spec) is past
