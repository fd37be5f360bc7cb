"""The lean pod watcher: paginated LIST + WATCH that keeps only terminating pods.

Why not Kopf's pod watch: it LISTs everything in one response and keeps per-object state;
at 100k pods that is the difference between megabytes and an OOM (DESIGN §5). Here:

- LIST in pages of 500 (limit + continue), each page parsed and dropped;
- WATCH from the list's resourceVersion with allowWatchBookmarks=true;
- 410 Gone (resourceVersion too old) → relist; any other error → reconnect with backoff;
- raw JSON only (no client model objects); from each pod only a small `TerminatingPod`
  record is kept, and only while the pod has `metadata.deletionTimestamp`.

The watcher runs in its own thread (the `kubernetes` client is blocking) and reports every
change through `on_change(uid, record_or_None)`; the controller hands that to its asyncio
loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException

from unstick.kube.client import JSON, Kube
from unstick.kube.listwatch import WatchStream, list_watch

log = logging.getLogger(__name__)

REMEDIATE_ANNOTATION = "unstick.dev/remediate"
# Not kept in the record: large and never read by the diagnosis.
BULKY_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})


@dataclass(frozen=True, slots=True)
class TerminatingPod:
    """What the controller remembers of a pod that has a deletionTimestamp."""

    namespace: str
    name: str
    uid: str
    node: str
    deletion_timestamp: float  # epoch seconds
    deletion_grace_period_s: int | None
    finalizers: tuple[str, ...]
    remediate: str | None  # value of the unstick.dev/remediate annotation
    containers_running: bool
    # What the diagnosis reads of the pod besides the above, so a stuck pod can be
    # diagnosed from memory the moment it becomes stuck (see `pod_json`):
    annotations: tuple[tuple[str, str], ...] = ()
    volumes: tuple[tuple[str, str | None, str | None], ...] = ()  # name, claim, CSI driver
    containers: tuple[tuple[str, str, bool], ...] = ()  # name, state, init
    ephemeral: tuple[tuple[str, str], ...] = ()  # name, state of `kubectl debug` containers
    # The version this record was made from: a DELETE carries it as a precondition, so an
    # act decided from this record fails (409) if the pod changed since. Not compared: a
    # new version with the same facts is not a change worth a look (it is still kept:
    # the watcher reports it, and the controller stores it without looking again).
    resource_version: str = field(default="", compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_time(value: str) -> float:
    """RFC3339 from the API server (always UTC, 'Z') → epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def terminating_record(pod: JSON) -> TerminatingPod | None:
    """The small record of a pod, or None when it is not terminating (or malformed)."""
    meta = pod.get("metadata") or {}
    stamp = meta.get("deletionTimestamp")
    if not stamp or not meta.get("uid"):
        return None
    try:
        deletion = parse_time(stamp)
    except (TypeError, ValueError):
        log.warning(
            "pod %s/%s: unreadable metadata.deletionTimestamp %r",
            meta.get("namespace"),
            meta.get("name"),
            stamp,
        )
        return None
    status = pod.get("status") or {}
    statuses = [
        *(status.get("containerStatuses") or []),
        *(status.get("initContainerStatuses") or []),
        *(status.get("ephemeralContainerStatuses") or []),
    ]
    running = any("running" in ((cs or {}).get("state") or {}) for cs in statuses)
    grace = meta.get("deletionGracePeriodSeconds")
    annotations = meta.get("annotations") or {}
    return TerminatingPod(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        uid=meta["uid"],
        node=(pod.get("spec") or {}).get("nodeName") or "",
        deletion_timestamp=deletion,
        deletion_grace_period_s=grace if isinstance(grace, int) else None,
        finalizers=tuple(meta.get("finalizers") or ()),
        remediate=annotations.get(REMEDIATE_ANNOTATION),
        containers_running=running,
        annotations=tuple(
            sorted(
                (str(k), str(v))
                for k, v in annotations.items()
                if k not in BULKY_ANNOTATIONS and isinstance(v, str)
            )
        ),
        volumes=_volumes(pod),
        containers=_containers(status),
        ephemeral=tuple((n, s) for n, s, _ in _containers(status, EPHEMERAL)),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def _volumes(pod: JSON) -> tuple[tuple[str, str | None, str | None], ...]:
    out = []
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(vol, dict) or not isinstance(vol.get("name"), str):
            continue
        claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
        driver = (vol.get("csi") or {}).get("driver")
        out.append((vol["name"], claim, driver))
    return tuple(out)


REGULAR = (("initContainerStatuses", True), ("containerStatuses", False))  # key, init
EPHEMERAL = (("ephemeralContainerStatuses", False),)


def _containers(
    status: JSON, keys: tuple[tuple[str, bool], ...] = REGULAR
) -> tuple[tuple[str, str, bool], ...]:
    out = []
    for key, init in keys:
        for cs in status.get(key) or []:
            if not isinstance(cs, dict) or not isinstance(cs.get("name"), str):
                continue
            state = cs.get("state") or {}
            known = [k for k in ("running", "waiting", "terminated") if k in state]
            out.append((cs["name"], known[0] if known else "", init))
    return tuple(out)


def pod_json(record: TerminatingPod) -> JSON:
    """The pod as the diagnosis reads it, rebuilt from the record (no API call)."""
    volumes: list[JSON] = []
    for name, claim, driver in record.volumes:
        vol: JSON = {"name": name}
        if claim:
            vol["persistentVolumeClaim"] = {"claimName": claim}
        if driver:
            vol["csi"] = {"driver": driver}
        volumes.append(vol)
    statuses: dict[str, list[JSON]] = {"initContainerStatuses": [], "containerStatuses": []}
    for name, state, init in record.containers:
        key = "initContainerStatuses" if init else "containerStatuses"
        statuses[key].append({"name": name, "state": {state: {}} if state else {}})
    statuses["ephemeralContainerStatuses"] = [
        {"name": name, "state": {state: {}} if state else {}} for name, state in record.ephemeral
    ]
    meta: JSON = {
        "namespace": record.namespace,
        "name": record.name,
        "uid": record.uid,
        "deletionTimestamp": datetime.fromtimestamp(record.deletion_timestamp, UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        ),
        "finalizers": list(record.finalizers),
        "annotations": dict(record.annotations),
    }
    if record.deletion_grace_period_s is not None:
        meta["deletionGracePeriodSeconds"] = record.deletion_grace_period_s
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": record.node, "volumes": volumes},
        "status": statuses,
    }


