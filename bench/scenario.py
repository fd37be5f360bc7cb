"""One contender's run, on its own fresh control plane (etcd + kube-apiserver + kwok):

1. build the workload (nodes, healthy pods — for unstick in stages, measuring its RSS
   with nothing stuck at each stage —, the pods that will get stuck);
2. start the contender, wait until its start-up is done (its pod WATCH, or for the naive
   reaper its first LIST, is in the audit log), then a quiet window with nothing stuck;
3. strike: delete the kubelet-less nodes and then all doomed pods at once;
4. wait until every NodeGone pod is gone (bounded), stop the contender, read the audit log;
5. unstick only, with `rss_stages_after_burst` (the full preset: 50,000): the finalizer
   pods are let go and the burst's Remediations deleted, healthy pods are added up to each
   of those counts on the same control plane, and a fresh controller's RSS is measured
   with nothing stuck — after the burst,
   so that every contender's burst runs with the same healthy pods.

Every process started here is stopped by PID in `finally`, also on Ctrl-C or failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import contenders, measure
from bench.workload import (
    NAMESPACE,
    Api,
    WorkloadSize,
    create_base,
    create_doomed,
    create_healthy,
    release_finalizer_pods,
    wait_no_pods,
    wait_running,
)
from bench.workload import strike as make_stuck
from devcluster import ControlPlane, ControlPlaneSettings, Kwok
from devcluster.process import Process

Say = Callable[[str], None]
STARTUP_GRACE_S = 5.0


@dataclass(frozen=True)
class ScenarioSettings:
    size: WorkloadSize
    slack_s: int = 5
    quiet_s: float = 10.0  # nothing stuck, contender running: LISTs here must be 0
    gone_timeout_s: float = 150.0  # how long to wait for the NodeGone pods to be gone
    running_timeout_s: float = 120.0  # how long to wait for kwok to run the healthy pods
    naive_interval_s: float = 30.0  # the naive reaper's round (30 s: the usual cron-like loop)
    settle_s: float = 4.0  # steady-state RSS sampling after start-up, per stage
    rss_stages: tuple[int, ...] = ()  # healthy-pod counts where unstick's RSS is measured
    rss_stages_after_burst: tuple[int, ...] = ()  # the same, larger, after unstick's burst
    logs: Path = Path()


@dataclass
class Outcome:
    result: dict[str, Any]
    lags: list[float]
    rss_series: list[tuple[float, float]]  # (seconds since strike, MiB)
    rss_by_pods: dict[int, float] = field(default_factory=dict)


def policy(slack_s: int) -> dict[str, Any]:
    return {
        "apiVersion": "unstick.dev/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "default"},
        "spec": {
            "dryRun": False,
            "actions": ["observe", "force-delete", "remove-finalizer"],
            "slackSeconds": slack_s,
            "finalizerAllowlist": [],
            "rateLimits": {"clusterPerMinute": 1_000_000, "nodePerMinute": 1_000_000},
        },
    }


def _wait_ready(
    tail: measure.AuditTail, proc: Process, who: contenders.Contender, timeout_s: float = 180.0
) -> float:
    """Wait for the contender's first pod WATCH (or LIST); returns when that happened."""
    deadline = time.monotonic() + timeout_s
    while True:
        for ev in tail.new_events():
            ref = ev.get("objectRef") or {}
            # a WATCH is logged at ResponseStarted already; a LIST once it is complete
            if (
                ev.get("verb") == who.ready_verb
                and ref.get("resource") == "pods"
                and measure.made_by(ev, who.agents)
            ):
                return measure.audit_time(ev["requestReceivedTimestamp"])
        if not proc.alive():
            raise RuntimeError(f"{who.name} exited during start-up:\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{who.name} did not start within {timeout_s:.0f}s")
        time.sleep(0.25)


def _install(cp: ControlPlane, api: Api, slack_s: int) -> None:
    cp.install_crds()
    api.call("POST", "/apis/unstick.dev/v1alpha1/remediationpolicies", policy(slack_s))


def _measure_rss_stage(
    cp: ControlPlane, s: ScenarioSettings, start: contenders.StartSettings, pods: int, say: Say
) -> float:
    """Start unstick with `pods` healthy pods and nothing stuck; its steady RSS (MiB)."""
    who = contenders.CONTENDERS["unstick"]
    tail = measure.AuditTail(cp.audit_log, from_end=True)
    proc = contenders.start("unstick", cp, start, s.logs / f"unstick-at-{pods}.log")
    sampler = measure.Sampler(proc.pid or 0).start()
    try:
        ready = _wait_ready(tail, proc, who)
        time.sleep(s.settle_s)
        rss = max(sampler.rss_between(ready, time.time()), default=sampler.peak_rss_mib)
    finally:
        sampler.stop()
        proc.stop()
    say(f"    unstick at {pods} healthy pods, nothing stuck: RSS {rss:.1f} MiB")
    return rss


