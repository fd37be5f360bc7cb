"""Audit-log events as the API server writes them (`--audit-log-format=json`), for the
tests of the benchmark's readers of that log (bench/nodeside_stretches.py,
bench/nodeside_costs.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def audit_event(
    t: float, ua: str, verb: str, resource: str, name: str = "x", sub: str = ""
) -> dict[str, Any]:
    """One completed request `t` seconds after a fixed moment, by User-Agent `ua`."""
    stamp = datetime.fromtimestamp(1_800_000_000 + t, UTC).isoformat().replace("+00:00", "Z")
    ref = {"resource": resource, "name": name, **({"subresource": sub} if sub else {})}
    return {
        "stage": "ResponseComplete",
        "verb": verb,
        "userAgent": ua,
        "objectRef": ref,
        "responseStatus": {"code": 200},
        "requestReceivedTimestamp": stamp,
        "stageTimestamp": stamp,
    }
