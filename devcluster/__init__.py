"""A local Kubernetes control plane (etcd + kube-apiserver + kwok) for tests, the demo and
the benchmark. Development only: needs the binaries `make tools` builds.

The names below are imported lazily (PEP 562), so a submodule that needs none of them —
the CSI plugin `devcluster.csi_hostpath`, run as a pod from the product image,
which has no `cryptography` — can be imported without the control plane's dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devcluster.controlplane import ControlPlane, ControlPlaneSettings, find_bin_dir
    from devcluster.kwok import FAKE_NODE_ANNOTATION, Kwok, node_manifest

_WHERE = {
    "ControlPlane": "devcluster.controlplane",
    "ControlPlaneSettings": "devcluster.controlplane",
    "find_bin_dir": "devcluster.controlplane",
    "FAKE_NODE_ANNOTATION": "devcluster.kwok",
    "Kwok": "devcluster.kwok",
    "node_manifest": "devcluster.kwok",
}

__all__ = [
    "FAKE_NODE_ANNOTATION",
    "ControlPlane",
    "ControlPlaneSettings",
    "Kwok",
    "find_bin_dir",
    "node_manifest",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'devcluster' has no attribute {name!r}")
