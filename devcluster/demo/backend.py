"""What the demo's live loop needs from where the scenarios run: the stand-in
(devcluster.demo.standin: a kubelet-less node in a private mount namespace and a kubelet
stand-in) or the real node (devcluster.demo.real: kubelet + containerd, unstick from the
chart)."""

from __future__ import annotations

import contextlib
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from devcluster.demo.scenarios import Scenario


@dataclass(frozen=True)
class Cluster:
    core: Any  # kubernetes.client.CoreV1Api
    custom: Any  # kubernetes.client.CustomObjectsApi
    uids: dict[str, str]  # scenario pod -> UID


class Backend(Protocol):
    #: What runs the scenarios, said on screen before the table.
    banner: str
    scenarios: tuple[Scenario, ...]

    def start(self, stack: contextlib.ExitStack) -> Cluster:
        """Everything up to the moment the scenario pods are deleted; every part it starts
        is stopped by `stack`."""
        ...

    def finalised(self) -> set[str]:
        """`namespace/name` of the pods a kubelet stand-in finalised (none on the real node)."""
        ...

    def kubelet_view(self, pod: str) -> str:
        """What the real kubelet last said about the pod's volumes ('' for the stand-in)."""
        ...

    def settled(self) -> bool:
        """Everything the table shows beside the outcomes is in (the kubelet's view)."""
        ...

    def check(self) -> None:
        """Raise if a part of the demo died."""
        ...

    def controller_metrics(self) -> list[str]: ...

    def agent_metrics(self, prefix: str) -> list[str]: ...


def scrape_metrics(url: str, prefix: str = "unstick_") -> list[str]:
    """The samples of a /metrics whose names start with `prefix` (no _created or _bucket)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError as e:
        return [f"(metrics not reachable: {e})"]
    return [
        line
        for line in text.splitlines()
        if line.startswith(prefix)
        and not line.split("{")[0].split(" ")[0].endswith(("_created", "_bucket"))
    ]
