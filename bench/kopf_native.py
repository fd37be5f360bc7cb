"""The kopf-native watcher: unstick's own diagnosis/plan/act code, fed by Kopf's pod watch.

Everything is the shipped controller's (policies, Node and Remediation handlers, the
runtime's scheduler and reconcile workers, the reconciler, the API actions), except where
pods come from: instead of the lean paginated watcher, an `@kopf.on.event('pods')` handler
that returns None (no finalizers, no annotations, nothing written to pods). Kopf LISTs all
pods in one response and keeps a worker per object: what the benchmark compares against
the lean watcher. Only a benchmark contender.

    python -m bench.kopf_native --kubeconfig FILE
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from typing import Any

import kopf

from unstick.controller import operator, runtime
from unstick.controller.reconciler import ReconcileSettings
from unstick.controller.runtime import RuntimeSettings
from unstick.kube.client import ClientSettings
from unstick.kube.podwatch import terminating_record

USER_AGENT = "bench-kopf-native/1"


class _NoLeanWatcher:
    """Stands in for the lean PodWatcher: here the pods come from Kopf's own watch."""

    def __init__(self, *_: Any, **__: Any) -> None:
        # The runtime's first pass waits for its watchers' first LIST (runtime.run's
        # `synced`); Kopf's watch has its own, so this one counts as synced at once.
        self.synced = threading.Event()
        self.synced.set()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def build_registry() -> kopf.OperatorRegistry:
    vars(runtime)["PodWatcher"] = _NoLeanWatcher  # the Runtime's watcher class, replaced
    registry = operator.build_registry()

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def pod_event(type: str, body: Any, memo: Any, **_: Any) -> None:
        rt = memo.state.runtime
        uid = (body.get("metadata") or {}).get("uid")
        if rt is None or not uid:
            return
        record = None if type == "DELETED" else terminating_record(dict(body))
        if record is not None or uid in rt.pods:
            rt.pod_changed(uid, record)

    return registry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kopf_native", description=__doc__)
    parser.add_argument("--kubeconfig", required=True, metavar="FILE")
    parser.add_argument("--workers", type=int, default=8, metavar="N")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = operator.ControllerSettings(
        client=ClientSettings(kubeconfig=args.kubeconfig, user_agent=USER_AGENT),
        runtime=RuntimeSettings(
            workers=args.workers,
            # as bench.contenders does for unstick: lift the caps no policy can raise
            reconcile=ReconcileSettings(
                max_cluster_per_minute=1_000_000, max_node_per_minute=1_000_000
            ),
        ),
        metrics_port=0,
    )
    kopf_settings = kopf.OperatorSettings()
    registry = build_registry()
    operator.configure(kopf_settings, verbose=False, registry=registry)
    memo = kopf.Memo(state=operator.State(settings=settings))
    try:
        asyncio.run(
            kopf.operator(
                registry=registry,
                settings=kopf_settings,
                standalone=True,
                clusterwide=True,
                memo=memo,
            )
        )
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