def _build(
    cp: ControlPlane,
    api: Api,
    *,
    name: str,
    s: ScenarioSettings,
    start: contenders.StartSettings,
    say: Say,
) -> tuple[int, dict[int, float]]:
    """Nodes, doomed pods, healthy pods (in stages for unstick's RSS); pods Running."""
    size = s.size
    create_base(api, size)
    create_doomed(api, size)
    say(f"  [{name}] control plane up; {size.nodes} kwok nodes; creating {size.pods} pods")
    rss_by_pods: dict[int, float] = {}
    done = 0
    for target in sorted({*s.rss_stages, size.pods}):
        create_healthy(api, size, done, target)
        done = target
        if name == "unstick" and target in s.rss_stages:
            wait_running(api, target, s.running_timeout_s)
            rss_by_pods[target] = _measure_rss_stage(cp, s, start, target, say)
    return wait_running(api, size.pods, s.running_timeout_s), rss_by_pods


def run_contender(name: str, s: ScenarioSettings, say: Say) -> Outcome:
    who = contenders.CONTENDERS[name]
    start = contenders.StartSettings(slack_s=s.slack_s, naive_interval_s=s.naive_interval_s)
    size = s.size
    cp = ControlPlane(ControlPlaneSettings())
    kwok: Kwok | None = None
    proc: Process | None = None
    spy: Process | None = None
    sampler: measure.Sampler | None = None
    try:
        t0 = time.monotonic()
        cp.start()
        kwok = Kwok(cp).start()
        api = Api(cp)
        _install(cp, api, s.slack_s)
        running, rss_by_pods = _build(cp, api, name=name, s=s, start=start, say=say)
        build_s = time.monotonic() - t0
        say(f"  [{name}] workload built in {build_s:.0f}s ({running} healthy pods Running)")

        tail = measure.AuditTail(cp.audit_log, from_end=True)
        started = time.time()
        proc = contenders.start(name, cp, start, s.logs / f"{name}.log")
        sampler = measure.Sampler(proc.pid or 0).start()
        spy = contenders.attach_profiler(proc, name, s.logs)
        watching = _wait_ready(tail, proc, who)
        # Start-up = up to the pod watch, plus a grace for the other initial LISTs (Kopf
        # starts its CRD/Node watches after the on.startup handler that starts the lean one).
        ready = watching + STARTUP_GRACE_S
        say(f"  [{name}] started (pid {proc.pid}); {s.quiet_s:.0f}s with nothing stuck")
        time.sleep(max(0.0, ready - time.time()) + s.quiet_s)

        struck, eligible = _strike(api, s, say, name)
        left = _wait_gone(api, s.gone_timeout_s, say, name)
        burst_end = time.time()
        time.sleep(2.0)  # let the audit log catch up
        sampler.stop()
        proc.stop()
        window = measure.Window(
            start=started, ready=ready, strike=struck, end=time.time(), burst_end=burst_end
        )
        req = measure.read_requests(cp.audit_events(), who.agents, window)
        extra = {
            "healthy_running": running,
            "workload_build_s": round(build_s, 1),
            **_detection(s.logs / f"{name}.log"),
        }
        outcome = _outcome(who, req, sampler, eligible, left, struck, extra, size.finalizer)
        if name == "unstick" and s.rss_stages_after_burst:
            rss_by_pods.update(_rss_after_burst(cp, api, s, start, say))
        outcome.rss_by_pods = rss_by_pods
        return outcome
    finally:
        if sampler is not None:
            sampler.stop()
        if proc is not None:
            proc.stop()
        contenders.finish_profiler(spy)
        if kwok is not None:
            kwok.stop()
        cp.stop()


def _strike(api: Api, s: ScenarioSettings, say: Say, name: str) -> tuple[float, dict[str, float]]:
    """Make the pods stuck; when that began, and each NodeGone pod's eligibility."""
    struck = time.time()
    stamps = make_stuck(api, s.size)
    eligible = {n: stamps[n] + s.slack_s for n in s.size.doomed_names() if n in stamps}
    say(
        f"  [{name}] {len(eligible)} NodeGone + {s.size.finalizer} finalizer pods stuck "
        f"(deleted in {time.time() - struck:.1f}s); waiting for the NodeGone ones to go"
    )
    return struck, eligible


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _detection(log: Path) -> dict[str, Any]:
    """unstick's detection lag from its own log lines (none for the other contenders)."""
    lags = measure.detection_lags(log)
    if not lags:
        return {}
    stats = measure.lag_stats(lags)
    return {
        "detection_lag_p50_s": stats["lag_p50_s"],
        "detection_lag_p99_s": stats["lag_p99_s"],
        "detections": len(lags),
    }


