"""The naive reaper: the script many clusters run from a CronJob or a loop.

Every `--interval` seconds it LISTs all pods in one request (model objects, as the usual
script does with the `kubernetes` client) and force-deletes — sequentially, with
`gracePeriodSeconds=0` — every pod past `deletionTimestamp + slack`. No safety checks: it
does not look at why the pod is stuck, whether its node is merely unreachable (the pod may
still run there), or whether a finalizer holds it (the force delete then does nothing and
is repeated every round). Only a benchmark contender; never run this on a real cluster.

    python -m bench.naive --kubeconfig FILE [--interval 30] [--slack 5]
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

USER_AGENT = "bench-naive-reaper/1"


def reap_once(core: client.CoreV1Api, slack: timedelta) -> tuple[int, int]:
    pods = core.list_pod_for_all_namespaces()
    now = datetime.now(UTC)
    deleted = 0
    for pod in pods.items:
        meta = pod.metadata
        stamp = meta.deletion_timestamp if meta else None
        if meta is None or stamp is None or now <= stamp + slack:
            continue
        try:
            core.delete_namespaced_pod(
                str(meta.name),
                str(meta.namespace),
                grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0),
            )
            deleted += 1
        except ApiException as exc:
            if exc.status != 404:
                print(f"delete {meta.namespace}/{meta.name}: {exc.status}")
    return len(pods.items), deleted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.naive", description=__doc__)
    parser.add_argument("--kubeconfig", required=True, metavar="FILE")
    parser.add_argument("--interval", type=float, default=30.0, metavar="S")
    parser.add_argument("--slack", type=float, default=5.0, metavar="S")
    args = parser.parse_args(argv)
    api = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    api.user_agent = USER_AGENT
    core = client.CoreV1Api(api)
    slack = timedelta(seconds=args.slack)
    while True:
        started = time.monotonic()
        listed, deleted = reap_once(core, slack)
        print(f"listed {listed} pods, force-deleted {deleted}", flush=True)
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))


if __name__ == "__main__":
    raise SystemExit(main())
