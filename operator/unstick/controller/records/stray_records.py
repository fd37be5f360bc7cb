"""Records that are not backed by a stuck pod (docs/controller.md): a Remediation of a pod
the controller does not hold as Terminating, or a second record of a pod it does hold,
is checked RECORD_CHECK_DELAY_S later (the pod watch may lag) and marked `Refused` with
the reason unless it is that pod's own record (trust.check_record) — a forged record
never stays on display as real.

`RecordChecks` is the runtime's collaborator for this: the Remediation watch hands it
each record (`maybe_check`); it gets the callables it needs of the runtime (which record
is a pod's own, which pods were seen leaving, the task spawner, the event loop) and the
reconciler's `refuse_record`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from unstick.controller.deciding.inputs import fetch_pod
from unstick.controller.records import writer as records
from unstick.controller.records.identity import check_record
from unstick.core.remediation import FINAL_PHASES, POD_NAME, POD_UID
from unstick.kube.client import JSON, Kube

log = logging.getLogger(__name__)

RECORD_CHECK_DELAY_S = 10.0  # longer than the pod watch lags behind the API

Key = tuple[str, str]  # (namespace, name) of a Remediation


class RecordChecks:
    def __init__(
        self,
        kube: Kube,
        clock: Callable[[], float],
        gate: Callable[[], bool],
        *,
        own_record: Callable[[str, Key], bool | None],
        seen_leaving: Callable[[str], bool],
        refuse: Callable[[JSON, str, float], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        loop: Callable[[], asyncio.AbstractEventLoop | None],
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.gate = gate  # False while another replica is active: nothing written
        self.own_record = own_record  # is this the pod's own record (None: pod not held)
        self.seen_leaving = seen_leaving  # the pod uid was seen leaving the API
        self.refuse = refuse  # Reconciler.refuse_record
        self.spawn = spawn
        self.loop = loop  # the running loop, None before the runtime runs
        self.pending: set[Key] = set()  # Remediations awaiting a check

    def maybe_check(self, uid: str, body: Any) -> None:
        """A Remediation that may not be a stuck pod's own record — of a pod this controller
        does not hold as Terminating, or a second record of a pod it does hold: after a
        while (the pod watch may lag), check it, and mark it Refused if it is not the pod's
        record (trust.check_record)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        phase = (body.get("status") or {}).get("phase")
        loop = self.loop()
        if (
            loop is None
            or phase in FINAL_PHASES
            or self.own_record(uid, key) is True
            or self.seen_leaving(uid)
            or key in self.pending
            or not all(key)
        ):
            return
        self.pending.add(key)
        loop.call_later(RECORD_CHECK_DELAY_S, self._spawn_check, uid, key)

    def _spawn_check(self, uid: str, key: Key) -> None:
        self.spawn(self._check_later(uid, key))

    async def _check_later(self, uid: str, key: Key) -> None:
        try:
            own = self.own_record(uid, key)
            if self.gate() and own is not True and not self.seen_leaving(uid):
                await asyncio.to_thread(self._check, key, own is False)
        except Exception:
            log.exception("remediation=%s/%s could not be checked", *key)
        finally:
            self.pending.discard(key)

    def _check(self, key: Key, second: bool) -> None:
        namespace, name = key
        rem = records.get_remediation(self.kube, namespace, name)
        if rem is None or ((rem.get("status") or {}).get("phase")) in FINAL_PHASES:
            return
        spec = rem.get("spec") or {}
        if second:
            why: str | None = (
                f"a second record of pod {spec.get(POD_NAME)!r} (UID {spec.get(POD_UID)}): "
                "unstick keeps the pod's record under another name; this one is not used"
            )
        else:
            pod_name = spec.get(POD_NAME)
            pod = fetch_pod(self.kube, namespace, pod_name) if isinstance(pod_name, str) else None
            why = check_record(rem, pod)
        if why is not None:
            self.refuse(rem, why, self.clock())
