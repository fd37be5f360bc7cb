"""Leader election on a `coordination.k8s.io/v1` Lease, with client-go's rules, and the
guard every write of the controller passes: "I hold the lease now".

- **Acquire** when the Lease is free (no holder) or expired: its record (holder,
  renewTime, acquireTime, leaseDurationSeconds, leaseTransitions) has not changed for
  `leaseDurationSeconds`, measured on *this* replica's clock since it first saw that
  record. The other replica's `renewTime` is never compared with our clock (a skewed
  clock changes nothing). The write is a PUT carrying the `resourceVersion` read: of
  two replicas that try at once, one gets 409 and stays a standby.
- **Renew** every `retry_period` while leading (same PUT).
- **Give up** when no renew has succeeded for `renew_deadline` (< `lease_duration`): the
  guard closes at `last renew sent + renew_deadline`, on a monotonic clock that also counts
  while the process is stopped (SIGSTOP, a frozen VM: CLOCK_BOOTTIME). Another replica can
  take the lease only `lease_duration` after it saw that renew, so the two never overlap.
- **Release** on a clean stop (SIGTERM): holder emptied, so the standby takes over at
  its next try instead of waiting for the lease to expire.
- **Try at the expiry**: a standby that saw another replica's record tries again every
  `retry_period` (with jitter), or the moment that record expires on its own clock if that
  comes first (`next_try_in`): after a leader's death the takeover comes `lease_duration`
  after the standby last saw it renew, not up to a retry period later. When it tries is
  all this changes; whether it may acquire is decided as above.

A replica that lost the lease does not come back as a leader in the same process: the
controller exits (as kube-controller-manager and controller-runtime do) and starts again
as a standby, so everything a term kept in memory (budget grants, incidents in flight,
requests awaited from the agent) is rebuilt from the records by the next term — the same
path a crash takes. docs/controller.md "Leader election" says why it is written over
the Lease API and not taken from the `kubernetes` package.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException

from unstick.kube.client import JSON, Kube

log = logging.getLogger(__name__)

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
JITTER = 0.2  # a standby tries every retry_period x [1, 1.2]


def monotonic() -> float:
    """Seconds on a clock no one sets and that runs while the process is stopped."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def own_identity() -> str:
    """The pod's name when the Deployment passes it ($POD_NAME; $POD_ID, Kopf's word, too),
    so `kubectl get lease` names the pod; else host, pid and a random part."""
    pod = os.environ.get("POD_NAME") or os.environ.get("POD_ID")
    return pod or f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


class NotLeading(Exception):
    """A write refused before it was sent: this replica does not hold the lease now."""


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    identity: str
    name: str = "unstick-controller"
    namespace: str = "default"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def problem(self) -> str | None:
        """client-go's checks of the three durations (None: fine)."""
        if min(self.lease_duration_s, self.renew_deadline_s, self.retry_period_s) <= 0:
            return "lease duration, renew deadline and retry period must be positive"
        if self.renew_deadline_s >= self.lease_duration_s:
            return "the renew deadline must be shorter than the lease duration"
        if self.retry_period_s * (1 + JITTER) >= self.renew_deadline_s:
            return "the retry period (x1.2) must be shorter than the renew deadline"
        return None


