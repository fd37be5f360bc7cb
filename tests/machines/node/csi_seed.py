"""The OrphanedMount seed's parts on the real node: moved to the product package
(devcluster.csi_seed) so that `unstick demo` on the real node uses the same code."""

from devcluster.csi_seed import DRIVER, VOLUME_ID, CsiSeed, set_kubelet_verbosity

__all__ = ["DRIVER", "VOLUME_ID", "CsiSeed", "set_kubelet_verbosity"]
