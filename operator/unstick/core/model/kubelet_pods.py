"""What the kubelet itself reports about its pod workers: the metric families it publishes
on its `/metrics` since Kubernetes 1.27 (kubernetes PR #113145, "Force deleted pods can fail
to move out of terminating"; pkg/kubelet/metrics/metrics.go), read by the agent
(`unstick.agent.probe.kubelet_metrics`) into the probe's `kubeletPods` (docs/agent.md).

- `kubelet_working_pods{lifecycle, config, static}` (gauge): the pods the kubelet's pod
  workers hold, by lifecycle (`sync`, `terminating`, `terminated`) and config (`desired`;
  `orphan`: removed from its config or force-deleted in the API; `runtime_only`: found in
  the runtime without being known to a worker);
- `kubelet_desired_pods{static}`, `kubelet_active_pods{static}` (gauges): the pods it is told
  to run, the pods it counts as active when admitting;
- `kubelet_orphaned_runtime_pods_total` and `kubelet_restarted_pods_total{static}` (counters
  since the kubelet started).

`parse_kubelet_pods` reads those families out of the Prometheus text format (every other
line is left unread) and raises `KubeletMetricsError` naming the line when one of theirs is
not what the format says. Evidence only: no rule acts on these numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from unstick.core import fields as f

JSON = dict[str, object]

WORKING = "kubelet_working_pods"
DESIRED = "kubelet_desired_pods"
ACTIVE = "kubelet_active_pods"
ORPHANED_RUNTIME = "kubelet_orphaned_runtime_pods_total"
RESTARTED = "kubelet_restarted_pods_total"
FAMILIES = (WORKING, DESIRED, ACTIVE, ORPHANED_RUNTIME, RESTARTED)
LIFECYCLES = ("sync", "terminating", "terminated")
ORPHANED_CONFIGS = ("orphan", "runtime_only")  # `config` of a pod no config wants any more
#: the largest count on the wire (the CRD's bound: int32)
MAX_COUNT = 2**31 - 1
MAX_UNREAD = 300

# the probe's keys
SYNC, TERMINATING, TERMINATED = LIFECYCLES
KEY_WORKING = "working"
KEY_ORPHANED = "orphaned"
KEY_DESIRED = "desired"
KEY_ACTIVE = "active"
KEY_ORPHANED_RUNTIME = "orphanedRuntimeTotal"
KEY_RESTARTED = "restartedTotal"
KEY_UNREAD = "unread"


class KubeletMetricsError(ValueError):
    """The kubelet's /metrics text is not what the Prometheus text format says (the message
    names the line)."""


@dataclass(frozen=True, slots=True)
class ByLifecycle:
    """Pod workers by lifecycle (`kubelet_working_pods`, summed over the other labels)."""

    sync: int = 0
    terminating: int = 0
    terminated: int = 0

    def to_json(self) -> JSON:
        return {SYNC: self.sync, TERMINATING: self.terminating, TERMINATED: self.terminated}

    @classmethod
    def from_json(cls, raw: object, where: str) -> ByLifecycle:
        d = f.as_object(raw, where)
        return cls(*(_count(d, key, where) for key in LIFECYCLES))


@dataclass(frozen=True, slots=True)
class KubeletPods:
    """The kubelet's own counts (the probe's `kubeletPods`); a family the kubelet does not
    publish is None, and `unread` says why (or why nothing was read at all)."""

    working: ByLifecycle | None = None  # every config
    orphaned: ByLifecycle | None = None  # config orphan or runtime_only
    desired: int | None = None
    active: int | None = None
    orphaned_runtime_total: int | None = None
    restarted_total: int | None = None
    unread: str = ""

    @classmethod
    def not_read(cls, why: str) -> KubeletPods:
        return cls(unread=_cut(why))

    def to_json(self) -> JSON:
        return {
            KEY_WORKING: None if self.working is None else self.working.to_json(),
            KEY_ORPHANED: None if self.orphaned is None else self.orphaned.to_json(),
            KEY_DESIRED: self.desired,
            KEY_ACTIVE: self.active,
            KEY_ORPHANED_RUNTIME: self.orphaned_runtime_total,
            KEY_RESTARTED: self.restarted_total,
            KEY_UNREAD: self.unread,
        }

    @classmethod
    def from_json(cls, raw: object, where: str) -> KubeletPods:
        d = f.as_object(raw, where)
        working, orphaned = d.get(KEY_WORKING), d.get(KEY_ORPHANED)
        return cls(
            working=_lifecycles(working, f"{where}.{KEY_WORKING}"),
            orphaned=_lifecycles(orphaned, f"{where}.{KEY_ORPHANED}"),
            desired=_opt_count(d, KEY_DESIRED, where),
            active=_opt_count(d, KEY_ACTIVE, where),
            orphaned_runtime_total=_opt_count(d, KEY_ORPHANED_RUNTIME, where),
            restarted_total=_opt_count(d, KEY_RESTARTED, where),
            unread=f.opt_string(d, KEY_UNREAD, where) or "",
        )

    def words(self) -> str:
        """What the kubelet itself reports, in words, for the evidence."""
        if self.working is None:
            return f"the kubelet's own pod-worker counts are unknown: {self.unread or 'not read'}"
        w = self.working
        said = (
            f"the kubelet itself reports {w.sync} pod(s) syncing, {w.terminating} terminating, "
            f"{w.terminated} terminated"
        )
        o = self.orphaned
        if o is not None and (o.sync or o.terminating or o.terminated):
            said += (
                f" (of them orphaned — force-deleted or gone from its config: {o.sync} syncing, "
                f"{o.terminating} terminating, {o.terminated} terminated)"
            )
        rest = [
            f"{n} {what}"
            for n, what in (
                (self.desired, "desired"),
                (self.active, "active"),
                (self.orphaned_runtime_total, "found orphaned in the runtime since it started"),
                (self.restarted_total, "restarted with the same UID since it started"),
            )
            if n is not None
        ]
        if rest:
            said += "; " + ", ".join(rest)
        if self.unread:
            said += f"; {self.unread}"
        return said


def _lifecycles(raw: object, where: str) -> ByLifecycle | None:
    return None if raw is None else ByLifecycle.from_json(raw, where)


def _count(d: Mapping[str, object], key: str, where: str) -> int:
    n = _opt_count(d, key, where)
    if n is None:
        raise f.FieldError(f"{where}.{key}", "missing")
    return n


def _opt_count(d: Mapping[str, object], key: str, where: str) -> int | None:
    n = f.opt_int(d, key, where)
    if n is not None and not 0 <= n <= MAX_COUNT:
        raise f.FieldError(f"{where}.{key}", f"{n} is not a count (0 to {MAX_COUNT})")
    return n


def _cut(text: str) -> str:
    return text if len(text) <= MAX_UNREAD else text[: MAX_UNREAD - 1] + "…"


# --- the Prometheus text format, for these families only -----------------------------------


@dataclass
class _Sums:
    working: dict[str, int] = field(default_factory=dict)
    orphaned: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)  # the other families, summed
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)


def parse_kubelet_pods(text: str) -> KubeletPods:
    """The pod-worker families of a kubelet's /metrics text (KubeletMetricsError naming the
    line when a sample of theirs is malformed). Families the text lacks are None and
    `unread` names them (a kubelet older than 1.27 publishes none)."""
    sums = _Sums()
    for number, line in enumerate(text.splitlines(), 1):
        name = _family_of(line)
        if name is None:
            continue
        try:
            labels, value = _sample(line, len(name))
        except KubeletMetricsError as err:
            raise KubeletMetricsError(f"line {number} ({_cut(line)[:120]}): {err}") from None
        key = (name, tuple(sorted(labels.items())))
        if key in sums.seen:
            raise KubeletMetricsError(f"line {number}: a second sample of {name}{labels}")
        sums.seen.add(key)
        _add(sums, name, labels, value, number)
    return _result(sums)


def _family_of(line: str) -> str | None:
    """The line's family when it is a sample of one of ours (comments and others: None)."""
    if not line.startswith("kubelet_"):
        return None
    for name in FAMILIES:
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ", "\t"):
            return name
    return None


