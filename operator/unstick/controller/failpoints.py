"""Fail points: named places where a test makes the real controller process die or fail.

Crash safety (design.md §3 invariant 10) is tested by SIGKILLing the real controller at
chosen points of a node incident (tests/controller/test_incident_crashes.py). Waiting for a
moment by time would be flaky; instead the process kills itself the Nth time it reaches
a named point. Off unless the environment variable `UNSTICK_TEST_FAILPOINTS` is set, e.g.

    UNSTICK_TEST_FAILPOINTS="incident-intent-durable=kill@3,incident-write=fail@2"

- `kill@N`: the Nth time the point is reached, the process SIGKILLs itself (no cleanup,
  no flush: as an OOM kill or a lost node would);
- `fail@N`: the Nth time the point is reached, `reached` raises `FailPointError` (the
  caller handles it as it would a failed API request).

Points (where they are reached):
- `incident-rate-limited`: a pod's force-delete waits for the budget (the window is full);
- `incident-before-intent`: a pod's force-delete was decided and took its budget slot;
  its intent is not on record yet;
- `incident-intent-durable`: the intent is on record, the DELETE not sent yet;
- `incident-deleted`: the DELETE was answered, its result not recorded yet;
- `incident-write`: the incident writer is about to write a record;
- `incident-backoff`: a write failed and the writer backs off;
- `incident-written`: a record was written;
- `pod-intent-durable`: a per-pod record holds the intent of its action, not carried out yet;
- `node-steps-requested`: a node-steps request was written to a pod's record (the agent
  may run it at once), the pass's status write after it not made yet;
- `incidents-adopted`: a started controller adopted and settled the records it found;
- `taint-intent-durable` / `untaint-intent-durable`: the intent to put or take off the
  out-of-service taint is on record, the Node not written yet
  (controller/incidents/out_of_service.py);
- `remediation-watch`: the Remediation watch starts a watch (`fail@N`: answered 410 Gone,
  the loop relists: controller/records/watch.py).
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "UNSTICK_TEST_FAILPOINTS"


class FailPointError(RuntimeError):
    """Raised at a `fail@N` point (a test's stand-in for a failed request)."""


def _parse(text: str) -> dict[str, tuple[str, int]]:
    points: dict[str, tuple[str, int]] = {}
    for item in text.split(","):
        name, sep, rule = item.strip().partition("=")
        mode, at, count = rule.partition("@")
        if not name or not sep or mode not in ("kill", "fail") or not at or not count.isdigit():
            raise ValueError(f"{ENV}: cannot read {item!r} (expected point=kill@N or fail@N)")
        points[name] = (mode, int(count))
    return points


_RULES = _parse(os.environ[ENV]) if os.environ.get(ENV) else {}
_reached: dict[str, int] = {}
_lock = threading.Lock()


def reached(point: str) -> None:
    """The controller is at `point`: die or fail there if a test asked for it."""
    rule = _RULES.get(point)
    if rule is None:
        return
    with _lock:
        _reached[point] = count = _reached.get(point, 0) + 1
    mode, nth = rule
    if count != nth:
        return
    if mode == "kill":
        # straight to stderr: the log is written by a thread that dies with the process
        os.write(2, f"fail point {point} reached ({count}): SIGKILL\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
    raise FailPointError(f"fail point {point} ({count})")
