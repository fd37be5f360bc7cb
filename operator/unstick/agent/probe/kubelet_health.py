"""The kubelet's own health endpoint (`/healthz` on its healthz port, 10248 by default)."""

from __future__ import annotations

import urllib.error
import urllib.request


def kubelet_healthy(url: str, timeout_s: float = 2.0) -> bool | None:
    """True on HTTP 200, False on any other HTTP answer, None when nothing answered.

    None means unknown: the agent could not reach the endpoint (kubelet down, or a
    different healthz address/port), which is not evidence that the kubelet is unhealthy.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with opener.open(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False
    except (urllib.error.URLError, OSError, ValueError):
        return None
