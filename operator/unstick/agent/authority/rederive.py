"""What the agent re-derives from the API before it probes or acts (design.md §3 invariant 7).

A Remediation is a channel, not an authority: whoever wrote it, the agent reads from the
API itself that the pod is the one named, Terminating and overdue on this node (`check_pod`
in the handler), that it opted in, and which RemediationPolicy is in force for it
(`read_mandate`: the pod's annotation, its namespace's labels, the policy object, judged
by the pure `unstick.core.policy.mandate`; for a controller's mandate the namespace and
the policy may come from the agent's own list+watch, `authority/watched.py`). `dryRun`
and `lazyUnmount` come from that policy, never from the Remediation; the policy's node
rate limit is kept here too (`NodeBudget`, on disk in the agent's state dir so that it
survives an agent restart), so requests beyond it are refused even if the controller's
budget was lost or bypassed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unstick.core.policy.mandate import Mandate, PolicyLookup, mandate, policy_name
from unstick.core.policy.ratelimit import WINDOW_S, Grant, SlidingWindow
from unstick.core.policy.remediation_policy import PolicyError, parse_policy
from unstick.core.remediation import REMEDIATE
from unstick.core.vocabulary import Refusal

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Getter = Callable[[str], JSON | None]  # name → the object from the API, None if absent


def _api_error(exc: Exception) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    return f"{status} {reason}" if status else f"{type(exc).__name__}: {exc}"


def _unwatched(_name: str) -> JSON | None:
    return None


@dataclass(frozen=True, slots=True)
class PolicySources:
    """Where the agent reads a namespace and a RemediationPolicy: `namespace` and `policy`
    GET each, fresh; `watched_namespace` and `watched_policy` answer from the agent's own
    list+watch of them (`authority/watched.py`: None when not kept or the watch is not
    live), read only for a mandate (`read_mandate`'s `policy_version`)."""

    namespace: Getter
    policy: Getter
    watched_namespace: Getter = _unwatched
    watched_policy: Getter = _unwatched


def _version(obj: JSON | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def read_mandate(
    sources: PolicySources, namespace: str, pod: JSON, *, policy_version: str | None = None
) -> Mandate:
    """The policy in force for `pod` (from the API), or why nothing may be done.

    `policy_version`: the resourceVersion of the policy a controller's mandate names. Then
    the namespace and the policy come from the agent's watches where they hold them live,
    the policy only at that very version (docs/agent.md, "Namespace and policy reads from
    watches"); anything else is read with a GET."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    annotation = annotations.get(REMEDIATE)
    if annotation is not None and not isinstance(annotation, str):
        annotation = None
    watched = policy_version is not None
    try:
        ns = (sources.watched_namespace(namespace) if watched else None) or sources.namespace(
            namespace
        )
    except Exception as exc:  # never act on facts that could not be read
        return Mandate(
            None, Refusal.UNSAFE, f"cannot GET namespace {namespace!r}: {_api_error(exc)}"
        )
    labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
    name = policy_name(annotation, labels)
    lookup = None
    if name is not None:
        obj = sources.watched_policy(name) if watched else None
        try:
            if obj is None or _version(obj) != policy_version:
                obj = sources.policy(name)
        except Exception as exc:
            return Mandate(
                None,
                Refusal.UNSAFE,
                f"cannot GET RemediationPolicy {name!r}: {_api_error(exc)}",
            )
        if obj is None:
            lookup = PolicyLookup(name, None, "it does not exist")
        else:
            try:
                lookup = PolicyLookup(name, parse_policy(obj))
            except PolicyError as exc:
                lookup = PolicyLookup(name, None, f"it is invalid: {exc}")
    return mandate(namespace, annotation, labels, lookup)


class NodeBudget:
    """This node's action budget as the agent keeps it: one batch of node steps is one
    action; granted only while fewer than the strictest limit in force were granted in the
    last 60 s (the requesting policy's `nodePerMinute`, every policy's that took a grant in
    the window, and the agent's own cap).

    With a `path` (the agent's `<state-dir>/node-budget`, on the host) every grant is on
    disk, flushed and fsynced, before it is returned — record before act — and a new agent
    reads the grants still in the window at start-up: killed at any line, even mid-batch,
    the restarted agent grants no more than the budget allows. A grant that cannot be
    written is not made (the request waits, as when the budget is used up). Without a
    path the window is in memory only (tests, tools)."""

    def __init__(self, cap: int, path: str | None = None) -> None:
        self.cap = cap
        self.path = path
        self._window = SlidingWindow()
        self._lock = threading.Lock()
        self._lines = 0
        if path is not None:
            for grant in read_grants(path):
                self._window.add(grant)
                self._lines += 1

    def try_take(self, now: float, limit: int) -> float:
        """0.0 when granted, else the seconds until one more fits."""
        own = min(limit, self.cap)
        with self._lock:
            wait = self._window.wait_s(now, own)
            if wait > 0:
                return wait
            grant = Grant(now, own)
            if self.path is not None and not self._persist(grant, now):
                return UNRECORDED_WAIT_S
            self._window.add(grant)
            return 0.0

    def _persist(self, grant: Grant, now: float) -> bool:
        assert self.path is not None
        try:
            if self._lines >= COMPACT_AFTER:
                kept = [g for g in self._window.granted if g.at > now - WINDOW_S]
                write_grants(self.path, [*kept, grant])
                self._lines = len(kept) + 1
            else:
                append_grant(self.path, grant)
                self._lines += 1
        except OSError as exc:
            log.error("node budget: cannot record a grant in %s (%s): refused", self.path, exc)
            return False
        return True


UNRECORDED_WAIT_S = 1.0  # a grant that could not be written: ask again in a second
COMPACT_AFTER = 256  # lines in the budget file before it is rewritten with the window only


def _line(grant: Grant) -> str:
    return f"{grant.at:.6f} {grant.limit}\n"


def read_grants(path: str) -> list[Grant]:
    """The grants in the budget file (`<unix time> <limit>` per line); a torn or malformed
    line (a kill mid-write) is skipped, a missing file is no grants."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("node budget: cannot read %s: %s", path, exc)
        return []
    grants = []
    for line in lines:
        parts = line.split()
        try:
            at, limit = float(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            continue
        if limit >= 1:
            grants.append(Grant(at, limit))
    return sorted(grants, key=lambda g: g.at)


def append_grant(path: str, grant: Grant) -> None:
    """The grant's line appended and fsynced; when this made the file (or its directory),
    the directory that holds the new entry fsynced too: a crash of the machine right after
    could otherwise lose the file, the grant with it."""
    directory = os.path.dirname(path) or "."
    _make_dir(directory)
    created = False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        created = True
    try:
        os.write(fd, _line(grant).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_dir(directory)


def write_grants(path: str, grants: list[Grant]) -> None:
    """Replace the file atomically (a new file, fsynced, renamed over the old one, the
    directory fsynced)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, "".join(_line(g) for g in grants).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")  # the rename itself durable


def _make_dir(directory: str) -> None:
    """`directory` and its missing parents made, each new entry fsynced in its parent."""
    if os.path.isdir(directory):
        return
    parent = os.path.dirname(directory.rstrip("/")) or "."
    _make_dir(parent)
    try:
        os.mkdir(directory)
    except FileExistsError:  # made meanwhile, or not a directory (the open then fails)
        return
    _fsync_dir(parent)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
