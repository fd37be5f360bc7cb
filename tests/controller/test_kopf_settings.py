"""Kopf's settings for the controller (controller/operator.py `configure`): Kopf's essence
of an object is built only if a handler of the registry reads it (issue 23, fifth round)."""

from __future__ import annotations

from typing import Any

import kopf

from unstick.controller.operator import LeanDiffBase, build_registry, configure, essence_needed

REMEDIATION = {
    "apiVersion": "unstick.dev/v1alpha1",
    "kind": "Remediation",
    "metadata": {"namespace": "ns", "name": "p-1234abcd", "labels": {"a": "b"}},
    "spec": {"podUID": "uid-1", "nodeName": "n1"},
    "status": {"phase": "Remediating", "actions": [{"action": "unmount"}]},
}


def _diffbase(registry: kopf.OperatorRegistry | None) -> LeanDiffBase:
    settings = kopf.OperatorSettings()
    configure(settings, verbose=False, registry=registry)
    diffbase = settings.persistence.diffbase_storage
    assert isinstance(diffbase, LeanDiffBase)
    return diffbase


def test_the_controllers_handlers_never_read_the_essence_so_none_is_built() -> None:
    """Every handler of the controller is on.event (design.md §5): no essence, no copy."""
    registry = build_registry()
    assert not essence_needed(registry)
    diffbase = _diffbase(registry)
    assert diffbase.build(body=kopf.Body(REMEDIATION)) == {}


def test_a_changing_handler_gets_its_essence() -> None:
    """Were a changing handler ever added, its causes would still be found: the essence is
    spec, labels and annotations, as Kopf's own, without status."""
    registry = build_registry()

    @kopf.on.update("unstick.dev", "v1alpha1", "remediations", registry=registry)
    def updated(**_: Any) -> None:
        pass

    assert essence_needed(registry)
    essence = _diffbase(registry).build(body=kopf.Body(REMEDIATION))
    assert essence["spec"] == REMEDIATION["spec"]
    assert essence["metadata"] == {"labels": {"a": "b"}}
    assert "status" not in essence


def test_without_a_registry_the_essence_is_built() -> None:
    essence = _diffbase(None).build(body=kopf.Body(REMEDIATION))
    assert essence["spec"] == REMEDIATION["spec"]
