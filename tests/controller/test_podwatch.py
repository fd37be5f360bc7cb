"""The lean pod watcher against a real API server: paginated LIST, WATCH, and only
terminating pods kept in memory."""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.audit_log import requests
from tests.support.controller import Objects
from unstick.kube.client import USER_AGENT, Kube
from unstick.kube.podwatch import PodWatcher, TerminatingPod, WatchSettings

pytestmark = pytest.mark.envtest


def test_lists_in_pages_and_keeps_only_terminating_pods(
    control_plane: ControlPlane, kube: Kube, namespace: str, make_node: Any
) -> None:
    objects = Objects(control_plane)
    node = make_node(kubelet=False)
    pods = [objects.pod(namespace, node, grace=3600) for _ in range(250)]
    terminating = pods[:5]
    for pod in terminating:
        objects.core.delete_namespaced_pod(pod["name"], namespace)

    changes: list[tuple[str, TerminatingPod | None]] = []
    lock = threading.Lock()

    def on_change(uid: str, record: TerminatingPod | None) -> None:
        with lock:
            changes.append((uid, record))

    watcher = PodWatcher(kube, WatchSettings(namespace=namespace, page_size=100), on_change)
    watcher.start()
    try:
        assert watcher.synced.wait(60)
        assert set(watcher.pods) == {p["uid"] for p in terminating}
        record = watcher.pods[terminating[0]["uid"]]
        assert (record.namespace, record.name, record.node) == (
            namespace,
            terminating[0]["name"],
            node,
        )
        assert record.deletion_grace_period_s == 3600

        # WATCH: a new deletion is seen, a pod that is gone is forgotten.
        late = pods[5]
        objects.core.delete_namespaced_pod(late["name"], namespace)
        wait_until(
            lambda: late["uid"] in watcher.pods, timeout=30, what="the watch to report the deletion"
        )
        objects.core.delete_namespaced_pod(
            terminating[0]["name"], namespace, grace_period_seconds=0
        )
        wait_until(
            lambda: terminating[0]["uid"] not in watcher.pods,
            timeout=30,
            what="the pod to be forgotten",
        )
        with lock:
            assert (terminating[0]["uid"], None) in changes
        assert len(watcher.pods) == 5  # of 250 pods
    finally:
        watcher.stop()
        objects.api_client.close()

    lists = [
        urllib.parse.urlparse(e["requestURI"])
        for e in requests(control_plane, by_exactly=USER_AGENT, verbs={"list"}, namespace=namespace)
    ]
    queries = [urllib.parse.parse_qs(u.query) for u in lists]
    assert len(queries) >= 3  # 250 pods in pages of 100
    assert all(q.get("limit") == ["100"] for q in queries)
    assert sum(1 for q in queries if "continue" in q) >= 2
    watches = requests(control_plane, by_exactly=USER_AGENT, verbs={"watch"}, namespace=namespace)
    assert watches and "allowWatchBookmarks=true" in watches[0]["requestURI"]
