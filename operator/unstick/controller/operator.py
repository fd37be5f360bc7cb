"""Kopf wiring: handlers only translate Kopf's world into calls on the Runtime.

Kopf runs: the operator's lifecycle (login, start-up, clean-up), the liveness endpoint
and the RemediationPolicy watch — in every replica (Kopf's own peering is not used). Which
replica acts is decided by the leader election on a Lease (controller/leader.py): its
guard refuses every write of the controller's client on a standby, and the lean watcher
dispatches no pass there. Pods, Nodes, CSINodes and Remediations get NO Kopf handler at
all: the project's lean list+watches (unstick.kube.podwatch, unstick.kube.objectwatch,
controller/records/watch.py) feed the controller, started by `on.startup` as a
background task (design.md §5: Kopf's per-event work on the Remediations was most of the
controller's CPU in a burst). Every handler here is `on.event`, which keeps no state on
the objects and writes nothing to them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import kopf

from unstick.controller import metrics
from unstick.controller.deciding.policies import PolicyBook
from unstick.controller.leader import Elector, LeaseSettings, NotLeading
from unstick.controller.runtime import Runtime, RuntimeSettings
from unstick.core.remediation import GROUP, POLICIES, POLICY_PLURAL, VERSION, rfc3339
from unstick.kube.client import ClientSettings, Kube

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    client: ClientSettings = field(default_factory=ClientSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    metrics_port: int = 9100  # 0: no metrics server
    election: LeaseSettings | None = None  # None: standalone, always the leader


@dataclass
class State:
    """What the handlers share (kept in Kopf's memo)."""

    settings: ControllerSettings
    policies: PolicyBook = field(default_factory=PolicyBook)
    kube: Kube | None = None
    runtime: Runtime | None = None
    task: asyncio.Task[None] | None = None
    elector: Elector | None = None
    elector_thread: threading.Thread | None = None
    # set when this replica lost the lease: Kopf stops, the process exits (and restarts
    # as a standby)
    stop_flag: threading.Event = field(default_factory=threading.Event)

    def leading(self) -> bool:
        return self.elector is None or self.elector.leading()


def _client(state: State) -> Kube:
    """The controller's client; with an election, every write it sends is guarded."""
    if state.kube is None:
        state.kube = Kube(state.settings.client)
        election = state.settings.election
        if election is not None:
            # The Lease's own client: short timeouts, no retries (the loop retries), and a
            # connection of its own, never queued behind the workers' requests.
            timeout = max(1.0, election.renew_deadline_s / 2)
            own = replace(state.settings.client, timeout_s=timeout, retry_attempts=1, pool_size=2)
            state.elector = Elector(Kube(own), election)
            state.kube.write_guard = state.elector.check
    return state.kube


def build_registry() -> kopf.OperatorRegistry:  # noqa: PLR0915 (one closure per handler)
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
        state: State = memo.state
        cfg = _client(state).configuration
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
    async def startup(memo: Any, settings: kopf.OperatorSettings, **_: Any) -> None:
        state: State = memo.state
        kube = _client(state)
        if state.settings.metrics_port:
            metrics.serve(state.settings.metrics_port)
        state.runtime = Runtime(kube, state.policies, state.settings.runtime, gate=state.leading)
        state.task = asyncio.create_task(state.runtime.run(), name="unstick lean pod watcher")
        elector = state.elector
        if elector is None:
            metrics.LEADER.set(1)
            return
        metrics.LEADER.set(0)
        settings.posting.enabled = False  # Kopf's own Events too: only from the leader
        loop = asyncio.get_running_loop()

        def started() -> None:  # the elector's thread
            metrics.LEADER.set(1)
            settings.posting.enabled = True
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(_revalidate(state)))

        def stopped() -> None:
            metrics.LEADER.set(0)
            settings.posting.enabled = False
            if elector.lost:
                state.stop_flag.set()  # Kopf stops; the process exits and restarts as standby

        elector.on_started, elector.on_stopped = started, stopped
        state.elector_thread = threading.Thread(
            target=elector.run, name="unstick leader election", daemon=True
        )
        state.elector_thread.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: Any, **_: Any) -> None:
        state: State = memo.state
        if state.elector is not None:
            state.elector.stop.set()
        if state.task is not None:
            state.task.cancel()
            try:
                await state.task
            except (asyncio.CancelledError, Exception):
                pass
        if state.elector is not None:  # after the last write: the standby need not wait
            await asyncio.to_thread(state.elector.release)

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
            "synced": runtime.synced(),
            "remediations": runtime.remediation_watch.size(),
            "active": runtime.gate(),  # holds the leader Lease (always, standalone)
        }

    @kopf.on.event(GROUP, VERSION, POLICY_PLURAL, registry=registry)
    async def policy_event(
        type: str, body: Any, name: str, memo: Any, logger: Any, **_: Any
    ) -> None:
        state: State = memo.state
        if type == "DELETED":
            state.policies.remove(name)
        else:
            version = (body.get("metadata") or {}).get("resourceVersion")  # a mandate's (§11)
            raw = {
                "metadata": {"name": name, "resourceVersion": version},
                "spec": dict(body.get("spec") or {}),
            }
            error = state.policies.update(name, raw)
            if error:
                logger.error(
                    "RemediationPolicy %s is invalid and will not be used: %s", name, error
                )
            if state.leading():  # the leader writes it (again for every policy: _revalidate)
                try:
                    await asyncio.to_thread(_write_validity, state, name, dict(body), error)
                except NotLeading:
                    pass  # the lease was lost meanwhile: the next leader writes it
        if state.runtime is not None:
            state.runtime.policies_changed()

    return registry


async def _revalidate(state: State) -> None:
    """A replica that became the leader writes the Valid condition of every policy (a
    standby writes none; one changed while no replica led has none yet)."""
    kube = _client(state)
    try:
        items: list[Any] = await asyncio.to_thread(kube.list_all, POLICIES)
    except Exception as exc:
        log.warning("cannot list RemediationPolicies to write their Valid condition (%s)", exc)
        return
    for item in items:
        name = str((item.get("metadata") or {}).get("name") or "")
        if not name:
            continue
        version = (item.get("metadata") or {}).get("resourceVersion")  # a mandate's (§11)
        raw = {
            "metadata": {"name": name, "resourceVersion": version},
            "spec": dict(item.get("spec") or {}),
        }
        error = state.policies.update(name, raw)
        try:
            await asyncio.to_thread(_write_validity, state, name, item, error)
        except NotLeading:
            return
        except Exception as exc:
            log.warning("RemediationPolicy %s: Valid condition not written (%s)", name, exc)
    if state.runtime is not None:
        state.runtime.policies_changed()


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
        # "Handler ... succeeded" for every event a handler sees (once every Node and
        # Remediation event: thousands of lines in a burst, and threads queueing on the
        # log handler's lock). Failures still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
