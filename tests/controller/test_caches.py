"""Controller's in-memory inputs: the pod rebuilt from the watcher's record, Node caches."""

from __future__ import annotations

import threading
from dataclasses import replace

from unstick.controller.deciding.caches import FreshNodes, ObjectCache
from unstick.core.model.snapshot import parse_pod
from unstick.kube.objectwatch import trimmed
from unstick.kube.podwatch import pod_json, terminating_record

POD = {
    "metadata": {
        "namespace": "ns",
        "name": "web-0",
        "uid": "u-1",
        "deletionTimestamp": "2026-01-02T03:04:05Z",
        "deletionGracePeriodSeconds": 30,
        "finalizers": ["example.com/keep"],
        "annotations": {
            "unstick.dev/remediate": "true",
            "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 5000 + "}",
        },
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {
        "nodeName": "n1",
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
            {"name": "secrets", "csi": {"driver": "secrets.csi.k8s.io"}},
            {"name": "tmp", "emptyDir": {}},
        ],
        "containers": [{"name": "app", "image": "nginx"}],
    },
    "status": {
        "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
        "containerStatuses": [
            {"name": "app", "state": {"running": {}}},
            {"name": "side", "state": {}},
        ],
    },
}


def test_pod_rebuilt_from_record_gives_the_same_facts() -> None:
    record = terminating_record(POD)
    assert record is not None
    rebuilt = pod_json(record)
    full = parse_pod(POD)
    bulky = "kubectl.kubernetes.io/last-applied-configuration"
    expected = replace(full, annotations={k: v for k, v in full.annotations.items() if k != bulky})
    assert parse_pod(rebuilt) == expected
    # The bulky annotation is not kept in memory (and the diagnosis never reads it).
    assert "kubectl.kubernetes.io/last-applied-configuration" not in dict(record.annotations)


def test_object_cache_fetches_a_miss_once_and_watch_events_win() -> None:
    fetched: list[str] = []

    def fetch(name: str) -> dict[str, object] | None:
        fetched.append(name)
        return None  # absent

    cache = ObjectCache(fetch)
    assert cache.get("gone") is None
    assert cache.get("gone") is None
    assert fetched == ["gone"]  # absence remembered
    cache.put(
        "gone",
        trimmed(
            {"metadata": {"name": "gone", "managedFields": [1]}, "status": {"images": [1], "a": 1}}
        ),
    )
    node = cache.get("gone")
    assert node == {"metadata": {"name": "gone"}, "status": {"a": 1}}  # trimmed
    cache.delete("gone")
    assert cache.get("gone") is None
    assert fetched == ["gone"]


def test_object_cache_relist_makes_every_unlisted_name_absent() -> None:
    cache = ObjectCache(lambda name: {"metadata": {"name": name}})
    cache.put("a", {"metadata": {"name": "a"}})
    assert cache.get("b") == {"metadata": {"name": "b"}}  # fetched on a miss, kept
    old = cache.replace({"c": {"metadata": {"name": "c"}}})
    assert set(old) == {"a", "b"}
    # Deleted while the watch was down: absent now, not fetched again.
    assert cache.get("a") is None and cache.get("b") is None
    assert cache.get("c") == {"metadata": {"name": "c"}}


def test_object_cache_drops_a_get_answered_after_a_watch_event() -> None:
    cache: ObjectCache

    def fetch(name: str) -> dict[str, object] | None:
        cache.delete("other")  # a watch event arrives while the GET is in flight
        return {"metadata": {"name": name}}

    cache = ObjectCache(fetch)
    assert cache.get("n1") == {"metadata": {"name": "n1"}}
    assert cache.peek("n1") is None  # not stored: it may be older than the event
    assert len(cache) == 1  # only "other"


def test_fresh_nodes_share_one_read_per_node_within_max_age() -> None:
    now = [100.0]
    calls: list[str] = []
    gate = threading.Event()

    def fetch(name: str) -> dict[str, object] | None:
        calls.append(name)
        gate.wait(5)
        return None

    fresh = FreshNodes(fetch, max_age_s=1.0, clock=lambda: now[0])
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(fresh.get("n1"))) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(5)
    assert results == [None] * 8
    assert calls == ["n1"]  # one GET in flight served all eight
    now[0] += 0.9
    fresh.get("n1")
    assert calls == ["n1"]
    now[0] += 0.2  # 1.1 s after the read: too old to prove anything now
    fresh.get("n1")
    assert calls == ["n1", "n1"]
    fresh.get("n2")
    assert calls == ["n1", "n1", "n2"]
