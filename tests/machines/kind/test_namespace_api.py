"""Issue #25 (kubernetes#83332) with a real kube-controller-manager: an aggregated
APIService whose Service does not exist, and a namespace deleted meanwhile. The real
namespace controller cannot list that group, sets `NamespaceDeletionDiscoveryFailure` and
keeps the namespace Terminating; unstick's controller (helm-installed in the kind cluster)
posts one `NamespaceBlockedByUnavailableAPI` Event naming the APIService, its Service and
what frees the namespace, and counts it in `unstick_namespaces_blocked_by_api` (with
every other namespace deleted meanwhile: the namespace controller finishes none). It
changes nothing: once the test deletes the APIService, the namespace controller finishes
the namespace by itself. (tests/envtest/test_namespace_api.py has the same check against
an API server without a kube-controller-manager, the condition set as it would be.)"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from devcluster.process import wait_until
from unstick.controller.aftermath.held_namespaces import REASON

from .support import NAMESPACE, Kind, sample
from .test_kind import controller_pod

pytestmark = [pytest.mark.kind, pytest.mark.timeout(600)]

METRIC = "unstick_namespaces_blocked_by_api"


def _condition(namespace: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (namespace.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def test_a_namespace_held_by_a_dead_apiservice_is_reported_and_left_alone(kind: Kind) -> None:
    suffix = uuid.uuid4().hex[:8]
    group, service = f"dead{suffix}.example.com", f"missing-{suffix}"
    apiservice, ns = f"v1beta1.{group}", f"kind-deadapi-{suffix}"
    kind.apply(
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": apiservice},
            "spec": {
                "group": group,
                "version": "v1beta1",
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 1000,
                "versionPriority": 15,
                "service": {"namespace": "default", "name": service, "port": 443},
            },
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    try:
        kind.kubectl("delete", "namespace", ns, "--wait=false")

        def event() -> dict[str, Any] | None:
            return next(
                (
                    e
                    for e in kind.events("default")
                    if e.get("reason") == REASON
                    and (e.get("involvedObject") or {}).get("name") == ns
                ),
                None,
            )

        found = wait_until(event, timeout=240, what="the NamespaceBlockedByUnavailableAPI Event")
        text = found["message"]
        assert f"namespace {ns} is stuck Terminating" in text, text
        assert f"APIService {apiservice} served by service default/{service}" in text, text
        assert f"`kubectl delete apiservice {apiservice}`" in text, text
        # the real namespace controller's own condition (nothing in this test sets it)
        held = kind.get("namespace", ns)
        assert held["status"]["phase"] == "Terminating", held["status"]
        condition = _condition(held, "NamespaceDeletionDiscoveryFailure")
        assert condition is not None and group in condition["message"], held["status"]
        controller = controller_pod(kind)["metadata"]["name"]
        metrics = kind.scrape(controller, 9100, NAMESPACE)
        # ≥ 1: every namespace deleted meanwhile is held by the same APIService (the
        # namespace controller cannot finish any of them), e.g. the earlier tests' ones
        assert sample(metrics, METRIC, apiservice=apiservice) >= 1, metrics
        assert kind.get("apiservice", apiservice)["metadata"]["name"] == apiservice  # untouched

        # What frees it, as the Event says: the namespace controller then ends it itself.
        kind.kubectl("delete", "apiservice", apiservice)

        def namespace_gone() -> bool:
            names = [n["metadata"]["name"] for n in kind.get("namespaces")["items"]]
            return ns not in names

        wait_until(namespace_gone, timeout=240, what=f"namespace {ns} finished")
        wait_until(
            lambda: (
                sample(kind.scrape(controller, 9100, NAMESPACE), METRIC, apiservice=apiservice) == 0
            ),
            timeout=120,
            what=f"{METRIC} back to 0",
        )
    finally:
        kind.kubectl("delete", "apiservice", apiservice, "--ignore-not-found")
        kind.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")
