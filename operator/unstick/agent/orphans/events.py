"""The Node Event that reports this node's orphaned pod dirs (docs/aftermath.md).

Posted (best effort) in namespace `default` about the Node (involvedObject kind Node,
uid = the node name, as the kubelet and `kubectl describe node` use it), reason
`OrphanedPodDirs`, only when the report changed (which dirs, their state, what the clean
pass did) — never once per pass. The full report rides along as JSON in the Event's
annotation `unstick.dev/orphaned-pod-dirs`: `unstick status` reads it with read-only RBAC.
When the last orphan is gone a `Normal` Event says so.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from unstick.core.remediation import ORPHANED_POD_DIRS_ANNOTATION, rfc3339
from unstick.core.rules.aftermath import OrphanDir, orphan_event_message

log = logging.getLogger(__name__)

REASON = "OrphanedPodDirs"
ANNOTATION = ORPHANED_POD_DIRS_ANNOTATION
EVENT_NAMESPACE = "default"
COMPONENT = "unstick-agent"
MAX_REPORTED = 20

Poster = Callable[[str, dict[str, object]], None]  # (path, body) -> POST


def _now() -> str:
    return rfc3339(datetime.now(UTC))


def event_body(node: str, dirs: Sequence[OrphanDir], mode: str, now: str) -> dict[str, object]:
    report: dict[str, object] = {"node": node, "mode": mode, "count": len(dirs)}
    report["dirs"] = [d.to_json() for d in dirs[:MAX_REPORTED]]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{node}.{uuid.uuid4().hex[:12]}",
            "namespace": EVENT_NAMESPACE,
            "annotations": {ANNOTATION: json.dumps(report, separators=(",", ":"))},
        },
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": REASON,
        "message": orphan_event_message(dirs, mode)[:1000],
        "type": "Warning" if dirs else "Normal",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class OrphanReporter:
    """Posts the Node Event when the report changes (deduplicated in memory)."""

    def __init__(self, node: str, post: Poster) -> None:
        self.node = node
        self.post = post
        self._last: tuple[object, ...] | None = None

    def report(self, dirs: Sequence[OrphanDir], mode: str) -> bool:
        """Post if changed; True when an Event was posted."""
        key = (mode, *((d.uid, d.state, d.result, d.data_bytes) for d in dirs))
        if key == self._last or (self._last is None and not dirs):
            return False
        body = event_body(self.node, dirs, mode, _now())
        try:
            self.post(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body)
        except Exception as exc:  # an Event is informative only; try again next pass
            log.warning("could not post the %s Event on node %s: %s", REASON, self.node, exc)
            return False
        self._last = key
        return True