def _rss_after_burst(
    cp: ControlPlane, api: Api, s: ScenarioSettings, start: contenders.StartSettings, say: Say
) -> dict[int, float]:
    """After the burst: nothing stuck any more (the finalizer pods let go), healthy pods
    added up to each of `rss_stages_after_burst`, a fresh controller's steady RSS at each."""
    release_finalizer_pods(api, s.size)
    left = wait_no_pods(api, "role=finalizer", s.running_timeout_s)
    if left:
        raise RuntimeError(f"{left} finalizer pods still there after their finalizer went")
    # The burst's Remediations go too: the stages before it had none, and only the number
    # of pods may differ between the stages compared.
    api.call("DELETE", f"/apis/unstick.dev/v1alpha1/namespaces/{NAMESPACE}/remediations")
    out: dict[int, float] = {}
    done = s.size.pods
    for target in sorted(n for n in s.rss_stages_after_burst if n > s.size.pods):
        say(f"  [unstick] after the burst: {target} healthy pods")
        create_healthy(api, s.size, done, target)
        done = target
        running = wait_running(api, target, s.running_timeout_s * target / s.size.pods)
        if running < target:
            say(f"    only {running} of {target} healthy pods Running; measured anyway")
        out[target] = _measure_rss_stage(cp, s, start, target, say)
    return out


def _wait_gone(api: Api, timeout_s: float, say: Say, name: str) -> int:
    deadline = time.monotonic() + timeout_s
    last_report = time.monotonic()
    while True:
        left = api.count_pods("role=doomed")
        if left == 0 or time.monotonic() > deadline:
            return left
        if time.monotonic() - last_report >= 15:
            say(f"  [{name}] {left} NodeGone pods still there")
            last_report = time.monotonic()
        time.sleep(0.5)


def _outcome(  # noqa: PLR0917 (the pieces of one measurement)
    who: contenders.Contender,
    req: measure.Requests,
    sampler: measure.Sampler,
    eligible: dict[str, float],
    left: int,
    struck: float,
    extra: dict[str, Any],
    n_fin: int,
) -> Outcome:
    acted = {n: req.first_delete[n] for n in eligible if n in req.first_delete}
    lags = [acted[n] - eligible[n] for n in acted]
    all_gone_s = (
        round(max(acted.values()) - min(eligible.values()), 3)
        if left == 0 and acted and len(acted) == len(eligible)
        else None
    )
    result: dict[str, Any] = {
        **measure.lag_stats(lags),
        "all_gone_s": all_gone_s,
        "rss_peak_mib": round(sampler.peak_rss_mib, 1),
        "cpu_s": round(sampler.cpu_s, 2),
        "requests": measure.verb_counts(req.by_verb),
        "writes_to_healthy_pods": req.writes_to_healthy,
        "lists_after_startup_while_quiet": req.lists_while_quiet,
        "nodegone_pods": len(eligible),
        "nodegone_acted": len(acted),
        "nodegone_left": left,
        "acted_before_eligible": sum(1 for lag in lags if lag < 0),
        **extra,
        # Where the time goes: requests per stuck pod, and the API server's own time for
        # each (audit log: received → response complete), once the pods were stuck.
        "requests_after_strike": req.after_strike,
        "requests_after_strike_by_kind": dict(req.after_strike_by_kind.most_common()),
        "requests_per_stuck_pod": round(req.after_strike / max(1, len(eligible) + n_fin), 2),
        # The NodeGone pods' handling: requests after the strike that name no finalizer
        # pod, nor its Remediation or Event (measure.FINALIZER_OBJECT), per NodeGone pod
        # the contender deleted.
        "requests_after_strike_nodegone": req.nodegone_after_strike,
        "requests_per_force_deleted_pod": (
            round(req.nodegone_after_strike / len(acted), 2) if acted else None
        ),
        "requests_about_healthy_pods": req.about_healthy,
        "server_ms_p50_after_strike": _round(measure.percentile(req.server_ms_after_strike, 50)),
        "server_ms_p99_after_strike": _round(measure.percentile(req.server_ms_after_strike, 99)),
        # The API server's own time for every client's non-WATCH requests in the burst.
        "apiserver_request_p50_s": _round(
            measure.percentile(req.server_s_burst_all_clients, 50), 4
        ),
        "apiserver_request_p99_s": _round(
            measure.percentile(req.server_s_burst_all_clients, 99), 4
        ),
        "apiserver_requests_in_burst": len(req.server_s_burst_all_clients),
    }
    if who.acts_on_finalizers:
        # First diagnosis: Remediation created (one per stuck pod, any cause).
        diag = [
            t - eligible[pod]
            for rem, t in req.remediation_created.items()
            if (pod := rem.rsplit("-", 1)[0]) in eligible
        ]
        stats = measure.lag_stats(diag)
        result["diagnosis_lag_p50_s"] = stats["lag_p50_s"]
        result["diagnosis_lag_p99_s"] = stats["lag_p99_s"]
        result["remediations_created"] = len(req.remediation_created)
    series = [(t - struck, rss) for t, rss in sampler.series]
    return Outcome(result, lags, series)
