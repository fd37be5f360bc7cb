"""A local Kubernetes control plane (etcd + kube-apiserver + kwok) for tests, the demo and
the benchmark. Development only: needs the binaries `make tools` builds."""

from unstick.devcluster.controlplane import ControlPlane, ControlPlaneSettings, find_bin_dir
from unstick.devcluster.kwok import FAKE_NODE_ANNOTATION, Kwok, node_manifest

__all__ = [
    "FAKE_NODE_ANNOTATION",
    "ControlPlane",
    "ControlPlaneSettings",
    "Kwok",
    "find_bin_dir",
    "node_manifest",
]
