"""The agent's namespace and RemediationPolicy reads for a mandate from its own list+watch
(agent/authority/watched.py, docs/agent.md "Namespace and policy reads from watches"):
answered from a watch only while it is live, a policy only at the mandate's version, a GET
in every other case — and a change the watch delivered is what the next check reads."""

from __future__ import annotations

from typing import Any

from unstick.agent.authority.rederive import PolicySources, read_mandate
from unstick.agent.authority.watched import Watched, namespace_labels
from unstick.core.vocabulary import Refusal

NS = "apps"
POD = {"metadata": {"name": "p", "namespace": NS, "annotations": {}}}


def _ns(version: str, opted_in: bool = True) -> dict[str, Any]:
    labels = {"unstick.dev/remediate": "true"} if opted_in else {}
    return {"metadata": {"name": NS, "labels": labels, "resourceVersion": version, "uid": "u"}}


def _policy(version: str, dry_run: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "default", "resourceVersion": version},
        "spec": {"dryRun": dry_run, "actions": ["unmount", "rmdir-stale"]},
    }


class Api:
    """The API server's answers to GETs, counted."""

    def __init__(self, ns: dict[str, Any], policy: dict[str, Any]) -> None:
        self.ns, self.policy = ns, policy
        self.gets: list[str] = []

    def sources(self, namespaces: Watched, policies: Watched) -> PolicySources:
        def ns(name: str) -> Any:
            self.gets.append("namespace")
            return self.ns

        def policy(name: str) -> Any:
            self.gets.append("policy")
            return self.policy

        return PolicySources(ns, policy, namespaces.peek, policies.peek)


def _listed(cache: Watched, *objects: dict[str, Any]) -> Watched:
    """A relist of `objects` and a watch connected after it."""
    cache.relist_begin()
    for obj in objects:
        cache.listed(obj)
    cache.relist_end()
    cache.watch.synced.set()
    cache._connecting()
    return cache


def _caches(ns: dict[str, Any], policy: dict[str, Any]) -> tuple[Watched, Watched]:
    namespaces = Watched(None, "/api/v1/namespaces", "ns", keep=namespace_labels)
    return _listed(namespaces, ns), _listed(Watched(None, "/policies", "p"), policy)


def test_a_mandate_at_the_watched_version_reads_nothing_from_the_api() -> None:
    api = Api(_ns("1"), _policy("7"))
    sources = api.sources(*_caches(_ns("1"), _policy("7")))
    m = read_mandate(sources, NS, POD, policy_version="7")
    assert m and m.policy is not None and m.policy.resource_version == "7"
    assert api.gets == []


def test_a_policy_at_another_version_than_the_mandate_names_is_read_with_a_get() -> None:
    """The watch has not delivered the controller's version yet (or the policy changed
    since): the agent reads it from the API, and what the API says holds (dry run)."""
    api = Api(_ns("1"), _policy("8", dry_run=True))
    sources = api.sources(*_caches(_ns("1"), _policy("7")))
    m = read_mandate(sources, NS, POD, policy_version="8")
    assert api.gets == ["policy"]
    assert m.policy is not None and m.policy.dry_run


def test_without_a_mandate_every_read_is_a_get() -> None:
    api = Api(_ns("1"), _policy("7"))
    sources = api.sources(*_caches(_ns("1"), _policy("7")))
    read_mandate(sources, NS, POD)
    assert api.gets == ["namespace", "policy"]


def test_a_watch_that_is_not_live_answers_nothing() -> None:
    """Not listed yet, relisting, or an error since it last connected: a GET each."""
    namespaces, policies = _caches(_ns("1"), _policy("7"))
    policies.watch.stats.errors += 1  # the watch broke: until it connects again
    namespaces.relist_begin()  # a relist in progress
    api = Api(_ns("1"), _policy("7"))
    read_mandate(api.sources(namespaces, policies), NS, POD, policy_version="7")
    assert api.gets == ["namespace", "policy"]
    policies._connecting()
    namespaces.listed(_ns("1"))
    namespaces.relist_end()
    api.gets.clear()
    read_mandate(api.sources(namespaces, policies), NS, POD, policy_version="7")
    assert api.gets == []
    fresh = Watched(None, "/policies", "p")  # never listed
    assert fresh.peek("default") is None and not fresh.live()


def test_what_the_watch_delivered_is_what_the_next_check_reads() -> None:
    """The namespace's opt-in label removed, the policy deleted: the next check sees it."""
    namespaces, policies = _caches(_ns("1"), _policy("7"))
    api = Api(_ns("2", opted_in=False), None)  # type: ignore[arg-type]
    namespaces.changed("MODIFIED", _ns("2", opted_in=False))
    m = read_mandate(api.sources(namespaces, policies), NS, POD, policy_version="7")
    assert m.refusal is Refusal.NOT_OPTED_IN and api.gets == []
    namespaces.changed("MODIFIED", _ns("3"))
    policies.changed("DELETED", _policy("9"))
    m = read_mandate(api.sources(namespaces, policies), NS, POD, policy_version="7")
    assert api.gets == ["policy"] and m.policy is None  # not kept: read, and it is gone


def test_a_namespace_is_kept_without_more_than_its_labels() -> None:
    kept = namespace_labels({**_ns("1"), "spec": {"finalizers": ["kubernetes"]}})
    assert kept == {"metadata": {"name": NS, "labels": _ns("1")["metadata"]["labels"],
                                 "resourceVersion": "1"}}  # fmt: skip
