"""Issue #25: the namespace controller's NamespaceDeletionDiscoveryFailure condition → the
failing APIServices and what frees the namespace (pure: core/rules/unavailable_api.py)."""

from __future__ import annotations

from unstick.core.rules.unavailable_api import FailingAPI, failing_apis, namespace_api_message

TWO = (
    "Discovery failed for some groups, 2 failing: unable to retrieve the complete list of server "
    "APIs: custom.metrics.k8s.io/v1beta1: the server is currently unable to handle the request, "
    "metrics.k8s.io/v1beta1: stale GroupVersion discovery: metrics.k8s.io/v1beta1"
)


def ns(message: str = TWO, phase: str = "Terminating", status: str = "True") -> dict:
    cond = {"type": "NamespaceDeletionDiscoveryFailure", "status": status, "message": message}
    return {"metadata": {"name": "demo"}, "status": {"phase": phase, "conditions": [cond]}}


def test_every_failing_group_version_names_its_apiservice_once() -> None:
    apis = failing_apis(ns())
    assert [a.apiservice for a in apis] == [
        "v1beta1.custom.metrics.k8s.io",
        "v1beta1.metrics.k8s.io",
    ]


def test_only_a_terminating_namespace_with_the_condition_true_counts() -> None:
    assert failing_apis(ns(phase="Active")) == ()
    assert failing_apis(ns(status="False")) == ()
    assert failing_apis({"status": {"phase": "Terminating", "conditions": "junk"}}) == ()
    assert failing_apis({}) == ()


def test_the_message_says_what_frees_it_for_each_kind_of_apiservice() -> None:
    metrics = FailingAPI("metrics.k8s.io", "v1beta1")
    local = FailingAPI("apps", "v1")
    gone = FailingAPI("custom.metrics.k8s.io", "v1beta1")
    why = 'endpoints for service/metrics-server in "kube-system" have no addresses'
    services = {
        metrics.apiservice: {
            "spec": {"service": {"namespace": "kube-system", "name": "metrics-server"}},
            "status": {
                "conditions": [
                    {
                        "type": "Available",
                        "status": "False",
                        "reason": "MissingEndpoints",
                        "message": why,
                    }
                ]
            },
        },
        local.apiservice: {"spec": {}, "status": {}},
        gone.apiservice: None,
    }
    text = namespace_api_message("demo", (metrics, local, gone), services)
    assert "namespace demo is stuck Terminating" in text
    assert (
        "APIService v1beta1.metrics.k8s.io served by service kube-system/metrics-server is "
        "Available=False (MissingEndpoints: endpoints for service/metrics-server" in text
    )
    assert "restore service kube-system/metrics-server (its pods and endpoints)" in text
    assert "`kubectl delete apiservice v1beta1.metrics.k8s.io`" in text
    assert "APIService v1.apps served locally by the kube-apiserver is Available=unknown" in text
    assert "no APIService v1beta1.custom.metrics.k8s.io exists any more" in text
    assert text.endswith("unstick only reports this")
