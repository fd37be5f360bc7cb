"""The lean pod watcher: paginated LIST + WATCH that keeps only terminating pods.

Why not Kopf's pod watch: it LISTs everything in one response and keeps per-object state;
at 100k pods that is the difference between megabytes and an OOM (design.md §5). Here:

- the one watch loop (`listwatch.ListWatch`): LIST in pages of 500 (limit + continue),
  each page parsed and dropped; WATCH from the list's resourceVersion with
  allowWatchBookmarks=true; resume after a watch ends; 410 Gone (resourceVersion too old)
  → relist; any other error → reconnect with backoff;
- raw JSON only (no client model objects); from each pod only a small `TerminatingPod`
  record is kept, and only while the pod has `metadata.deletionTimestamp`; a relist
  replaces them all, so a pod deleted while the watch was down is reported gone.

The watcher runs in its own thread (the `kubernetes` client is blocking) and reports every
change through `on_change(uid, record_or_None)`; the controller hands that to its asyncio
loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from unstick.core.remediation import REMEDIATE, parse_time, rfc3339
from unstick.kube.client import JSON, Kube
from unstick.kube.listwatch import ListWatch, WatchSpec

__all__ = [
    "OnChange",
    "PodWatcher",
    "TerminatingPod",
    "WatchSettings",
    "pod_json",
    "terminating_record",
]

log = logging.getLogger(__name__)

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
    remediate: str | None  # value of the opt-in annotation (core.remediation.REMEDIATE)
    containers_running: bool
    # What the diagnosis reads of the pod besides the above, so a stuck pod can be
    # diagnosed from memory the moment it becomes stuck (see `pod_json`):
    annotations: tuple[tuple[str, str], ...] = ()
    volumes: tuple[tuple[str, str | None, str | None], ...] = ()  # name, claim, CSI driver
    containers: tuple[tuple[str, str, bool], ...] = ()  # name, state, init
    ephemeral: tuple[tuple[str, str], ...] = ()  # name, state of `kubectl debug` containers
    # metadata.generation, status.observedGeneration (0: none) and the DisruptionTarget
    # condition (status, reason, message), evidence of the diagnosis (docs/compatibility.md)
    generation: int = 0
    observed_generation: int = 0
    disruption: tuple[str, str, str] | None = None
    # The version this record was made from: a DELETE carries it as a precondition, so an
    # act decided from this record fails (409) if the pod changed since. Not compared: a
    # new version with the same facts is not a change worth a look (it is still kept:
    # the watcher reports it, and the controller stores it without looking again).
    resource_version: str = field(default="", compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def terminating_record(pod: JSON) -> TerminatingPod | None:
    """The small record of a pod, or None when it is not terminating (or malformed)."""
    meta = pod.get("metadata") or {}
    stamp = meta.get("deletionTimestamp")
    if not stamp or not meta.get("uid"):
        return None
    try:
        if not isinstance(stamp, str):
            raise TypeError(stamp)
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
        remediate=annotations.get(REMEDIATE),
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
        generation=_count(meta.get("generation")),
        observed_generation=_count(status.get("observedGeneration")),
        disruption=_disruption(status),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _disruption(status: JSON) -> tuple[str, str, str] | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "DisruptionTarget":
            words = (str(cond.get(k) or "") for k in ("status", "reason", "message"))
            state, reason, message = words
            return state, reason, message
    return None


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
        "deletionTimestamp": rfc3339(record.deletion_timestamp),
        "finalizers": list(record.finalizers),
        "annotations": dict(record.annotations),
    }
    if record.deletion_grace_period_s is not None:
        meta["deletionGracePeriodSeconds"] = record.deletion_grace_period_s
    if record.generation:
        meta["generation"] = record.generation
    status: JSON = dict(statuses)
    if record.observed_generation:
        status["observedGeneration"] = record.observed_generation
    if record.disruption is not None:
        state, reason, message = record.disruption
        status["conditions"] = [
            {"type": "DisruptionTarget", "status": state, "reason": reason, "message": message}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": record.node, "volumes": volumes},
        "status": status,
    }


OnChange = Callable[[str, "TerminatingPod | None"], None]


@dataclass(frozen=True, slots=True)
class WatchSettings:
    namespace: str | None = None  # None: all namespaces
    page_size: int = 500
    watch_timeout_s: int = 300
    backoff_max_s: float = 30.0


class PodWatcher:
    """Keeps `pods` = the terminating pods, by uid, fed by the one watch loop
    (`listwatch.ListWatch`, in a thread of its own); it is that loop's `Sink`."""

    def __init__(self, kube: Kube, settings: WatchSettings, on_change: OnChange) -> None:
        self.settings = settings
        self.on_change = on_change
        self.pods: dict[str, TerminatingPod] = {}
        self._seen: dict[str, TerminatingPod] = {}  # the (re)list in progress
        spec = WatchSpec(
            self.path,
            "pod-watcher",
            page_size=settings.page_size,
            watch_timeout_s=settings.watch_timeout_s,
            backoff_max_s=settings.backoff_max_s,
        )
        self.loop = ListWatch(kube, spec, self)
        self.synced = self.loop.synced  # set after the first complete LIST

    @property
    def path(self) -> str:
        ns = self.settings.namespace
        return f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"

    @property
    def lists(self) -> int:
        """How many complete (re)lists were done: visible to tests and logs."""
        return self.loop.stats.lists

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    # -- the Sink ----------------------------------------------------------------------

    def relist_begin(self) -> None:
        self._seen = {}

    def listed(self, obj: JSON) -> None:
        record = terminating_record(obj)
        if record is not None:
            self._seen[record.uid] = record

    def relist_end(self) -> None:
        """The list replaces what was known: a pod gone meanwhile is reported gone."""
        seen, self._seen = self._seen, {}
        for uid in [u for u in self.pods if u not in seen]:
            del self.pods[uid]
            self.on_change(uid, None)
        for uid, record in seen.items():
            if _changed(self.pods.get(uid), record):
                self.pods[uid] = record
                self.on_change(uid, record)
        log.info("pod list: %d terminating pods", len(seen))

    def changed(self, kind: str, obj: JSON) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        if not uid:
            return
        record = None if kind == "DELETED" else terminating_record(obj)
        if record is None:
            if self.pods.pop(uid, None) is not None:
                self.on_change(uid, None)
        elif _changed(self.pods.get(uid), record):
            self.pods[uid] = record
            self.on_change(uid, record)


def _changed(old: TerminatingPod | None, new: TerminatingPod) -> bool:
    """A new record to report: different facts, or only a newer resourceVersion (a label,
    a condition, status.phase changed): a DELETE decided from the record carries its
    version as a precondition, and a stale one would be refused (409) every time."""
    return old != new or (old is not None and old.resource_version != new.resource_version)
