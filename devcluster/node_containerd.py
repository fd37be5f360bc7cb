"""The real node's containerd (Debian's 1.6, runc 1.1): its configuration, with every
path in the node's temporary directory, and image import with `ctr`."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

# Plugins that would touch paths outside the node's directory or need what is not here.
_DISABLED = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.internal.v1.opt",  # /opt/containerd
    "io.containerd.tracing.processor.v1.otlp",
)
NAMESPACE = "k8s.io"  # the CRI plugin's containerd namespace


@dataclass(frozen=True)
class ContainerdSettings:
    directory: Path  # root, state and the socket
    sandbox_image: str  # the pause image, imported under exactly this name
    cni_conf_dir: Path
    cni_bin_dir: Path = Path("/usr/lib/cni")

    @property
    def socket(self) -> Path:
        return self.directory / "containerd.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"


def config_toml(s: ContainerdSettings) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    disabled = ", ".join(f'"{p}"' for p in _DISABLED)
    return f"""version = 2
root = "{s.directory / "root"}"
state = "{s.directory / "state"}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{s.socket}"

[ttrpc]
  address = "{s.socket}.ttrpc"

[{cri}]
  sandbox_image = "{s.sandbox_image}"
  # The process lacks CAP_SYS_RESOURCE here: without this every sandbox fails with
  # "can't get final child's PID from pipe" (runc cannot lower oom_score_adj).
  restrict_oom_score_adj = true
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{s.cni_bin_dir}"
  conf_dir = "{s.cni_conf_dir}"
"""


def write_config(s: ContainerdSettings) -> Path:
    s.directory.mkdir(parents=True, exist_ok=True)
    path = s.directory / "config.toml"
    path.write_text(config_toml(s))
    return path


def containerd_argv(config: Path) -> list[str]:
    return ["containerd", f"--config={config}", "--log-level=info"]


def ctr(s: ContainerdSettings, *args: str, timeout: float = 300) -> str:
    proc = subprocess.run(
        ["ctr", f"--address={s.socket}", f"--namespace={NAMESPACE}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def import_image(s: ContainerdSettings, archive: Path, ref: str) -> None:
    """Import an OCI archive; make sure it is known under `ref` (what pods name)."""
    ctr(s, "images", "import", str(archive))
    if ref not in image_refs(s):
        raise RuntimeError(f"imported {archive} but containerd has no image {ref!r}")


def image_refs(s: ContainerdSettings) -> set[str]:
    return set(ctr(s, "images", "list", "--quiet").split())
