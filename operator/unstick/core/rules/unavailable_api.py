"""A namespace stuck Terminating because an aggregated API is unavailable
(kubernetes#83332).

The namespace controller (kube-controller-manager) must list every namespaced resource of
every API group before it can finish a namespace. When an aggregated API's APIService
does not answer (its Service gone, no endpoints, its pods failing), discovery of that
group fails, the controller sets the condition `NamespaceDeletionDiscoveryFailure` and
retries for ever:

    type: NamespaceDeletionDiscoveryFailure, status: "True", reason: DiscoveryFailed,
    message: Discovery failed for some groups, 1 failing: unable to retrieve the complete
      list of server APIs: metrics.k8s.io/v1beta1: the server is currently unable to
      handle the request

This module reads that condition (the failing group/versions), names the APIService of
each (`<version>.<group>`), and — given the APIService objects as the API returns them —
says what is wrong with it and what frees the namespace: restore its Service (its pods,
its endpoints), or delete the APIService if the API is gone for good. Report only: unstick
never deletes an APIService nor finalizes a namespace.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DISCOVERY_FAILURE = "NamespaceDeletionDiscoveryFailure"
_GROUP_VERSION = re.compile(r"(?:^|[:,]\s*)([a-z0-9][a-z0-9.-]*)/(v[0-9][a-z0-9]*):\s")
MAX_NAMED = 5


@dataclass(frozen=True, slots=True)
class FailingAPI:
    group: str
    version: str

    @property
    def apiservice(self) -> str:
        """The APIService serving this group/version (named `<version>.<group>`)."""
        return f"{self.version}.{self.group}"


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def failing_apis(namespace: Mapping[str, object]) -> tuple[FailingAPI, ...]:
    """The group/versions whose discovery fails, per the namespace's condition (none when
    the namespace is not Terminating or has no such condition with status True)."""
    status = _mapping(namespace.get("status"))
    if status.get("phase") != "Terminating":
        return ()
    conditions = status.get("conditions")
    found: dict[str, FailingAPI] = {}
    for c in conditions if isinstance(conditions, list) else []:
        cond = _mapping(c)
        if cond.get("type") != DISCOVERY_FAILURE or cond.get("status") != "True":
            continue
        message = cond.get("message")
        for group, version in _GROUP_VERSION.findall(message if isinstance(message, str) else ""):
            api = FailingAPI(group, version)
            found.setdefault(api.apiservice, api)
    return tuple(found.values())


def _available(apiservice: Mapping[str, object]) -> tuple[str, str, str]:
    """(status, reason, message) of the APIService's Available condition ("" if none)."""
    conditions = _mapping(apiservice.get("status")).get("conditions")
    for c in conditions if isinstance(conditions, list) else []:
        cond = _mapping(c)
        if cond.get("type") == "Available":
            return (
                str(cond.get("status") or ""),
                str(cond.get("reason") or ""),
                str(cond.get("message") or ""),
            )
    return "", "", ""


def api_words(api: FailingAPI, apiservice: Mapping[str, object] | None) -> str:
    """One failing API: its APIService, what is wrong, and what frees the namespace."""
    name = api.apiservice
    if apiservice is None:
        return (
            f"{api.group}/{api.version}: no APIService {name} exists any more (discovery may "
            "still be catching up; if the condition stays, look at `kubectl get apiservices`)"
        )
    service = _mapping(_mapping(apiservice.get("spec")).get("service"))
    status, reason, message = _available(apiservice)
    state = f"Available={status or 'unknown'}" + (f" ({reason}: {message})" if reason else "")
    if service.get("name"):
        served = f"served by service {service.get('namespace')}/{service.get('name')}"
        fix = (
            f"restore service {service.get('namespace')}/{service.get('name')} (its pods and "
            f"endpoints), or, if that API is gone for good, `kubectl delete apiservice {name}`"
        )
    else:
        served, fix = "served locally by the kube-apiserver", "look at the kube-apiserver's log"
    return f"{api.group}/{api.version}: APIService {name} {served} is {state}; to free it: {fix}"


def namespace_api_message(
    namespace: str,
    apis: Sequence[FailingAPI],
    apiservices: Mapping[str, Mapping[str, object] | None],
) -> str:
    """The Event on a namespace held by unavailable aggregated APIs."""
    parts = [api_words(a, apiservices.get(a.apiservice)) for a in apis[:MAX_NAMED]]
    if len(apis) > MAX_NAMED:
        parts.append(f"and {len(apis) - MAX_NAMED} more")
    return (
        f"namespace {namespace} is stuck Terminating: the namespace controller cannot list "
        f"the resources of {len(apis)} API group version(s) "
        f"(NamespaceDeletionDiscoveryFailure) — " + "; ".join(parts) + ". unstick only reports this"
    )
