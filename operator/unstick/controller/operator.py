"""Kopf wiring: handlers only translate Kopf's world into calls on the Runtime.

Kopf runs: the RemediationPolicy and Remediation watches, peering (one active replica),
the liveness endpoint. Pods, Nodes and CSINodes get NO Kopf handler at all: the lean
watchers (unstick.kube.podwatch, unstick.kube.objectwatch) feed the controller, started
by `on.startup` as a background task. Every handler here is `on.event`, which keeps no
state on the objects and writes nothing to them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import kopf

from unstick.controller import metrics
from unstick.controller.deciding.policies import PolicyBook
from unstick.controller.peering import PeeringGate, PeeringSettings
from unstick.controller.runtime import Runtime, RuntimeSettings
from unstick.core.remediation import (
    GROUP,
    NODE_STEPS_DONE_AT,
    PLURAL,
    POD_UID,
    POLICIES,
    POLICY_PLURAL,
    PROBE,
    PROBED_AT,
    VERSION,
    rfc3339,
)
from unstick.kube.client import ClientSettings, Kube

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    client: ClientSettings = field(default_factory=ClientSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    metrics_port: int = 9100  # 0: no metrics server
    peering: PeeringSettings | None = None  # None: standalone


@dataclass
class State:
    """What the handlers share (kept in Kopf's memo)."""

    settings: ControllerSettings
    policies: PolicyBook = field(default_factory=PolicyBook)
    kube: Kube | None = None
    runtime: Runtime | None = None
    task: asyncio.Task[None] | None = None
    gate_task: asyncio.Task[None] | None = None
    agent_marks: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def build_registry() -> kopf.OperatorRegistry:  # noqa: PLR0915 (one closure per handler)
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
        state: State = memo.state
        if state.kube is None:
            state.kube = Kube(state.settings.client)
        cfg = state.kube.configuration
        header = cfg.get_api_key_with_prefix("BearerToken") or ""
        scheme, _sep, token = header.partition(" ")
        return kopf.ConnectionInfo(
            server=cfg.host,
            ca_path=cfg.ssl_ca_cert,
            insecure=not cfg.verify_ssl,
            scheme=scheme if token else None,
            token=token or (scheme or None),
            certificate_path=cfg.cert_file,
            private_key_path=cfg.key_file,
        )

    @kopf.on.startup(registry=registry)
    async def startup(memo: Any, **_: Any) -> None:
        state: State = memo.state
        if state.kube is None:
            state.kube = Kube(state.settings.client)
        if state.settings.metrics_port:
            metrics.serve(state.settings.metrics_port)
        gate = PeeringGate(state.kube, state.settings.peering)
        state.runtime = Runtime(state.kube, state.policies, state.settings.runtime, gate=gate)
        state.task = asyncio.create_task(state.runtime.run(), name="unstick lean pod watcher")
        state.gate_task = asyncio.create_task(gate.run(), name="unstick peering gate")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: Any, **_: Any) -> None:
        state: State = memo.state
        for task in (state.task, state.gate_task):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    @kopf.on.probe(id="pods", registry=registry)
    def pods_probe(memo: Any, **_: Any) -> dict[str, Any]:
        """Liveness body: what the lean watcher holds (the HTTP status is Kopf's)."""
        state: State = memo.state
        runtime = state.runtime
        if runtime is None:
            return {"started": False}
        return {
            "started": True,
            "terminating": len(runtime.pods),
            "scheduled": len(runtime.scheduler),
            "synced": all(w.synced.is_set() for w in runtime.watchers),
            "active": runtime.gate(),
        }

    @kopf.on.event(GROUP, VERSION, POLICY_PLURAL, registry=registry)
    async def policy_event(
        type: str, body: Any, name: str, memo: Any, logger: Any, **_: Any
    ) -> None:
        state: State = memo.state
        if type == "DELETED":
            state.policies.remove(name)
        else:
            raw = {"metadata": {"name": name}, "spec": dict(body.get("spec") or {})}
            error = state.policies.update(name, raw)
            if error:
                logger.error(
                    "RemediationPolicy %s is invalid and will not be used: %s", name, error
                )
            await asyncio.to_thread(_write_validity, state, name, dict(body), error)
        if state.runtime is not None:
            state.runtime.policies_changed()

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def remediation_event(type: str, event: Any, memo: Any, **_: Any) -> None:
        state: State = memo.state
        # The raw object of the event, a plain dict: Kopf's `body` is a view that resolves
        # every key it is asked for (~5 % of the controller's GIL samples in a burst of 100
        # stuck pods, docs/benchmark.md). Nothing here changes it (the copies are copies).
        body: dict[str, Any] = event.get("object") or {}
        uid = (body.get("spec") or {}).get(POD_UID)
        if not uid or state.runtime is None:
            return
        if type == "DELETED":
            state.agent_marks.pop(uid, None)
            state.runtime.remediation_changed(uid, None)
            return
        state.runtime.remediation_changed(uid, body)
        status = body.get("status") or {}
        mark = ((status.get(PROBE) or {}).get(PROBED_AT), status.get(NODE_STEPS_DONE_AT))
        if state.agent_marks.get(uid) != mark:
            state.agent_marks[uid] = mark
            if any(mark):
                state.runtime.poke(uid)

    return registry


