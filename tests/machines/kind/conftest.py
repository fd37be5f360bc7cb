"""The kind suite's one cluster for all of tests/kind (tests/kind/support.py): made before
its first test, deleted after its last, so the rest of the session runs without it; the
policy and namespace fixtures of its tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .support import Kind, kind_cluster


@pytest.fixture(scope="package")
def kind() -> Iterator[Kind]:
    with kind_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def quick_policy(kind: Kind) -> Iterator[None]:
    """The default policy with 5 s of slack (60 s by default) and a node lost after 10 s
    (5 min): kube-controller-manager's pod GC force-deletes the pods of a deleted node
    40-60 s after it is gone, and would otherwise get there first; and the tests wait
    less."""
    patch = '{"spec": {"slackSeconds": %d, "nodeLostAfterSeconds": %d}}'
    kind.kubectl("patch", "remediationpolicy", "default", "--type=merge", "-p", patch % (5, 10))
    try:
        yield
    finally:
        kind.kubectl(
            "patch", "remediationpolicy", "default", "--type=merge", "-p", patch % (60, 300)
        )


@pytest.fixture
def namespaces(kind: Kind) -> Iterator[list[str]]:
    """Namespaces a test makes (append to the list), deleted afterwards."""
    made: list[str] = []
    try:
        yield made
    finally:
        for ns in made:
            kind.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")
