"""`helm test`: the controller answers and the agents run.

Run by the chart's test pod (templates/tests/check.yaml) as
  python3 helm-test.py NAMESPACE CONTROLLER_DEPLOYMENT AGENT_DAEMONSET METRICS_URL
with the test's ServiceAccount (it may get those two objects, nothing else); outside a
pod, with the current kubeconfig. Prints what it found; exit status 1 with one line per
problem on stderr.
"""

import sys
import urllib.request

from kubernetes import client, config


def main(namespace: str, controller: str, agent: str, metrics_url: str) -> int:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    apps = client.AppsV1Api()
    problems = []

    deployment = apps.read_namespaced_deployment(controller, namespace)
    wanted, ready = deployment.spec.replicas or 0, deployment.status.ready_replicas or 0
    if wanted == 0:
        problems.append(f"controller: deployment {controller} has 0 replicas (controller.replicas)")
    elif ready < 1:
        problems.append(f"controller: 0/{wanted} replicas of {controller} ready")
    else:
        print(f"controller: {ready}/{wanted} replicas of {controller} ready")
    if wanted and metrics_url:
        try:
            with urllib.request.urlopen(metrics_url, timeout=10) as answer:
                text = answer.read().decode("utf-8", "replace")
        except OSError as err:
            problems.append(f"controller: {metrics_url} does not answer: {err}")
        else:
            if "unstick_" in text:
                print(f"controller: answers at {metrics_url}")
            else:
                problems.append(f"controller: {metrics_url} answers without unstick metrics")

    status = apps.read_namespaced_daemon_set(agent, namespace).status
    desired, ready = status.desired_number_scheduled or 0, status.number_ready or 0
    if desired == 0:
        problems.append(f"agents: daemonset {agent} is scheduled on no node")
    elif ready < desired:
        problems.append(f"agents: {ready}/{desired} of daemonset {agent} ready")
    else:
        print(f"agents: {ready}/{desired} of daemonset {agent} ready")

    for problem in problems:
        print(f"FAILED {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