def _sample(line: str, at: int) -> tuple[dict[str, str], int]:
    """The labels and value of a sample line whose metric name ends at `at`."""
    labels: dict[str, str] = {}
    rest = line[at:]
    if rest.startswith("{"):
        labels, rest = _labels(rest)
    parts = rest.split()
    if not 1 <= len(parts) <= 2:
        raise KubeletMetricsError("expected a value (and an optional timestamp) after the name")
    try:
        value = float(parts[0])
    except ValueError:
        raise KubeletMetricsError(f"value {parts[0]!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or value != int(value) or value > MAX_COUNT:
        raise KubeletMetricsError(f"value {parts[0]!r} is not a count of pods")
    return labels, int(value)


def _labels(text: str) -> tuple[dict[str, str], str]:
    """`{a="x",b="y"} rest` → ({a: x, b: y}, ` rest`), escapes (\\\\, \\", \\n) undone."""
    labels: dict[str, str] = {}
    i = 1
    while True:
        while i < len(text) and text[i] in " \t,":
            i += 1
        if i < len(text) and text[i] == "}":
            return labels, text[i + 1 :]
        eq = text.find("=", i)
        if eq < 0:
            raise KubeletMetricsError("unterminated label set")
        name = text[i:eq].strip()
        if not name or not (name[0].isalpha() or name[0] == "_"):
            raise KubeletMetricsError(f"bad label name {name!r}")
        i = eq + 1
        while i < len(text) and text[i] in " \t":
            i += 1
        if i >= len(text) or text[i] != '"':
            raise KubeletMetricsError(f"label {name}: value not quoted")
        value, i = _quoted(text, i + 1, name)
        if name in labels:
            raise KubeletMetricsError(f"label {name} given twice")
        labels[name] = value


def _quoted(text: str, i: int, name: str) -> tuple[str, int]:
    out: list[str] = []
    while i < len(text):
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\":
            nxt = text[i + 1 : i + 2]
            out.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    raise KubeletMetricsError(f"label {name}: unterminated value")


def _add(sums: _Sums, name: str, labels: dict[str, str], value: int, number: int) -> None:
    if name != WORKING:
        sums.totals[name] = sums.totals.get(name, 0) + value
        return
    lifecycle = labels.get("lifecycle")
    if lifecycle is None or "config" not in labels:
        raise KubeletMetricsError(f"line {number}: {WORKING} without its lifecycle/config label")
    if lifecycle not in LIFECYCLES:
        return  # a lifecycle of a later kubelet: not one of ours
    sums.working[lifecycle] = sums.working.get(lifecycle, 0) + value
    if labels["config"] in ORPHANED_CONFIGS:
        sums.orphaned[lifecycle] = sums.orphaned.get(lifecycle, 0) + value


def _result(sums: _Sums) -> KubeletPods:
    seen = {name for name, _ in sums.seen}
    missing = [n for n in FAMILIES if n not in seen]
    if len(missing) == len(FAMILIES):
        why = "the kubelet's /metrics has none of its pod-worker metrics (a kubelet before 1.27?)"
    elif missing:
        why = "the kubelet's /metrics lacks " + ", ".join(missing)
    else:
        why = ""

    def lifecycles(counts: dict[str, int]) -> ByLifecycle | None:
        if WORKING not in seen:
            return None
        return ByLifecycle(*(min(counts.get(k, 0), MAX_COUNT) for k in LIFECYCLES))

    def total(name: str) -> int | None:
        return min(sums.totals.get(name, 0), MAX_COUNT) if name in seen else None

    return KubeletPods(
        working=lifecycles(sums.working),
        orphaned=lifecycles(sums.orphaned),
        desired=total(DESIRED),
        active=total(ACTIVE),
        orphaned_runtime_total=total(ORPHANED_RUNTIME),
        restarted_total=total(RESTARTED),
        unread=_cut(why),
    )
