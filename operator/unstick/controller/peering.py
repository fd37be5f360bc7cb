"""Follow Kopf's peering in the lean watcher's actions: one active replica.

Kopf pauses its own handlers while a live peer of higher (or the same) priority is
listed in the `ClusterKopfPeering` object, but it has no public hook for other tasks. The
lean pod watcher and reconciler are ours, so this gate reads the same peering object
(every 2 s, one GET) and applies Kopf's rule: active only while no other live
peer has a priority >= ours. While inactive the controller keeps its watch (a warm cache
for fail-over) but diagnoses and changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from unstick.kube.client import Kube

log = logging.getLogger(__name__)


def own_identity() -> str:
    """Kopf's convention: $POD_ID when set (the Deployment passes metadata.name)."""
    return os.environ.get("POD_ID") or f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"


@dataclass(frozen=True, slots=True)
class PeeringSettings:
    name: str
    identity: str
    priority: int = 0
    interval_s: float = 2.0  # a GET of the peering object this often


def is_active(status: Mapping[str, Any], identity: str, priority: int, now: float) -> bool:
    """Kopf's rule: pause while any other live peer has a priority >= ours."""
    for peer, info in status.items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        try:
            seen = datetime.fromisoformat(str(info.get("lastseen"))).timestamp()
        except ValueError:
            continue
        if seen + float(info.get("lifetime") or 60) < now:
            continue  # dead peer
        if int(info.get("priority") or 0) >= priority:
            return False
    return True


class PeeringGate:
    """`active` is True only while Kopf's peering would let this replica work."""

    def __init__(self, kube: Kube, settings: PeeringSettings | None) -> None:
        self.kube = kube
        self.settings = settings
        self.active = settings is None  # standalone: always active
        self._reported = False

    def __call__(self) -> bool:
        return self.active

    async def run(self) -> None:
        if self.settings is None:
            return
        s = self.settings
        path = f"/apis/kopf.dev/v1/clusterkopfpeerings/{s.name}"
        while True:
            try:
                obj = await asyncio.to_thread(self.kube.get, path)
                if obj is None:
                    active = True
                    log.warning(
                        "ClusterKopfPeering %s not found: acting as the only replica", s.name
                    )
                else:
                    active = is_active(obj.get("status") or {}, s.identity, s.priority, time.time())
                if active != self.active or not self._reported:
                    log.info("peering %s: %s", s.name, "active" if active else "paused")
                    self._reported = True
                self.active = active
            except Exception as exc:
                log.warning(
                    "peering %s: cannot read (%s); keeping state %s",
                    s.name,
                    exc,
                    "active" if self.active else "paused",
                )
            await asyncio.sleep(s.interval_s)
