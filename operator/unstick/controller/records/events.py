"""Events on pods (and on node incidents' records), posted off the action path: the
pod itself is never written."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from unstick.kube.client import JSON, Kube
from unstick.kube.events import post_event

log = logging.getLogger(__name__)


def pod_ref(pod: JSON) -> JSON:
    """The involvedObject of an Event about `pod`."""
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": meta.get("namespace") or "default",
        "name": meta.get("name"),
        "uid": meta.get("uid"),
    }


class EventQueue:
    """Events posted off the action path, in a few threads of their own.

    `post` returns at once; each call posts one Event, or counts a repeat of the same Event
    on the one already posted (`kube/events.py`). `close` waits for the
    ones queued (bounded by the client's timeout and retries)."""

    def __init__(self, kube: Kube, threads: int = 2) -> None:
        self.kube = kube
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="events")

    def post(
        self,
        pod: JSON,
        reason: str,
        message: str,
        now_rfc3339: str,
        *,
        involved: JSON | None = None,
        event_type: str = "Warning",
    ) -> None:
        try:
            self._pool.submit(
                post_event,
                self.kube,
                involved or pod_ref(pod),
                reason,
                message,
                event_type=event_type,
                stamp=now_rfc3339,
            )
        except RuntimeError:  # shut down: the controller is stopping
            log.warning("not posting Event %s: the controller is stopping", reason)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