def _spec(lease: JSON | None) -> JSON:
    spec = (lease or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def _record(lease: JSON) -> tuple[Any, ...]:
    """What a renew or a takeover changes: seeing it change is seeing the holder alive."""
    spec = _spec(lease)
    keys = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime")
    return (*(spec.get(k) for k in keys), spec.get("leaseTransitions"))


EXPIRY_MARGIN_S = 0.05  # tried this long after the record expires on our clock


def next_try_in(retry_s: float, until_expiry_s: float | None) -> float:
    """How long a standby waits before its next round: `retry_s` (the retry period with
    its jitter), or until the observed record expires if that is sooner and still ahead.
    An expiry already past (a try that lost a race, or an API error) waits the retry
    period, never a busy loop."""
    if until_expiry_s is None or until_expiry_s <= 0:
        return retry_s
    return min(retry_s, until_expiry_s + EXPIRY_MARGIN_S)


def _micro_time(at: float) -> str:
    """A MicroTime as the API server stores it (RFC 3339, microseconds)."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """One replica's part in the election. `leading()` is the guard; `run()` the loop (a
    thread of its own: a busy event loop never delays a renew)."""

    def __init__(
        self,
        kube: Kube,
        settings: LeaseSettings,
        *,
        on_started: Callable[[], None] = lambda: None,
        on_stopped: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube  # a client of its own: never queued behind the workers' requests
        self.settings = settings
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.wall = wall  # only written into the Lease for people to read
        self._deadline = 0.0  # leading while clock() < this
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._expires_at: float | None = None  # another replica's record, on our clock
        self._lease: JSON | None = None  # the version last read or written
        self.stop = threading.Event()
        self.lost = False
        path = LEASES.format(namespace=quote(settings.namespace, safe=""))
        self._collection = path
        self._path = f"{path}/{quote(settings.name, safe='')}"

    # -- the guard ----------------------------------------------------------------------

    def leading(self) -> bool:
        return self.clock() < self._deadline

    def check(self, method: str = "", path: str = "") -> None:
        """Raise NotLeading unless the lease is ours now (called right before each write)."""
        if not self.leading():
            raise NotLeading(f"not the leader: {method} {path} not sent".strip())

    # -- one round ----------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """client-go's tryAcquireOrRenew: True when the lease is ours after this round."""
        s = self.settings
        sent = self.clock()
        lease = self.kube.get(self._path)
        now = self.clock()
        if lease is None:
            body = self._body(None, transitions=0, acquire=True)
            try:
                self._lease = self.kube.request("POST", self._collection, body=body)
            except ApiException as exc:
                if exc.status == 409:  # another replica created it first: read it next round
                    return False
                raise
            return self._won(sent)
        record = _record(lease)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        spec = _spec(lease)
        holder = str(spec.get("holderIdentity") or "")
        duration = float(spec.get("leaseDurationSeconds") or s.lease_duration_s)
        mine = holder == s.identity
        if holder and not mine:
            self._deadline = 0.0  # taken by another replica: ours no more, whatever the clock
        self._expires_at = self._observed_at + duration if holder and not mine else None
        if self._expires_at is not None and now < self._expires_at:
            self._lease = lease
            return False  # held by another replica that renewed within its duration
        transitions = int(spec.get("leaseTransitions") or 0)
        body = self._body(
            lease, transitions=transitions if mine else transitions + 1, acquire=not mine
        )
        try:
            self._lease = self.kube.request("PUT", self._path, body=body)
        except ApiException as exc:
            if exc.status == 409:  # another replica wrote first: read again next round
                return False
            raise
        return self._won(sent)

    def _won(self, sent: float) -> bool:
        self._observed, self._observed_at = _record(self._lease or {}), self.clock()
        self._deadline = sent + self.settings.renew_deadline_s
        return True

    def _body(self, lease: JSON | None, *, transitions: int, acquire: bool) -> JSON:
        s = self.settings
        now = _micro_time(self.wall())
        spec = {
            **_spec(lease),
            "holderIdentity": s.identity,
            "leaseDurationSeconds": max(1, round(s.lease_duration_s)),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        if acquire or not spec.get("acquireTime"):
            spec["acquireTime"] = now
        meta: JSON = {"name": s.name, "namespace": s.namespace}
        if lease is not None:
            meta["resourceVersion"] = (lease.get("metadata") or {}).get("resourceVersion")
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> None:
        """Wait as a standby until the lease is ours, lead until a renew is late, return.
        `on_stopped` is called when leadership ends (also by `stop`)."""
        s = self.settings
        log.info("leader election: lease %s/%s, identity %s", s.namespace, s.name, s.identity)
        while not self.stop.is_set():
            if self._round():
                break
            retry = s.retry_period_s * (1 + random.uniform(0, JITTER))
            until = None if self._expires_at is None else self._expires_at - self.clock()
            self.stop.wait(next_try_in(retry, until))
        else:
            return
        log.info(
            "leader election: this replica (%s) holds lease %s/%s", s.identity, s.namespace, s.name
        )
        self.on_started()
        while not self.stop.wait(s.retry_period_s):
            # client-go: a deadline passed is the end, even if the lease is still ours
            # (a process stopped for longer than the deadline: SIGSTOP, a frozen VM).
            if self.leading():
                self._round()
            if not self.leading():
                self.lost = True
                log.error(
                    "leader election lost: lease %s/%s not renewed within %.0f s; writing "
                    "nothing more",
                    s.namespace,
                    s.name,
                    s.renew_deadline_s,
                )
                break
        self.on_stopped()

    def _round(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except Exception as exc:  # the API is unreachable or answers 5xx: next round
            log.warning(
                "leader election: lease %s not read or written (%s)", self.settings.name, exc
            )
            return False

    def release(self) -> None:
        """On a clean stop, after the last write: empty the holder so the standby need not
        wait for the lease to expire. Only while the lease is still ours."""
        if not self.leading() or self._lease is None:
            return
        self._deadline = 0.0  # nothing more is written by this replica
        body = self._body(
            self._lease,
            transitions=int(_spec(self._lease).get("leaseTransitions") or 0),
            acquire=False,
        )
        body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
        try:
            self.kube.request("PUT", self._path, body=body)
            log.info("leader election: lease %s released", self.settings.name)
        except Exception as exc:
            log.warning("leader election: lease %s not released (%s)", self.settings.name, exc)
