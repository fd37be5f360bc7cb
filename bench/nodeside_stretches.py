"""Where each stuck pod's time went in a node-side run, read from the audit log (issue 23).

Per pod, in the order of its handling, the requests that mark each stretch (one Remediation
per pod; the audit log names the object of every request):

- `created_to_probe_requested`: the controller creates the Remediation → its first spec
  patch (the probe requested) — the controller;
- `probe_queue`: probe requested → the agent's first GET of the pod — the agent's queue;
- `probe`: that GET → the agent's first status patch (the probe) — the agent;
- `probe_to_steps_requested`: the probe → the controller's next spec patch (the node
  steps) — the controller;
- `steps_queue`: node steps requested → the agent's next GET of the pod — the agent's queue;
- `steps`: that GET → the agent's next status patch (the steps' results) — the agent;
- `steps_to_gone`: the steps' results → the pod's first successful DELETE — the kubelet
  stand-in.

A controller that requests the probe in the Remediation it creates (one spec patch per
pod: the node steps) has `created_to_probe_requested` 0. A stretch is counted only for the
pods where every mark was found in that order (a re-requested probe or a refused request
adds marks that do not fit: such a pod is left out of the stretches after it, `n` says how
many were counted). Times are the API server's
(requestReceivedTimestamp for a request's start, stageTimestamp for its end).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from bench import measure

STRETCHES = (
    "created_to_probe_requested",
    "probe_queue",
    "probe",
    "probe_to_steps_requested",
    "steps_queue",
    "steps",
    "steps_to_gone",
)


def _marks(
    events: Iterable[dict[str, Any]],
    rem_of_pod: dict[str, str],
    agents: dict[str, tuple[str, ...]],
    since: float,
) -> dict[str, dict[str, list[float]]]:
    """pod name → mark kind → times, in the log's order."""
    pod_of_rem = {r: p for p, r in rem_of_pod.items()}
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for ev in events:
        if ev.get("stage") != "ResponseComplete":
            continue
        code = (ev.get("responseStatus") or {}).get("code") or 0
        if not 200 <= code < 300:
            continue
        ref, verb = ev.get("objectRef") or {}, ev.get("verb") or ""
        start = measure.audit_time(ev.get("requestReceivedTimestamp") or ev["stageTimestamp"])
        end = measure.audit_time(ev["stageTimestamp"])
        if start < since:
            continue
        name, res, sub = ref.get("name") or "", ref.get("resource"), ref.get("subresource")
        who = next((k for k, ua in agents.items() if measure.made_by(ev, ua)), None)
        if res == "remediations" and name in pod_of_rem:
            pod = pod_of_rem[name]
            if who == "controller" and verb == "create" and not sub:
                out[pod]["created"].append(end)
            elif who == "controller" and verb == "patch" and not sub:
                out[pod]["requested"].append(end)
            elif who == "agent" and verb == "patch" and sub == "status":
                out[pod]["answered"].append(end)
        elif res == "pods" and name in rem_of_pod:
            if who == "agent" and verb == "get":
                out[name]["agent_get"].append(start)
            elif who == "standin" and verb == "delete":
                out[name]["gone"].append(end)
    return out


def _pod_stretches(m: dict[str, list[float]]) -> dict[str, float]:
    """The stretches of one pod whose marks come in the expected order."""
    created, requested = m.get("created", []), m.get("requested", [])
    gets, answered, gone = m.get("agent_get", []), m.get("answered", []), m.get("gone", [])
    if len(requested) == 1 and created:
        requested = [created[0], *requested]  # the probe requested in the create itself
    if not created or len(requested) < 2 or len(gets) < 2 or len(answered) < 2:
        return {}
    points = [created[0], requested[0], gets[0], answered[0], requested[1], gets[1], answered[1]]
    if gone:
        points.append(gone[0])
    out = {}
    for name, (a, b) in zip(STRETCHES, itertools.pairwise(points), strict=False):
        if b < a:
            break  # not the expected order (a re-request, a refusal): nothing after it
        out[name] = b - a
    return out


def stretches(
    events: Iterable[dict[str, Any]],
    rem_of_pod: dict[str, str],
    agents: dict[str, tuple[str, ...]],
    since: float,
) -> dict[str, dict[str, float | None]]:
    """Per stretch, p50/p90/max over the pods (seconds) and `n`; `agents` maps
    "controller", "agent" and "standin" to their User-Agent prefixes."""
    per: dict[str, list[float]] = {s: [] for s in STRETCHES}
    for marks in _marks(events, rem_of_pod, agents, since).values():
        for name, value in _pod_stretches(marks).items():
            per[name].append(value)
    out: dict[str, dict[str, float | None]] = {}
    for name, values in per.items():
        p50, p90 = measure.percentile(values, 50), measure.percentile(values, 90)
        out[name] = {
            "p50": None if p50 is None else round(p50, 3),
            "p90": None if p90 is None else round(p90, 3),
            "max": round(max(values), 3) if values else None,
            "n": len(values),
        }
    return out
