"""The kind suite's test CNI plugin (tests/kind/cnifail/, Go, standard library only):
built with `go build` into the suite's cache, installed as the last plugin of ONE worker's
network and removed again (docs/kind.md, "A CNI plugin whose DEL fails").

Its DEL fails only for pods whose name starts with `MARKER` and only while the node's
`FLAG` file exists, so nothing else on that worker is touched and the test heals it by
removing the file. The node's own conflist is rewritten every 5 s by the suite's network
DaemonSet (hack/kind/net.yaml) when it differs, so the plugin is not added to that file:
a copy of it with the plugin appended is written under a name that sorts first
(`05-…`), which is the one containerd uses (it loads the first configuration of
/etc/cni/net.d, and reloads when the directory changes). Removing that file restores the
node's network as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from . import runs
from .support import podman

SOURCE = Path(__file__).with_name("cnifail")
TYPE = "unstick-cnifail"
MARKER = "cnifail-"
FLAG_DIR = "/run/unstick-cnifail"
FLAG = f"{FLAG_DIR}/fail"
LOG = f"{FLAG_DIR}/calls"  # a line per call of the plugin
NET_D = "/etc/cni/net.d"
CONFLIST_NAME = "05-unstick-cnifail.conflist"
CONFLIST = f"{NET_D}/{CONFLIST_NAME}"
BINARY = f"/opt/cni/bin/{TYPE}"


def build() -> Path:
    """The plugin, built static (CGO_ENABLED=0) into the suite's cache, once per source."""
    files = sorted(p for p in SOURCE.iterdir() if p.suffix in (".go", ".mod"))
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in files))
    out = runs.cache_dir() / "cnifail" / digest.hexdigest()[:16] / TYPE
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{TYPE}.{os.getpid()}.tmp")
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOPROXY": "off"}
    argv = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), "."]
    proc = subprocess.run(argv, cwd=SOURCE, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"go build of {SOURCE} failed: {proc.stderr}")
    tmp.rename(out)
    return out


def node_conflist(node: str) -> tuple[str, dict[str, object]]:
    """The node's network configuration containerd uses now: the first .conflist of
    /etc/cni/net.d (file name, contents)."""
    names = sorted(n for n in podman("exec", node, "ls", NET_D).split() if n.endswith(".conflist"))
    if not names:
        raise RuntimeError(f"{node}: no .conflist in {NET_D}")
    conf: dict[str, object] = json.loads(podman("exec", node, "cat", f"{NET_D}/{names[0]}"))
    return names[0], conf


def chained(conf: dict[str, object]) -> dict[str, object]:
    """`conf` with the plugin appended to its plugins (chained after them)."""
    plugins = conf.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise RuntimeError(f"the node's conflist has no plugins list: {conf}")
    plugin = {"type": TYPE, "podPrefix": MARKER, "failFlag": FLAG, "logFile": LOG}
    return {**conf, "plugins": [*plugins, plugin]}


def write_file(node: str, path: str, text: str) -> None:
    """`text` into `path` on the node, atomically (a rename: containerd never reads half)."""
    script = f'cat > "{path}.tmp" && mv "{path}.tmp" "{path}"'
    podman("exec", "-i", node, "sh", "-c", script, stdin=text)


def uninstall(node: str) -> None:
    """The node as it was: the configuration first (its pods' DEL no longer calls the
    plugin), then the flag, then the binary. Never fails (also after a partial install)."""
    podman("exec", node, "rm", "-f", CONFLIST, f"{CONFLIST}.tmp", check=False)
    podman("exec", node, "rm", "-rf", FLAG_DIR, check=False)
    podman("exec", node, "rm", "-f", BINARY, f"{BINARY}.tmp", f"/tmp/{TYPE}", check=False)


@contextlib.contextmanager
def installed(node: str) -> Iterator[dict[str, object]]:
    """The plugin chained last in `node`'s network, failing (flag present); the conflist
    written. Removed at the end, also on failure."""
    binary = build()
    name, conf = node_conflist(node)
    if name == CONFLIST_NAME:
        raise RuntimeError(f"{node}: {CONFLIST} is already there (another run's?)")
    try:
        podman("exec", node, "mkdir", "-p", FLAG_DIR)
        podman("exec", node, "touch", FLAG)
        # (/opt/cni/bin is a symlink to /usr/lib/cni in the node image: copied beside it)
        podman("cp", str(binary), f"{node}:/tmp/{TYPE}")
        podman("exec", node, "install", "-m", "0755", f"/tmp/{TYPE}", f"{BINARY}.tmp")
        podman("exec", node, "rm", "-f", f"/tmp/{TYPE}")
        podman("exec", node, "mv", f"{BINARY}.tmp", BINARY)
        config = chained(conf)
        write_file(node, CONFLIST, json.dumps(config, indent=1) + "\n")
        # containerd reloads on the directory's inotify event (it logs only failures): the
        # test checks in LOG that its pod's ADD went through the plugin.
        yield config
    finally:
        uninstall(node)


def heal(node: str) -> None:
    """The plugin's DEL succeeds from now on (the flag removed)."""
    podman("exec", node, "rm", "-f", FLAG)


def calls(node: str) -> list[str]:
    """The plugin's calls on the node so far ("ADD pod=<name> exit=0", ...)."""
    return podman("exec", node, "cat", LOG, check=False).splitlines()
