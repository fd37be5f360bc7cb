"""Measuring a contender: its process (RSS, CPU via psutil) and its requests (the API
server's audit log, attributed by User-Agent)."""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

WRITE_VERBS = ("patch", "update", "delete", "create", "deletecollection")
REPORTED_VERBS = ("list", "watch", "get", "patch", "delete", "create", "update")
# The objects about one finalizer-held pod `f-NNNNN` (workload.py): the pod itself, its
# Remediation `f-NNNNN-<hash>`, its Events `f-NNNNN.<hex>`. A request naming one of them
# is not part of the NodeGone pods' handling.
FINALIZER_OBJECT = re.compile(r"^f-\d{5}([.-]|$)")
HEALTHY_OBJECT = re.compile(r"^h-\d{5}([.-]|$)")
DETECT_LINE = re.compile(r"action=detect result=stuck detection_lag=([0-9.]+)s")


class Sampler:
    """Samples RSS and CPU time of one process and its children every `interval_s`."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.series: list[tuple[float, float]] = []  # (epoch seconds, RSS MiB)
        self.cpu_s = 0.0
        self._children_cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def peak_rss_mib(self) -> float:
        return max((rss for _, rss in self.series), default=0.0)

    def rss_between(self, start: float, end: float) -> list[float]:
        return [rss for t, rss in self.series if start <= t <= end]

    def _run(self) -> None:
        try:
            proc = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                rss, own_cpu = proc.memory_info().rss, _cpu(proc)
                for child in proc.children(recursive=True):
                    try:
                        rss += child.memory_info().rss
                        self._children_cpu[child.pid] = _cpu(child)
                    except psutil.NoSuchProcess:
                        pass
            except psutil.NoSuchProcess:
                return
            self.cpu_s = own_cpu + sum(self._children_cpu.values())
            self.series.append((time.time(), rss / 2**20))
            self._stop.wait(self.interval_s)


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def audit_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class AuditTail:
    """Reads an audit log incrementally (only the lines written since the last call).

    `from_end=True` starts at the log's current end: only requests made from now on.
    """

    path: Path
    from_end: bool = False
    _offset: int = field(default=0, init=False)
    _partial: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.from_end and self.path.exists():
            self._offset = self.path.stat().st_size

    def new_events(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self._offset)
            chunk = f.read()
            self._offset = f.tell()
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # an incomplete last line waits for the next call
        for line in lines:
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue  # from_end may start inside a line: its rest is no event


def made_by(event: dict[str, Any], agents: tuple[str, ...]) -> bool:
    ua = event.get("userAgent") or ""
    return any(ua.startswith(prefix) for prefix in agents)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Window:
    start: float  # the contender process was started (earlier requests are not its own)
    ready: float  # the contender finished starting up (its pod watch/list is there)
    strike: float  # the stuck pods were made (nodes deleted, pods deleted)
    end: float  # the contender was stopped
    burst_end: float | None = None  # every NodeGone pod was gone (None: the same as `end`)


@dataclass
class Requests:
    by_verb: Counter[str] = field(default_factory=Counter)
    lists_while_quiet: int = 0  # LISTs after start-up and before anything was stuck
    writes_to_healthy: int = 0
    first_delete: dict[str, float] = field(default_factory=dict)  # pod name → time
    remediation_created: dict[str, float] = field(default_factory=dict)  # rem name → time
    after_strike: int = 0  # requests made once the pods were stuck
    after_strike_by_kind: Counter[str] = field(default_factory=Counter)  # "get nodes": n
    server_ms_after_strike: list[float] = field(default_factory=list)  # API server's time
    # Requests after the strike (not WATCH) that name no finalizer-held pod, nor its
    # Remediation or Event: the NodeGone pods' handling (FINALIZER_OBJECT).
    nodegone_after_strike: int = 0
    about_healthy: int = 0  # requests (any verb) naming a healthy pod `h-*`
    # The API server's own time (received → response complete) for every non-WATCH
    # request by ANY client (contenders, kwok, the driver) during the burst: strike →
    # every NodeGone pod gone.
    server_s_burst_all_clients: list[float] = field(default_factory=list)


def read_requests(
    events: Iterable[dict[str, Any]], agents: tuple[str, ...], window: Window
) -> Requests:
    """Everything the benchmark needs from the audit log about one contender."""
    out = Requests()
    burst_end = window.end if window.burst_end is None else window.burst_end
    for ev in events:
        if ev.get("stage") != "ResponseComplete":
            continue
        verb = ev.get("verb") or ""
        when = audit_time(ev.get("requestReceivedTimestamp") or ev["stageTimestamp"])
        if verb != "watch" and window.strike <= when <= burst_end:
            out.server_s_burst_all_clients.append(audit_time(ev["stageTimestamp"]) - when)
        if not made_by(ev, agents):
            continue
        ref = ev.get("objectRef") or {}
        if when < window.start:
            continue  # e.g. unstick's steady-RSS runs at smaller sizes, before this one
        out.by_verb[verb] += 1
        if HEALTHY_OBJECT.match(ref.get("name") or ""):
            out.about_healthy += 1
        if when >= window.strike and verb != "watch":
            out.after_strike += 1
            if not FINALIZER_OBJECT.match(ref.get("name") or ""):
                out.nodegone_after_strike += 1
            kind = "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))
            out.after_strike_by_kind[f"{verb} {kind or ev.get('requestURI', '?')}"] += 1
            done_at = audit_time(ev["stageTimestamp"])
            out.server_ms_after_strike.append((done_at - when) * 1000)
        if verb == "list" and window.ready < when < window.strike:
            out.lists_while_quiet += 1
        if ref.get("resource") != "pods" and ref.get("resource") != "remediations":
            continue
        name = ref.get("name") or ""
        code = (ev.get("responseStatus") or {}).get("code") or 0
        done = audit_time(ev["stageTimestamp"])
        if ref.get("resource") == "remediations":
            if verb == "create" and 200 <= code < 300 and not ref.get("subresource"):
                out.remediation_created.setdefault(name, done)
            continue
        if verb in WRITE_VERBS and name.startswith("h-"):
            out.writes_to_healthy += 1
        if verb == "delete" and 200 <= code < 300 and name:
            out.first_delete.setdefault(name, done)
    return out


def lag_stats(lags: list[float]) -> dict[str, float | None]:
    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    return {
        "lag_p50_s": r(percentile(lags, 50)),
        "lag_p99_s": r(percentile(lags, 99)),
        "lag_max_s": r(max(lags) if lags else None),
    }


def verb_counts(by_verb: Counter[str]) -> dict[str, int]:
    counts = {verb: by_verb.get(verb, 0) for verb in REPORTED_VERBS}
    counts.update({verb: n for verb, n in by_verb.items() if verb not in counts})
    return counts


def detection_lags(log: Path) -> list[float]:
    """unstick's own detection lags (its `action=detect result=stuck detection_lag=`
    log lines, one per stuck pod: eligibility → diagnosed stuck from memory)."""
    if not log.exists():
        return []
    with log.open(errors="replace") as f:
        return [float(m.group(1)) for line in f if (m := DETECT_LINE.search(line))]


class LoadSampler:
    """The machine's 1-minute load average every `interval_s`, for the whole run."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (epoch seconds, 1-min load)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), os.getloadavg()[0]))
            if self._stop.wait(self.interval_s):
                return

    def stats(self, start: float = 0.0, end: float = math.inf) -> dict[str, float | int | None]:
        return load_stats([v for t, v in self.samples if start <= t <= end])


def load_stats(values: list[float]) -> dict[str, float | int | None]:
    return {
        "load_1min_max": round(max(values), 2) if values else None,
        "load_1min_mean": round(sum(values) / len(values), 2) if values else None,
        "load_samples": len(values),
    }
