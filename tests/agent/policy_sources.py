"""RemediationPolicy and namespace answers for Handlers built without an API server.

What `unstick.agent.authority.rederive.read_mandate` would read from the API for a pod in a
namespace labelled `unstick.dev/remediate=true` under the policy `default`; the policy's
`dryRun`, `actions` and `lazyUnmount` are the test's to choose. Tests with a real API
server create the real objects instead (`default_policy`, test_agent_end_to_end.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from unstick.agent.authority.rederive import PolicySources
from unstick.core.remediation import POLICIES

NODE_ACTIONS = ["replay-unpublish", "unmount", "rmdir-stale", "restart-kubelet"]


def opted_in(
    *, dry_run: bool = False, actions: list[str] | None = None, lazy_unmount: bool = False
) -> PolicySources:
    policy: dict[str, Any] = {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "default"},
        "spec": {
            "dryRun": dry_run,
            "actions": NODE_ACTIONS if actions is None else actions,
            "lazyUnmount": lazy_unmount,
            "rateLimits": {"clusterPerMinute": 1000, "nodePerMinute": 1000},
        },
    }
    return PolicySources(
        namespace=lambda name: {
            "metadata": {"name": name, "labels": {"unstick.dev/remediate": "true"}}
        },
        policy=lambda name: policy if name == "default" else None,
    )


@contextmanager
def default_policy(kube: Any, actions: list[str]) -> Iterator[None]:
    """The admin's `default` RemediationPolicy, not a dry run, permitting these actions
    (`PATCH {POLICIES}/default` to change it); deleted at the end."""
    policy = {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "default"},
        "spec": {"dryRun": False, "actions": actions},
    }
    kube.request("POST", POLICIES, body=policy)
    try:
        yield
    finally:
        kube.request("DELETE", f"{POLICIES}/default")
