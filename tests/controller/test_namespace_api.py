"""Issue #25 (kubernetes#83332) against a real kube-apiserver: an aggregated APIService whose
Service does not exist (the apiserver's own availability check marks it Available=False,
ServiceNotFound), and a namespace stuck Terminating whose NamespaceDeletionDiscoveryFailure
condition names its group — with the namespace controller's exact text (the envtest runs no
kube-controller-manager, so the test sets the condition as that controller does). The
controller's check posts one Event naming the APIService, its Service and state and what frees
the namespace, and counts it in `unstick_namespaces_blocked_by_api`. Nothing is changed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from devcluster.process import wait_until
from unstick.controller.aftermath.held_namespaces import REASON, ApiBlockedNamespaces
from unstick.kube.client import Kube

pytestmark = pytest.mark.envtest

APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"


@pytest.fixture
def dead_api(kube: Kube) -> Iterator[tuple[str, str, str]]:
    """(group, APIService name, Service name): an APIService whose Service does not exist."""
    suffix = uuid.uuid4().hex[:8]
    group, service = f"dead{suffix}.example.com", f"missing-{suffix}"
    name = f"v1beta1.{group}"
    kube.request(
        "POST",
        APISERVICES,
        body={
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": name},
            "spec": {
                "group": group, "version": "v1beta1", "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 1000, "versionPriority": 15,
                "service": {"namespace": "default", "name": service, "port": 443},
            },
        },
    )  # fmt: skip
    try:
        yield group, name, service
    finally:
        kube.request("DELETE", f"{APISERVICES}/{name}")


def _unavailable(kube: Kube, name: str) -> str | None:
    obj = kube.get(f"{APISERVICES}/{name}") or {}
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Available" and c.get("status") == "False":
            return str(c.get("reason"))
    return None


def test_a_namespace_held_by_a_dead_apiservice_is_reported_with_what_frees_it(
    kube: Kube, core_api: Any, dead_api: tuple[str, str, str]
) -> None:
    group, apiservice, service = dead_api
    reason = wait_until(lambda: _unavailable(kube, apiservice), timeout=60, what="Available=False")
    ns = f"t-{uuid.uuid4().hex[:10]}"
    core_api.create_namespace({"metadata": {"name": ns}})
    try:
        core_api.delete_namespace(ns)  # no namespace controller here: it stays Terminating
        message = (
            "Discovery failed for some groups, 1 failing: unable to retrieve the complete list "
            f"of server APIs: {group}/v1beta1: the server is currently unable to handle the "
            "request"
        )
        condition = {
            "type": "NamespaceDeletionDiscoveryFailure", "status": "True",
            "reason": "DiscoveryFailed", "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }  # fmt: skip
        core_api.patch_namespace_status(ns, {"status": {"conditions": [condition]}})
        obj = kube.get(f"/api/v1/namespaces/{ns}")
        assert obj is not None and obj["status"]["phase"] == "Terminating"

        check = ApiBlockedNamespaces(kube)
        check.check([obj])
        check.check([obj])  # once per change: no second Event

        def events() -> list[dict[str, Any]]:
            return [
                e
                for e in kube.list_all(
                    "/api/v1/namespaces/default/events", {"fieldSelector": f"reason={REASON}"}
                )
                if (e.get("involvedObject") or {}).get("name") == ns
            ]

        found = wait_until(events, timeout=30, what="the Event")
        assert len(found) == 1 and (found[0].get("count") or 1) == 1, found
        text = found[0]["message"]
        assert f"namespace {ns} is stuck Terminating" in text
        assert f"APIService {apiservice} served by service default/{service}" in text
        assert f"is Available=False ({reason}:" in text
        assert f"`kubectl delete apiservice {apiservice}`" in text
        sample = REGISTRY.get_sample_value(
            "unstick_namespaces_blocked_by_api", {"apiservice": apiservice}
        )
        assert sample == 1.0
        assert kube.get(f"{APISERVICES}/{apiservice}") is not None  # nothing was changed
    finally:
        kube.request("PUT", f"/api/v1/namespaces/{ns}/finalize", body={
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
            "spec": {"finalizers": []},
        })  # fmt: skip
    check.check([])
    assert (
        REGISTRY.get_sample_value("unstick_namespaces_blocked_by_api", {"apiservice": apiservice})
        == 0.0
    )