OnChange = Callable[[str, "TerminatingPod | None"], None]


@dataclass(frozen=True, slots=True)
class WatchSettings:
    namespace: str | None = None  # None: all namespaces
    page_size: int = 500
    watch_timeout_s: int = 300
    backoff_max_s: float = 30.0


class PodWatcher:
    """LIST+WATCH of pods in one thread; keeps `pods` = the terminating ones, by uid."""

    def __init__(self, kube: Kube, settings: WatchSettings, on_change: OnChange) -> None:
        self.kube = kube
        self.settings = settings
        self.on_change = on_change
        self.pods: dict[str, TerminatingPod] = {}
        self.synced = threading.Event()  # set after the first complete LIST
        self.lists = 0  # how many (re)lists were done: visible to tests and logs
        self._stop = threading.Event()
        self._stream = WatchStream()
        self._thread = threading.Thread(target=self._run, name="pod-watcher", daemon=True)

    @property
    def path(self) -> str:
        ns = self.settings.namespace
        return f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._stream.shutdown()
        self._thread.join(timeout=5)

    # -- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        list_watch(
            self._stop,
            self._relist,
            self._watch,
            log=log,
            what="pod watch",
            backoff_max_s=self.settings.backoff_max_s,
        )

    def _relist(self) -> str:
        seen: dict[str, TerminatingPod] = {}
        version = ""
        for page in self.kube.list_pages(self.path, limit=self.settings.page_size):
            version = (page.get("metadata") or {}).get("resourceVersion") or version
            for pod in page.get("items") or []:
                record = terminating_record(pod)
                if record is not None:
                    seen[record.uid] = record
        for uid in [u for u in self.pods if u not in seen]:
            del self.pods[uid]
            self.on_change(uid, None)
        for uid, record in seen.items():
            if _changed(self.pods.get(uid), record):
                self.pods[uid] = record
                self.on_change(uid, record)
        self.lists += 1
        self.synced.set()
        log.info("pod list: %d terminating pods, resourceVersion %s", len(seen), version)
        return version

    def _watch(self, version: str) -> str:
        query = {"resourceVersion": version, "allowWatchBookmarks": "true"}
        return self._stream.follow(
            self.kube,
            self.path,
            query,
            timeout_s=self.settings.watch_timeout_s,
            stop=self._stop,
            apply=self._apply,
        )

    def _apply(self, event: JSON) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            raise ApiException(status=code, reason=obj.get("message") or "watch error")
        meta = obj.get("metadata") or {}
        version: str | None = meta.get("resourceVersion")
        if kind == "BOOKMARK":
            return version
        uid = meta.get("uid")
        if not uid:
            return version
        record = None if kind == "DELETED" else terminating_record(obj)
        if record is None:
            if self.pods.pop(uid, None) is not None:
                self.on_change(uid, None)
        elif _changed(self.pods.get(uid), record):
            self.pods[uid] = record
            self.on_change(uid, record)
        return version


def _changed(old: TerminatingPod | None, new: TerminatingPod) -> bool:
    """A new record to report: different facts, or only a newer resourceVersion (a label,
    a condition, status.phase changed): a DELETE decided from the record carries its
    version as a precondition, and a stale one would be refused (409) every time."""
    return old != new or (old is not None and old.resource_version != new.resource_version)
