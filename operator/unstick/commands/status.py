"""`unstick status`: one screen of what is stuck, what it blocks and what is left behind.

Live, against the current kubeconfig, with read-only access (get/list only): pods in
Terminating (LIST of pods, paged) joined with their Remediations (cause, phase, what was
done or refused), blocked replacements (the waiters the controller lists on the holders'
Remediations), blocked namespaces (Terminating namespaces with stuck pods) and orphaned pod
dirs per node (the agents' latest `OrphanedPodDirs` Event on each Node, with the report in
its annotation). `-n NAMESPACE` looks at one namespace only (the pods, their Remediations,
the namespace), which needs read access to that namespace alone. `-o json|yaml` prints the
same as one object; `-o wide` adds the pod's UID and Remediation to each line and lists
every orphaned pod dir. Fenced nodes: the nodes carrying the out-of-service taint unstick
applied (its open NodeOutOfService records, docs/fencing.md), cluster-wide only.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from unstick.commands import options
from unstick.core.remediation import (
    ALL_REMEDIATIONS,
    FINAL_PHASES,
    INCIDENT,
    NODE_NAME,
    OUT_OF_SERVICE_INCIDENT,
    POD_NAME,
    POD_UID,
    parse_time,
    rfc3339,
)

if TYPE_CHECKING:
    from unstick.kube.client import JSON, Kube

EXIT_FAILED = 1
REMEDIATIONS = ALL_REMEDIATIONS
FINAL = FINAL_PHASES


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "status",
        help="what is stuck, what it blocks, what is left behind (live, read-only)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_cluster_flags(p)
    options.add_namespace_flag(p, "only this namespace (default: all namespaces)")
    options.add_output_flag(p)
    p.set_defaults(command="status")


def _time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(max(0, seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h" if s < 172800 else f"{s // 86400}d"


def _list(api: Kube, path: str, query: dict[str, str] | None = None) -> tuple[list[JSON], str]:
    """(items, "") or ([], why they could not be read) — a missing CRD or RBAC is a note."""
    from kubernetes.client.exceptions import ApiException

    try:
        return api.list_all(path, query), ""
    except ApiException as err:
        return [], f"cannot list {path}: {err.status} {err.reason}"


def _did(status: JSON) -> str:
    """What unstick did or refuses, in a few words."""
    actions = [a for a in status.get("actions") or [] if isinstance(a, dict)]
    last = actions[-1] if actions else None
    refused = [r.get("action") for r in status.get("refused") or [] if isinstance(r, dict)]
    parts = []
    if last:
        parts.append(f"{last.get('action')} {last.get('result')}")
    if status.get("optedIn") is False:
        parts.append("observe only (not opted in)")
    if status.get("waitingFor"):
        parts.append(f"waiting for {status['waitingFor']}")
    if refused:
        parts.append("refuses " + ", ".join(str(r) for r in refused))
    return "; ".join(parts) or "-"


def gather(api: Kube, now: float, namespace: str | None = None) -> JSON:
    """Everything the status shows, as JSON: cluster-wide, or of one namespace."""
    from unstick.kube.client import pod_path, remediation_path

    notes: list[str] = []
    pods, why = _list(api, pod_path(namespace) if namespace else "/api/v1/pods")
    notes += [why] if why else []
    rems, why = _list(api, remediation_path(namespace) if namespace else REMEDIATIONS)
    notes += [why] if why else []
    by_uid = {
        str((r.get("spec") or {}).get(POD_UID)): r
        for r in rems
        if (r.get("status") or {}).get("phase") not in FINAL
    }
    for uid, r in _incident_pods(rems):  # a node incident lists its pods
        by_uid.setdefault(uid, r)
    stuck = [
        _stuck(p, by_uid.get(str(p["metadata"].get("uid"))), now) for p in pods if _terminating(p)
    ]
    stuck.sort(key=lambda s: (s["cause"], s["pod"]))
    if namespace:
        namespaces, why = _one(api, f"/api/v1/namespaces/{quote(namespace, safe='')}")
    else:
        namespaces, why = _list(api, "/api/v1/namespaces")
    notes += [why] if why else []
    return {
        "capturedAt": rfc3339(now),
        "stuckPods": stuck,
        "blockedReplacements": _waiters(rems, now),
        "blockedNamespaces": _namespaces(namespaces, stuck),
        # a node's orphaned pod dirs belong to no namespace: shown cluster-wide only
        "orphanedPodDirs": [] if namespace else _orphans(api, notes),
        "fencedNodes": [] if namespace else _fenced(rems, now),
        "notes": notes,
    }


def _fenced(rems: list[JSON], now: float) -> list[JSON]:
    """The nodes carrying unstick's out-of-service taint: its open records whose taint was
    applied (docs/fencing.md)."""
    out = []
    for r in rems:
        meta, spec, status = r.get("metadata") or {}, r.get("spec") or {}, r.get("status") or {}
        if spec.get(INCIDENT) != OUT_OF_SERVICE_INCIDENT or status.get("phase") in FINAL:
            continue
        applied = [
            a
            for a in status.get("actions") or []
            if a.get("action") == "taint-out-of-service" and a.get("result") == "succeeded"
        ]
        if not applied:
            continue
        since = _time(applied[-1].get("time"))
        evidence = [e.get("message") for e in status.get("evidence") or []]
        out.append(
            {
                "node": spec.get(NODE_NAME),
                "since": applied[-1].get("time"),
                "heldSeconds": None if since is None else max(0.0, now - since),
                "evidence": evidence[0] if evidence else "",
                "waitingFor": status.get("waitingFor") or "",
                "record": f"{meta.get('namespace')}/{meta.get('name')}",
            }
        )
    return sorted(out, key=lambda f: str(f["node"]))


def _one(api: Kube, path: str) -> tuple[list[JSON], str]:
    """([the object]) or ([], why it could not be read)."""
    from kubernetes.client.exceptions import ApiException

    try:
        obj = api.get(path)
    except ApiException as err:
        return [], f"cannot get {path}: {err.status} {err.reason}"
    return ([obj] if obj else []), ""


def _incident_pods(rems: list[JSON]) -> list[tuple[str, JSON]]:
    """(pod uid, its node incident) for the pods open node incidents list as not gone
    (docs/incidents.md)."""
    out = []
    for r in rems:
        spec, status = r.get("spec") or {}, r.get("status") or {}
        if not spec.get(INCIDENT) or status.get("phase") in FINAL:
            continue
        for entry in status.get("pods") or []:
            if isinstance(entry, dict) and not entry.get("goneAt"):
                out.append((str(entry.get("uid")), r))
    return out


def _terminating(pod: JSON) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _stuck(pod: JSON, rem: JSON | None, now: float) -> JSON:
    meta = pod.get("metadata") or {}
    status = (rem or {}).get("status") or {}
    deleted = _time(meta.get("deletionTimestamp"))
    return {
        "pod": f"{meta.get('namespace')}/{meta.get('name')}",
        "uid": meta.get("uid"),
        "node": (pod.get("spec") or {}).get("nodeName") or "",
        "overdueSeconds": None if deleted is None else round(now - deleted),
        "cause": status.get("cause") or ("(no Remediation yet)" if rem is None else "?"),
        "phase": status.get("phase") or "",
        "did": _did(status) if rem is not None else "-",
        "remediation": (rem or {}).get("metadata", {}).get("name"),
    }


def _waiters(rems: list[JSON], now: float) -> list[JSON]:
    out = []
    for r in rems:
        spec, status = r.get("spec") or {}, r.get("status") or {}
        holder = f"{(r.get('metadata') or {}).get('namespace')}/{spec.get(POD_NAME)}"
        for w in status.get("waiters") or []:
            if not isinstance(w, dict) or w.get("until"):
                continue
            since = _time(w.get("since"))
            out.append(
                {
                    "pod": w.get("pod"),
                    "claim": w.get("claim"),
                    "heldBy": holder,
                    "holderNode": spec.get(NODE_NAME),
                    "holderCause": status.get("cause"),
                    "waitedSeconds": None if since is None else round(now - since),
                }
            )
    return sorted(out, key=lambda w: str(w["pod"]))


def _namespaces(namespaces: list[JSON], stuck: list[JSON]) -> list[JSON]:
    out = []
    for ns in namespaces:
        name = (ns.get("metadata") or {}).get("name")
        if (ns.get("status") or {}).get("phase") != "Terminating":
            continue
        pods = [s for s in stuck if str(s["pod"]).split("/", 1)[0] == name]
        if pods:
            out.append(
                {
                    "namespace": name,
                    "stuckPods": [{"pod": s["pod"], "cause": s["cause"]} for s in pods],
                }
            )
    return out


def _orphans(api: Kube, notes: list[str]) -> list[JSON]:
    from unstick.agent.orphans.events import ANNOTATION, EVENT_NAMESPACE, REASON

    events, why = _list(
        api, f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", {"fieldSelector": f"reason={REASON}"}
    )
    notes += [why] if why else []
    latest: dict[str, JSON] = {}
    for ev in events:
        node = str((ev.get("involvedObject") or {}).get("name") or "")
        when = str(ev.get("lastTimestamp") or ev.get("eventTime") or "")
        if node and (node not in latest or when >= str(latest[node].get("lastTimestamp") or "")):
            latest[node] = ev
    out = []
    for node, ev in sorted(latest.items()):
        try:
            report = json.loads(((ev.get("metadata") or {}).get("annotations") or {})[ANNOTATION])
        except (KeyError, TypeError, ValueError):
            report = {"count": None, "dirs": []}
        out.append(
            {
                "node": node,
                "count": report.get("count"),
                "mode": report.get("mode"),
                "reportedAt": ev.get("lastTimestamp"),
                "dirs": report.get("dirs") or [],
            }
        )
    return [o for o in out if o["count"]]


def render(data: JSON, wide: bool = False) -> str:
    lines = [f"unstick status at {data['capturedAt']}", ""]
    stuck = data["stuckPods"]
    lines.append(f"STUCK PODS ({len(stuck)})")
    for s in stuck:
        extra = f"  uid={s['uid']} remediation={s['remediation'] or '-'}" if wide else ""
        lines.append(
            f"  {s['cause']:<24} {s['pod']:<40} node={s['node'] or '-':<16} "
            f"overdue {_age(s['overdueSeconds']):>4}  {s['phase'] or '-':<15} {s['did']}{extra}"
        )
    lines += ["", f"BLOCKED REPLACEMENTS ({len(data['blockedReplacements'])})"]
    for w in data["blockedReplacements"]:
        lines.append(
            f"  {w['pod']} waits {_age(w['waitedSeconds'])} for pvc/{w['claim']}: held by "
            f"{w['heldBy']} on {w['holderNode']} ({w['holderCause']})"
        )
    lines += ["", f"BLOCKED NAMESPACES ({len(data['blockedNamespaces'])})"]
    for ns in data["blockedNamespaces"]:
        pods = ", ".join(f"{p['pod']} ({p['cause']})" for p in ns["stuckPods"])
        lines.append(f"  {ns['namespace']}: Terminating, waits on {pods}")
    lines += ["", f"ORPHANED POD DIRS ({sum(o['count'] for o in data['orphanedPodDirs'])})"]
    for o in data["orphanedPodDirs"]:
        lines.append(
            f"  {o['node']}: {o['count']} (orphanedPodDirs: {o['mode']}, {o['reportedAt']})"
        )
        for d in o["dirs"] if wide else o["dirs"][:5]:
            extra = (
                f", {d['fileCount']} file(s), {d['bytes']} bytes kept" if d.get("fileCount") else ""
            )
            lines.append(f"    {d['path']} ({d['state']}{extra})")
    fenced = data.get("fencedNodes") or []
    lines += ["", f"FENCED NODES ({len(fenced)})"]
    for f in fenced:
        lines.append(
            f"  {f['node']}: out-of-service taint applied by unstick {_age(f['heldSeconds'])} "
            f"ago ({f['record']}); {f['waitingFor'] or 'removed once Ready with nothing left'}"
        )
        if wide:
            lines.append(f"    evidence: {f['evidence']}")
    for note in data["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import time

    from unstick import __version__
    from unstick.kube.client import KubeconfigError

    try:
        api = options.connect(args, f"unstick-status/{__version__}")
    except KubeconfigError as err:
        print(f"unstick status: {err}", file=sys.stderr)
        return options.EXIT_USAGE
    try:
        data = gather(api, time.time(), args.namespace)
    except Exception as err:
        from unstick.commands.snapshot import live_failure

        why = live_failure(err) or f"{type(err).__name__}: {err}"
        print(f"unstick status: {why}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        api.close()
    if args.output in ("json", "yaml"):
        print(options.dump(data, args.output))
    else:
        print(render(data, wide=args.output == "wide"))
    return 0