def _write_validity(state: State, name: str, body: dict[str, Any], error: str | None) -> None:
    """status.conditions[type=Valid] of a policy in the metav1.Condition shape (type,
    status, reason, message, lastTransitionTime, observedGeneration), written only when it
    changes; lastTransitionTime moves only when status does."""
    assert state.kube is not None
    wanted = {
        "type": "Valid",
        "status": "False" if error else "True",
        "reason": "InvalidSpec" if error else "Validated",
        "message": error or "policy is valid",
        "observedGeneration": (body.get("metadata") or {}).get("generation"),
    }
    current: dict[str, Any] = next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "Valid"),
        {},
    )
    if current.get("lastTransitionTime") and all(current.get(k) == v for k, v in wanted.items()):
        return
    same = current.get("status") == wanted["status"] and current.get("lastTransitionTime")
    wanted["lastTransitionTime"] = current["lastTransitionTime"] if same else rfc3339(time.time())
    state.kube.request(
        "PATCH",
        f"{POLICIES}/{name}/status",
        body={"status": {"conditions": [wanted]}},
        content_type="application/merge-patch+json",
    )


def essence_needed(registry: kopf.OperatorRegistry) -> bool:
    """Does any handler of `registry` read Kopf's essence of an object? Only changing
    (`on.create/update/resume/delete/field`) and spawning (daemons, timers) handlers do:
    Kopf compares an object's essence with the stored one to find their causes and stores
    it after a changing handler ran. `on.event`, activities and probes never read it."""
    return bool(registry._changing.get_all_handlers() or registry._spawning.get_all_handlers())


class LeanDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's "essence" of an object (spec, labels, annotations: for changing handlers)
    built without copying `status` first. Kopf deep-copies the whole body on every event
    and then drops status — for a Remediation (probe, actions) most of it: ~12 % of the
    controller's CPU in a burst of 100 stuck pods (docs/benchmark.md). The essence is the same:
    status is never part of it unless a handler names a field.

    With `needed=False` (a registry with no changing or spawning handler: `essence_needed`)
    no essence is built at all — Kopf builds one for every event of every watched
    resource and, without such handlers, uses it for nothing: the rest of the deep copy,
    ~11 % of the controller's GIL samples in that burst (docs/benchmark.md)."""

    def __init__(self, *, needed: bool = True) -> None:
        super().__init__()
        self.needed = needed

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        if not self.needed:
            return kopf.BodyEssence()
        if not extra_fields and "status" in body:
            lean: Any = {k: v for k, v in body.items() if k != "status"}
            body = kopf.Body(lean)
        return super().build(body=body, extra_fields=extra_fields)


def configure(
    settings: kopf.OperatorSettings,
    verbose: bool,
    registry: kopf.OperatorRegistry | None = None,
) -> None:
    """Kopf's settings for the controller; with its `registry`, an essence is built only
    if a handler reads it (`essence_needed`, LeanDiffBase)."""
    settings.posting.level = logging.WARNING  # Kopf posts only problems as Events
    needed = registry is None or essence_needed(registry)
    settings.persistence.diffbase_storage = LeanDiffBase(needed=needed)
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 5, 10, 20]
    if not verbose:
        logging.getLogger("kopf").setLevel(logging.INFO)
        # "Handler ... succeeded" for every Node/Remediation event: thousands of lines in a
        # burst, and threads queueing on the log handler's lock. Failures still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
