"""The real kube-apiserver's audit log (one JSON event a line, stage ResponseComplete), as
the envtests read it: which requests, by whom (user agent), answered how, when.

    requests(cp, by=USER_AGENT_PREFIX, verbs={"delete"}, resource="pods", namespace=ns)

reads it all again at each call; `AuditTail` reads only what was written since its last
read (a test that reads the log after each of many steps). Both read complete lines only:
the API server may be writing the last one.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from devcluster import ControlPlane

#: The verbs that change an object.
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def object_ref(event: dict[str, Any]) -> dict[str, Any]:
    """The object the request was about (resource, namespace, name, subresource)."""
    return dict(event.get("objectRef") or {})


def status_code(event: dict[str, Any]) -> int:
    """The HTTP code of the answer (0 when the event has none)."""
    return int((event.get("responseStatus") or {}).get("code") or 0)


def received_at(event: dict[str, Any]) -> float:
    """When the API server received the request (epoch seconds)."""
    return datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()


@dataclass(frozen=True)
class Match:
    """Which requests: each field set must hold (None: any). `by` is a user agent's
    prefix (`unstick-controller/` for every version), `by_exactly` a whole one."""

    by: str | None = None
    by_exactly: str | None = None
    verbs: Collection[str] | None = None
    resource: str | None = None
    namespace: str | None = None
    name: str | None = None

    def __call__(self, event: dict[str, Any]) -> bool:
        agent = str(event.get("userAgent", ""))
        obj = object_ref(event)
        return (
            (self.by is None or agent.startswith(self.by))
            and (self.by_exactly is None or agent == self.by_exactly)
            and (self.verbs is None or event.get("verb") in self.verbs)
            and (self.resource is None or obj.get("resource") == self.resource)
            and (self.namespace is None or obj.get("namespace") == self.namespace)
            and (self.name is None or obj.get("name") == self.name)
        )


def _complete_lines(path: Path, offset: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(offset after the line, event) of each complete line from `offset` on."""
    if not path.exists():
        return
    with path.open("rb") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith(b"\n"):
                return  # still being written
            offset += len(line)
            if line.strip():
                yield offset, json.loads(line)


def requests(
    cp: ControlPlane,
    *,
    by: str | None = None,
    by_exactly: str | None = None,
    verbs: Collection[str] | None = None,
    resource: str | None = None,
    namespace: str | None = None,
    name: str | None = None,
    oldest_first: bool = False,
) -> list[dict[str, Any]]:
    """The audited requests so far that match (see `Match`), in the log's order (the order
    of their answers), or with `oldest_first` in the order they were received."""
    match = Match(by, by_exactly, verbs, resource, namespace, name)
    found = [event for _, event in _complete_lines(cp.audit_log, 0) if match(event)]
    return sorted(found, key=received_at) if oldest_first else found


@dataclass
class AuditTail:
    """The matching requests of a log that grows: each `read` takes in only the lines
    written since the last one."""

    path: Path
    match: Match
    offset: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> list[dict[str, Any]]:
        """Every matching request read so far, in the log's order."""
        for end, event in _complete_lines(self.path, self.offset):
            self.offset = end
            if self.match(event):
                self.events.append(event)
        return self.events
