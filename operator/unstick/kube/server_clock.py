"""How far the API server's clock is from this process's: measured from the `Date` header
of the answers the client already receives (kube/client.py), no request of its own.

Timestamps the API server writes (`metadata.deletionTimestamp`, `managedFields[].time`)
are on its clock; a process whose wall clock is 20 s ahead of it that compares them with
its own `time.time()` would find a pod's slack up 20 s early. It judges them in server
time instead: `server_now(local)` and `local_at(server)` (and `server_latest(local)` to
note when something was first seen).

One answer says: the server wrote `Date: D` (whole seconds, truncated) at some instant
between the request's send (`sent`, this process's clock) and its answer (`received`),
so the offset (server - local) is within (D - received, D + 1 - sent). The bounds of the
answers of the last KEEP_S seconds are intersected (answers at different fractions of a
second narrow it to well under a second); only the lower bound is used, the safe
direction: `server_now` is never later than the server's clock, and `local_at(T)` is
never earlier than the local instant at which the server's clock reads T — a slack
measured with them ends no earlier than on the server's clock. An answer that contradicts
the others (either clock was stepped) starts the measure again from that answer.
Before the first answer nothing is known: the offset is taken as 0 (no decision is made
before the first answers: the controller acts on what it listed).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from email.utils import parsedate_to_datetime

log = logging.getLogger(__name__)

KEEP_S = 600.0  # the answers of this long are intersected (clock drift is ppm: negligible)
EVERY_S = 1.0  # at most one answer kept per second, unless it narrows the bounds


def date_header(value: str | None) -> float | None:
    """The epoch seconds of an HTTP `Date` header (RFC 9110 IMF-fixdate); None when
    absent or not a date."""
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class ServerClock:
    """The offset of the API server's clock from this process's, from answers' `Date`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: deque[tuple[float, float, float]] = deque()  # (received, low, high)
        self._low: float | None = None  # max of the kept lows
        self._high: float | None = None  # min of the kept highs

    def answered(self, sent: float, received: float, date: str | None) -> None:
        """An answer: sent and received on this process's wall clock, its `Date` header."""
        server = date_header(date)
        if server is None or received < sent:
            return
        low, high = server - received, server + 1.0 - sent
        with self._lock:
            if self._low is None or self._high is None or high < self._low or low > self._high:
                if self._low is not None:
                    log.warning(
                        "the API server's clock is now %.1f..%.1f s from this process's, "
                        "not %.1f..%.1f s as measured before (a clock was stepped): measured "
                        "again from here",
                        low,
                        high,
                        self._low,
                        self._high,
                    )
                self._kept.clear()
            elif (
                low <= self._low
                and high >= self._high
                and self._kept
                and received - self._kept[-1][0] < EVERY_S
            ):
                return  # narrows nothing, and one was kept a moment ago
            self._kept.append((received, low, high))
            while self._kept and self._kept[0][0] < received - KEEP_S:
                self._kept.popleft()
            self._low = max(k[1] for k in self._kept)
            self._high = min(k[2] for k in self._kept)

    def offset(self) -> float | None:
        """The lower bound of (server - local) in seconds; None before the first answer."""
        with self._lock:
            return self._low

    def bounds(self) -> tuple[float, float] | None:
        """(low, high) of (server - local); None before the first answer."""
        with self._lock:
            if self._low is None or self._high is None:
                return None
            return self._low, self._high

    def server_now(self, local: float) -> float:
        """The server's clock at local instant `local`, never later than it reads."""
        return local + (self.offset() or 0.0)

    def server_latest(self, local: float) -> float:
        """The latest the server's clock can read at local instant `local`: the time to
        note when something is first seen, so that `server_now` minus it never says longer
        than it was (deciding/owner_leases.py)."""
        bounds = self.bounds()
        return local + (bounds[1] if bounds else 0.0)

    def local_at(self, server: float) -> float:
        """The local instant by which the server's clock reads `server` (never earlier)."""
        return server - (self.offset() or 0.0)
