"""The one watch loop (kube/listwatch.py ListWatch) against a real API server: it lists,
watches, resumes a watch that ended from the last version it saw (no relist), relists when
the server answers 410 Gone, and its objects reach the sink in order; the Node-style
ObjectWatcher and the Event feed built on it keep their stores right."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from typing import Any

import pytest

from devcluster import ControlPlane
from devcluster.process import wait_until
from tests.support.watches import StaleFirstList
from unstick.kube.client import ClientSettings, Kube
from unstick.kube.events import EventFeed
from unstick.kube.listwatch import ListWatch, WatchSpec
from unstick.kube.objectwatch import DictStore, ObjectWatcher

pytestmark = pytest.mark.envtest

LABEL = "unstick.dev/test-listwatch"


class Recorder:
    """A Sink that writes down what it is handed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def relist_begin(self) -> None:
        self._add("BEGIN", "")

    def listed(self, obj: dict[str, Any]) -> None:
        self._add("LISTED", obj["metadata"]["name"])

    def relist_end(self) -> None:
        self._add("END", "")

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        self._add(kind, obj["metadata"]["name"])

    def _add(self, kind: str, name: str) -> None:
        with self.lock:
            self.seen.append((kind, name))

    def has(self, item: tuple[str, str]) -> bool:
        with self.lock:
            return item in self.seen


def _settings(cp: ControlPlane) -> ClientSettings:
    return ClientSettings(kubeconfig=str(cp.kubeconfig))


def _configmap(core_api: Any, namespace: str, name: str) -> None:
    body = {"metadata": {"name": name, "labels": {LABEL: "yes"}}, "data": {"a": "1"}}
    core_api.create_namespaced_config_map(namespace, body)


def test_list_watch_resume_without_relisting(
    control_plane: ControlPlane, core_api: Any, namespace: str
) -> None:
    _configmap(core_api, namespace, "before")
    sink = Recorder()
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    spec = WatchSpec(path, "cm test", {"labelSelector": f"{LABEL}=yes"}, watch_timeout_s=1)
    loop = ListWatch(Kube(_settings(control_plane)), spec, sink)
    loop.start()
    try:
        assert loop.synced.wait(30)
        assert sink.seen[:3] == [("BEGIN", ""), ("LISTED", "before"), ("END", "")]
        # the 1 s watches end and are resumed from the last version: nothing is missed
        wait_until(
            lambda: loop.stats.last_activity > 0, timeout=10, what="loop.stats.last_activity > 0"
        )
        _configmap(core_api, namespace, "after")
        core_api.delete_namespaced_config_map("before", namespace)
        wait_until(
            lambda: sink.has(("DELETED", "before")),
            timeout=30,
            what="sink.has(('DELETED', 'before'))",
        )
        assert sink.has(("ADDED", "after"))
        core_api.patch_namespaced_config_map("after", namespace, {"data": {"a": "2"}})
        wait_until(
            lambda: sink.has(("MODIFIED", "after")),
            timeout=30,
            what="sink.has(('MODIFIED', 'after'))",
        )
        assert loop.stats.lists == 1 and loop.stats.expired == 0
        assert loop.stats.events == 3
    finally:
        loop.stop()
    assert not loop._thread.is_alive()


def _event(core_api: Any, namespace: str, name: str) -> None:
    body = {
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": "p"},
        "reason": "UnstickListWatchTest",
        "message": name,
        "type": "Warning",
    }
    core_api.create_namespaced_event(namespace, body)


def _compact_etcd(cp: ControlPlane) -> None:
    """Compact etcd at its current revision (what the API server does every 5 minutes)."""

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"{cp.etcd_url}{path}", json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=10) as resp:
            result: dict[str, Any] = json.loads(resp.read())
        return result

    key = base64.b64encode(b"/registry").decode()
    revision = call("/v3/kv/range", {"key": key})["header"]["revision"]
    call("/v3/kv/compaction", {"revision": str(revision), "physical": True})


def test_410_gone_relists(control_plane: ControlPlane, core_api: Any, namespace: str) -> None:
    """Events are watched from etcd (the API server keeps no watch cache for them): after a
    compaction, a watch from an old version is answered 410 Gone, for real."""
    _event(core_api, namespace, "one")
    _compact_etcd(control_plane)
    sink = Recorder()
    kube = StaleFirstList(_settings(control_plane))
    path = f"/api/v1/namespaces/{namespace}/events"
    query = {"fieldSelector": "reason=UnstickListWatchTest"}
    loop = ListWatch(kube, WatchSpec(path, "events 410 test", query), sink)
    loop.start()
    try:
        wait_until(lambda: loop.stats.lists >= 2, timeout=30, what="a relist")
        assert loop.stats.expired >= 1 and loop.stats.errors == 0
        assert sink.seen[:6] == [("BEGIN", ""), ("LISTED", "one"), ("END", "")] * 2
        _event(core_api, namespace, "two")  # the watch after the relist works
        wait_until(lambda: sink.has(("ADDED", "two")), timeout=30, what="event two")
    finally:
        loop.stop()


def test_object_watcher_and_event_feed_on_the_loop(
    control_plane: ControlPlane, core_api: Any, namespace: str
) -> None:
    kube = Kube(_settings(control_plane))
    store = DictStore()
    changes: list[tuple[str, bool, bool]] = []
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    watcher = ObjectWatcher(
        kube, path, store, lambda n, o, new: changes.append((n, o is None, new is None)), what="cm"
    )
    got: list[str] = []

    def on_event(ev: dict[str, Any]) -> None:
        if ev["involvedObject"]["namespace"] == namespace:  # the feed is cluster-wide
            got.append(ev["message"])

    feed = EventFeed(kube, "UnstickListWatchTest", on_event)
    _event(core_api, namespace, "first")
    watcher.start()
    feed.start()
    try:
        assert watcher.synced.wait(30) and feed.synced.wait(30)
        assert got == ["first"]
        _configmap(core_api, namespace, "c1")
        wait_until(lambda: "c1" in store.objects, timeout=30, what="'c1' in store.objects")
        assert "managedFields" not in store.objects["c1"]["metadata"]
        core_api.delete_namespaced_config_map("c1", namespace)
        wait_until(lambda: "c1" not in store.objects, timeout=30, what="'c1' not in store.objects")
        assert [c for c in changes if c[0] == "c1"] == [("c1", True, False), ("c1", False, True)]
        core_api.patch_namespaced_event("first", namespace, {"message": "second"})
        wait_until(
            lambda: got == ["first", "second"], timeout=30, what="got == ['first', 'second']"
        )
    finally:
        feed.stop()
        watcher.stop()


def test_errors_back_off_and_stop_ends_the_loop(control_plane: ControlPlane) -> None:
    """A collection the server does not have (404): the loop retries with a backoff, counts
    the errors, never says it is synced, and stops when asked."""
    sink = Recorder()
    spec = WatchSpec("/apis/nothing.example/v1/things", "missing", backoff_s=0.05)
    loop = ListWatch(Kube(_settings(control_plane)), spec, sink)
    loop.start()
    try:
        wait_until(lambda: loop.stats.errors >= 3, timeout=30, what="three retries")
        assert not loop.synced.is_set() and loop.stats.lists == 0
        assert sink.seen == [("BEGIN", "")] * len(sink.seen)  # nothing listed
    finally:
        loop.stop()
    assert not loop._thread.is_alive()
