"""Namespaces held by an unavailable aggregated API (kubernetes#83332): the
controller's side of `unstick.core.rules.unavailable_api`.

From the namespaces the aftermath thread already keeps in memory
(`controller/aftermath/watcher.py`):
a Terminating namespace whose condition `NamespaceDeletionDiscoveryFailure` names failing
group/versions gets one Event (reason `NamespaceBlockedByUnavailableAPI`, in namespace
`default`: a Terminating namespace accepts no new objects) naming each APIService, its
Service and state, and what frees it — once per change of the failing set (the
APIServices are read, a GET each, only then). `unstick_namespaces_blocked_by_api{apiservice}`
counts such namespaces per APIService. Report only: nothing is deleted or finalized.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import quote

from prometheus_client import Gauge

from unstick.core.rules.unavailable_api import FailingAPI, failing_apis, namespace_api_message
from unstick.kube.client import JSON, Kube
from unstick.kube.events import post_event

log = logging.getLogger(__name__)

REASON = "NamespaceBlockedByUnavailableAPI"
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"
BLOCKED_BY_API = Gauge(
    "unstick_namespaces_blocked_by_api",
    "Terminating namespaces the namespace controller cannot finish because discovery of an "
    "aggregated API fails (NamespaceDeletionDiscoveryFailure), per APIService",
    ["apiservice"],
)


class ApiBlockedNamespaces:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.announced: dict[str, tuple[str, ...]] = {}
        self.series: set[str] = set()

    def check(self, namespaces: Iterable[JSON]) -> None:
        """One pass over the namespaces in memory."""
        counts: dict[str, int] = {}
        seen: set[str] = set()
        for ns in namespaces:
            name = str((ns.get("metadata") or {}).get("name") or "")
            apis = failing_apis(ns)
            if not name or not apis:
                continue
            seen.add(name)
            names = tuple(a.apiservice for a in apis)
            for s in names:
                counts[s] = counts.get(s, 0) + 1
            if self.announced.get(name) != names and self._announce(ns, name, apis):
                self.announced[name] = names
        for gone in set(self.announced) - seen:
            del self.announced[gone]
        for s in self.series - set(counts):
            BLOCKED_BY_API.labels(apiservice=s).set(0)
        for s, n in counts.items():
            BLOCKED_BY_API.labels(apiservice=s).set(n)
        self.series |= set(counts)

    def _announce(self, ns: JSON, name: str, apis: tuple[FailingAPI, ...]) -> bool:
        try:
            services = {a.apiservice: self._apiservice(a.apiservice) for a in apis}
        except Exception:
            log.warning("cannot read the APIServices of namespace %s's condition", name)
            return False
        meta = ns.get("metadata") or {}
        ref = {"kind": "Namespace", "apiVersion": "v1", "name": name, "uid": meta.get("uid")}
        post_event(self.kube, ref, REASON, namespace_api_message(name, apis, services))
        return True

    def _apiservice(self, name: str) -> JSON | None:
        return self.kube.get(f"{APISERVICES}/{quote(name, safe='')}")
