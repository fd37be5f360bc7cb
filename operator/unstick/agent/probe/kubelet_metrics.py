"""The kubelet's own word on its pod workers: its node's kubelet `/metrics` (HTTPS on the
kubelet port), read with the agent's ServiceAccount token, which the kubelet lets through
when the token's account may `get nodes/metrics` (its webhook authorization asks the API
server; the chart's ClusterRole grants exactly that, never nodes/proxy).

The kubelet's serving certificate is verified against the ServiceAccount's CA bundle (the
cluster CA): the token is never sent to a server that did not prove it is the kubelet. A
kubelet with a self-signed serving certificate (kubeadm's default without
serverTLSBootstrap) is not read; the probe says so (docs/agent.md).

Never raises: whatever fails leaves the counts absent and `unread` says why. Only the
pod-worker families are kept (`unstick.core.model.kubelet_pods`).
"""

from __future__ import annotations

import http.client
import os
import ssl
import urllib.error
import urllib.request

from unstick.core.model.kubelet_pods import KubeletMetricsError, KubeletPods, parse_kubelet_pods

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: more than any kubelet's /metrics (a 1.36 kubelet with ~20 pods: about 150 KB)
MAX_BYTES = 16 * 1024 * 1024
_ACCEPT = "text/plain;version=0.0.4"


def read_kubelet_pods(
    url: str, account_dir: str = SERVICE_ACCOUNT_DIR, timeout_s: float = 2.0
) -> KubeletPods:
    """The kubelet's pod-worker counts from `url`, or why they were not read."""
    if not url:
        return KubeletPods.not_read("the agent was not given the kubelet's /metrics address")
    try:
        with open(os.path.join(account_dir, "token"), encoding="utf-8") as fh:
            token = fh.read().strip()
        context = ssl.create_default_context(cafile=os.path.join(account_dir, "ca.crt"))
    except (OSError, ssl.SSLError, ValueError) as err:
        return KubeletPods.not_read(f"cannot read the agent's ServiceAccount token or CA: {err}")
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}", "Accept": _ACCEPT}
    )
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),  # never via a proxy
        urllib.request.HTTPSHandler(context=context),
    )
    try:
        with opener.open(request, timeout=timeout_s) as response:
            body = response.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as err:
        return KubeletPods.not_read(_refused(url, err))
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as err:
        reason = getattr(err, "reason", err)
        return KubeletPods.not_read(f"the kubelet's {url} did not answer: {reason}")
    if len(body) > MAX_BYTES:
        return KubeletPods.not_read(f"the kubelet's {url} sent more than {MAX_BYTES} bytes")
    try:
        return parse_kubelet_pods(body.decode("utf-8", errors="replace"))
    except KubeletMetricsError as err:
        return KubeletPods.not_read(f"the kubelet's {url} is not Prometheus text: {err}")


def _refused(url: str, err: urllib.error.HTTPError) -> str:
    if err.code == 401:
        return (
            f"the kubelet's {url} refused the agent's token (401): its webhook "
            "authentication is off (authentication.webhook.enabled)"
        )
    if err.code == 403:
        return (
            f"the kubelet's {url} refused the read (403): the agent's ServiceAccount may not "
            "get nodes/metrics"
        )
    return f"the kubelet's {url} answered HTTP {err.code}"
