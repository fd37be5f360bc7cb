"""The agent's Remediation watch runs on the one watch loop (kube/listwatch.py) against a
real kube-apiserver: a Remediation deleted while the watch was down (between a 410 Gone
and the relist) is forgotten at the relist, the others are handed to the handler again,
and the admission verdict is read at every relist and every watch cycle."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devcluster.process import wait_until
from unstick.agent.loop import Agent, LoopSettings
from unstick.agent.settings import AgentSettings
from unstick.core import remediation as rem
from unstick.kube.client import ClientSettings, Kube, remediation_path

pytestmark = pytest.mark.envtest

CRDS = Path(__file__).parents[2] / "operator" / "unstick" / "crds"


class DeleteOnRelist(Kube):
    """A real client whose first LIST reports resourceVersion "1" (the watch after it is
    answered 410 Gone) and which deletes `doomed` right before its second LIST: a
    Remediation deleted while the agent's watch was down."""

    def __init__(self, settings: ClientSettings, doomed: str) -> None:
        super().__init__(settings)
        self.doomed, self.lists = doomed, 0

    def list_pages(self, path: str, query: Any = None, limit: int = 500) -> Iterator[Any]:
        self.lists += 1
        if self.lists == 2:
            self.request("DELETE", self.doomed)
        for page in super().list_pages(path, query, limit):
            if self.lists == 1:
                yield {**page, "metadata": {**page["metadata"], "resourceVersion": "1"}}
            else:
                yield page


class Recorder:
    """Stands in for the Handler: notes the uids handed to it (as served probes)."""

    def __init__(self) -> None:
        self.served_probes: dict[str, str] = {}
        self.served_steps: dict[str, str] = {}
        self.handled: list[str] = []

    def handle(self, obj: dict[str, Any], _received: object = None) -> None:
        uid = obj["metadata"]["uid"]
        self.handled.append(uid)
        self.served_probes[uid] = "seen"


class CountingGate:
    """Stands in for the AdmissionGate: counts how often the verdict is read."""

    def __init__(self) -> None:
        self.checks = 0

    def check(self, _get: Any) -> None:
        self.checks += 1

    def problem_now(self, _get: Any) -> str | None:
        return None


def _create(kube: Kube, namespace: str, name: str, node: str) -> str:
    body = rem.new_remediation(namespace, name, name, str(uuid.uuid4()), node=node, dry_run=False)
    body["spec"][rem.PROBE_REQUESTED_AT] = rem.rfc3339(datetime.now(UTC))
    created = kube.request("POST", remediation_path(namespace), body=body)
    return str(created["metadata"]["uid"])


def test_relist_forgets_a_remediation_deleted_while_down_and_cycles_read_admission(
    control_plane: Any, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    kept = _create(kube, namespace, "kept", node)
    gone = _create(kube, namespace, "gone", node)
    settings = AgentSettings(node_name=node, kubelet_root=str(tmp_path / "kubelet"))
    kubeconfig = str(control_plane.kubeconfig)
    agent = Agent(settings, LoopSettings(kubeconfig=kubeconfig, watch_timeout_s=1, workers=2))
    agent.kube.close()
    client = DeleteOnRelist(
        ClientSettings(kubeconfig=kubeconfig), remediation_path(namespace, "gone")
    )
    agent.kube = agent.watch.kube = client
    recorder, gate = Recorder(), CountingGate()
    agent.handler = recorder  # type: ignore[assignment]
    agent.admission = gate  # type: ignore[assignment]
    thread = threading.Thread(target=agent.run_watch, name="agent-watch", daemon=True)
    thread.start()
    try:
        wait_until(lambda: agent.watch.stats.lists >= 2, timeout=60, what="the relist after 410")
        assert agent.watch.stats.expired >= 1
        wait_until(lambda: gone not in agent.stuck_uids, timeout=30, what="'gone' forgotten")
        assert kept in agent.stuck_uids
        wait_until(lambda: gone not in recorder.served_probes, timeout=30, what="served forgotten")
        assert recorder.handled.count(kept) >= 2  # listed twice: handed over twice
        # a relist reads the verdict, and so does every (1 s) watch cycle after it
        lists = agent.watch.stats.lists
        wait_until(lambda: gate.checks >= lists + 3, timeout=30, what="watch cycles' checks")
        assert agent.healthy()
    finally:
        agent.shutdown()
        thread.join(timeout=10)
        agent.workers().stop()
        client.close()
    assert not thread.is_alive()
