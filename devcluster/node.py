"""A real Kubernetes node for tests: Debian's containerd + runc + CNI plugins and a kubelet
built from the pinned Kubernetes module, registered with the local control plane.

The node lives in its own PID and mount namespaces (`unshare --pid --mount`, like a kind
node): its PID 1 is a small init, so `hostPID` pods see the node's processes and
`/proc/1/mountinfo` is the node's mount table; containerd, the kubelet and every
container run there, so their mounts (pod volumes, overlay roots, `/run/netns`) never
reach the machine's mount table and all go when the namespace does. Inside it, `/run`
and `/var/log` are fresh tmpfs and `/var/lib/cni` (libcni's cache, not configurable in
containerd 1.6) is a directory of the node's. State is in a temporary directory; the
pods' cgroups are under `<controller>/<cgroup root>` (not the machine's `kubepods`).
The network stays the host's: pods hang off a bridge of the node's (node_network).

The kubelet runs under a small supervisor (the node's "service manager", as systemd with
`Restart=always` is on a real node): it restarts the kubelet when it exits, and on request
(`<workdir>/kubelet-service/restart`, a host command the agent runs through nsenter into
the node's PID 1 namespaces, as it would run `systemctl restart kubelet`) stops it as
systemd stops a unit — SIGTERM, SIGCONT (a SIGSTOPped kubelet wakes to get it), SIGKILL
after a stop timeout — and starts a new one.

`stop()` stops the kubelet and containerd by PID, kills the namespace's init (which ends
every process in it), then removes what outlives the namespaces: the cgroups, the
bridge, the temporary directory. `leftovers()` lists anything still there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devcluster.controlplane import ControlPlane
from devcluster.node_containerd import (
    ContainerdSettings,
    containerd_argv,
    ctr,
    import_image,
    write_config,
)
from devcluster.node_images import NodeImage, NodeImages
from devcluster.node_kubelet import KubeletSettings, kubelet_argv, write_kubelet_files
from devcluster.node_network import (
    NetworkSettings,
    ServiceRelay,
    bridge_exists,
    bridge_ports,
    create_bridge,
    delete_bridge,
    delete_links,
    links,
    write_cni_config,
)
from devcluster.process import Process, wait_until

CGROUP_FS = Path("/sys/fs/cgroup")
CNI_CACHE = Path("/var/lib/cni")

# PID 1 of the node: mounts the node's /run, /var/log and /var/lib/cni, makes the node's
# directory a shared mount (as systemd makes / on a real node: a hostPath under it may be
# mounted with Bidirectional or HostToContainer propagation, e.g. a CSI driver's), reaps orphans
# (containerd's shims re-parent to it), exits on SIGTERM (the kernel then kills the rest).
_INIT = r"""
import os, signal, subprocess, sys
ready, cni_cache, workdir = sys.argv[1:4]
for argv in (["mount", "-t", "tmpfs", "-o", "mode=0755", "node-run", "/run"],
             ["mount", "-t", "tmpfs", "-o", "mode=0755", "node-log", "/var/log"],
             ["mount", "--bind", cni_cache, "/var/lib/cni"],
             ["mount", "--bind", workdir, workdir],
             ["mount", "--make-rshared", workdir]):
    subprocess.run(argv, check=True)
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
open(ready, "w").close()
while True:
    signal.pause()
"""


# The kubelet's "service manager": starts the kubelet, writes its own and the kubelet's PID
# (node PID namespace numbers) to the service dir, restarts the kubelet when it exits (1 s
# later, like Restart=always, RestartSec=1) and on SIGHUP; on SIGTERM stops it and exits.
# A kubelet dies with its supervisor (PR_SET_PDEATHSIG).
_SUPERVISOR = r"""
import ctypes, os, signal, subprocess, sys, time
service, stop_timeout, argv = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
wanted = {"restart": False, "stop": False}
signal.signal(signal.SIGHUP, lambda *_: wanted.update(restart=True))
signal.signal(signal.SIGTERM, lambda *_: wanted.update(stop=True))
def say(message):
    print(f"kubelet-supervisor: {message}", flush=True)
def write(name, value):
    tmp = os.path.join(service, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{value}\n")
    os.rename(tmp, os.path.join(service, name))
def stop(child):
    say(f"stopping kubelet pid {child.pid} (SIGTERM, SIGCONT)")
    child.send_signal(signal.SIGTERM)
    child.send_signal(signal.SIGCONT)
    try:
        child.wait(stop_timeout)
    except subprocess.TimeoutExpired:
        say(f"kubelet pid {child.pid} still there after {stop_timeout:g} s: SIGKILL")
        child.kill()
        child.wait()
    say(f"kubelet pid {child.pid} stopped ({child.returncode})")
write("supervisor.pid", os.getpid())
while not wanted["stop"]:
    child = subprocess.Popen(argv, preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))
    write("kubelet.pid", child.pid)
    say(f"started kubelet pid {child.pid}")
    while child.poll() is None and not (wanted["restart"] or wanted["stop"]):
        time.sleep(0.1)
    if child.poll() is None:
        say("restart requested" if wanted["restart"] and not wanted["stop"] else "stop requested")
        stop(child)
    elif not wanted["stop"]:
        say(f"kubelet pid {child.pid} exited ({child.returncode}): restarting in 1 s")
        time.sleep(1)
    wanted["restart"] = False
say("stopped")
"""

# The node's `systemctl restart kubelet`: ask the supervisor, wait for a new kubelet.
# Runs in the node's PID namespace (the PIDs in the files are that namespace's).
_RESTART = """#!/bin/sh
set -eu
here=$(dirname "$0")
old=$(cat "$here/kubelet.pid")
kill -HUP "$(cat "$here/supervisor.pid")"
for _ in $(seq 300); do
  new=$(cat "$here/kubelet.pid")
  if [ "$new" != "$old" ]; then
    echo "kubelet restarted by its supervisor: pid $old -> $new"
    exit 0
  fi
  sleep 0.1
done
echo "the kubelet's supervisor did not restart it within 30 s (pid $old)" >&2
exit 1
"""


@dataclass(frozen=True)
class NodeSettings:
    name: str = "unstick-node"
    network: NetworkSettings = field(default_factory=NetworkSettings)
    kubelet_port: int = 10250
    healthz_port: int = 10248
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 20.0
    kubelet_stop_timeout_s: float = 5.0  # the supervisor's SIGTERM → SIGKILL (TimeoutStopSec)
    import_unstick: bool = True  # False: only the pause and busybox images

    @property
    def cgroup_root(self) -> str:
        return f"/{self.name}"


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class NodeDaemon:
    """A daemon run in the node's namespaces through `nsenter` (which forks into the PID
    namespace and waits): stopped by the daemon's own PID, not nsenter's."""

    process: Process

    @property
    def host_pid(self) -> int | None:
        pid = self.process.pid
        found = children(pid) if pid else []
        return found[0] if found else None

    def stop(self, timeout: float) -> None:
        pid = self.host_pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.stop()


@dataclass
class RealNode:
    control_plane: ControlPlane
    images: NodeImages
    settings: NodeSettings = field(default_factory=NodeSettings)
    workdir: Path = field(init=False)
    init: Process | None = field(init=False, default=None)
    init_pid: int = field(init=False, default=0)
    containerd: NodeDaemon | None = field(init=False, default=None)
    kubelet: NodeDaemon | None = field(init=False, default=None)
    relay: ServiceRelay | None = field(init=False, default=None)
    _links_before: dict[str, str] = field(init=False, default_factory=dict)
    _netns_before: frozenset[str] = field(init=False, default_factory=frozenset)
    _made_cni_cache: bool = field(init=False, default=False)
    _made_bridge: bool = field(init=False, default=False)
    _lock: int | None = field(init=False, default=None)

    # -- paths -------------------------------------------------------------------

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def containerd_settings(self) -> ContainerdSettings:
        return ContainerdSettings(
            directory=self.workdir / "containerd",
            sandbox_image=self.images.pause.ref,
            cni_conf_dir=self.workdir / "cni" / "net.d",
        )

    @property
    def kubelet_settings(self) -> KubeletSettings:
        return KubeletSettings(
            node_name=self.settings.name,
            root_dir=self.kubelet_root,
            workdir=self.workdir / "kubelet-conf",
            runtime_endpoint=self.containerd_settings.endpoint,
            cgroup_root=self.settings.cgroup_root,
            port=self.settings.kubelet_port,
            healthz_port=self.settings.healthz_port,
            # The bridge's address: this node's own (another node has another bridge), and
            # not loopback, which the kubelet refuses as a node IP.
            node_ip=self.settings.network.gateway,
        )

    @property
    def kubelet_service(self) -> Path:
        """The kubelet supervisor's directory: its PID files and the `restart` command."""
        return self.workdir / "kubelet-service"

    @property
    def restart_kubelet_command(self) -> str:
        """What the agent runs for restart-kubelet here (the chart's
        agent.restartKubeletCommand): the node's restart command, in its namespaces."""
        return f"nsenter -t 1 -m -p -- {self.kubelet_service / 'restart'}"

    @property
    def kubelet_healthz(self) -> str:
        return f"http://127.0.0.1:{self.settings.healthz_port}/healthz"

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> RealNode:
        self._take_lock()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.settings.name}-"))
        self._links_before = links()
        self._netns_before = named_netns()
        try:
            self._prepare_host()
            self._start_namespaces()
            self._start_containerd()
            for image in self.images.all():
                if image is not self.images.unstick or self.settings.import_unstick:
                    self.import_image(image)
            self.start_kubelet()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop everything by PID and remove what the node made; raises if something is
        left behind (after trying to remove it all)."""
        timeout = self.settings.stop_timeout_s
        # Our pods' veths (our bridge's ports): the ones still there at the end are ours.
        ports = bridge_ports(self.settings.network.bridge) if self._made_bridge else []
        self._forget()
        for daemon in (self.kubelet, self.containerd):
            if daemon is not None:
                daemon.stop(timeout)
        self.kubelet = self.containerd = None
        self._stop_namespaces()
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        remove_cgroups(self.settings.cgroup_root, timeout)
        if self._made_bridge:
            delete_bridge(self.settings.network)
            self._made_bridge = False
        delete_links([name for name in ports if name in links()])
        if self._made_cni_cache:
            with contextlib.suppress(OSError):
                CNI_CACHE.rmdir()
        if hasattr(self, "workdir"):
            shutil.rmtree(self.workdir, ignore_errors=True)
        left = self.leftovers()
        self._release_lock()
        if left:
            raise RuntimeError("the node left things behind:\n  " + "\n  ".join(left))

    def _take_lock(self, timeout: float = 600.0) -> None:
        """One node of a name per machine at a time (its bridge, ports and cgroups are
        named after it): wait for another test session's node of that name to stop."""
        path = Path(tempfile.gettempdir()) / f"{self.settings.name}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

        def locked() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        try:
            wait_until(locked, timeout=timeout, what=f"another node {self.settings.name} to stop")
        except BaseException:
            os.close(fd)
            raise
        self._lock = fd

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _forget(self) -> None:
        """Remove the node from the API as a machine that is gone: its pods (force) and
        its Node object, so no controller keeps pods bound to it (a DaemonSet's, say)."""
        name, cp = self.settings.name, self.control_plane
        # The Node first: a DaemonSet would put a new pod on a node that still exists.
        with contextlib.suppress(OSError):
            cp.request("DELETE", f"/api/v1/nodes/{name}")
        with contextlib.suppress(OSError):
            pods = cp.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}")
            for pod in pods["items"]:
                meta = pod["metadata"]
                path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                with contextlib.suppress(OSError):
                    cp.request("DELETE", path, {"gracePeriodSeconds": 0})

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start-up ----------------------------------------------------------------

    def _prepare_host(self) -> None:
        if not CNI_CACHE.exists():
            CNI_CACHE.mkdir(parents=True)
            self._made_cni_cache = True
        make_cgroups(self.settings.cgroup_root)
        net = self.settings.network
        create_bridge(net)
        self._made_bridge = True
        write_cni_config(net, self.containerd_settings.cni_conf_dir, self.workdir / "cni" / "ipam")
        if net.service_ip:
            port = int(self.control_plane.url.rpartition(":")[2])
            self.relay = ServiceRelay(
                (net.service_ip, net.service_port), ("127.0.0.1", port)
            ).start()

    def _start_namespaces(self) -> None:
        ready = self.workdir / "init.ready"
        cni_cache = self.workdir / "cni" / "cache"
        cni_cache.mkdir(parents=True)
        argv = [
            "unshare",
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation=private",
            "--kill-child=SIGKILL",
            "--",
            sys.executable,
            "-c",
            _INIT,
            str(ready),
            str(cni_cache),
            str(self.workdir),
        ]
        self.init = Process("node-init", argv, self.workdir / "init.log").start()
        wait_until(
            ready.exists, timeout=30, what="the node's namespaces (init ready)", process=self.init
        )
        unshare_pid = self.init.pid
        assert unshare_pid is not None
        self.init_pid = wait_until(
            lambda: next(iter(children(unshare_pid)), 0), timeout=10, what="the node's init pid"
        )

    def _stop_namespaces(self) -> None:
        if self.init is None:
            return
        pid_ns = self.pid_namespace()
        if self.init_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        self.init.stop()
        self.init = None
        self.init_pid = 0
        if pid_ns:
            wait_until(
                lambda: not processes_in(pid_ns),
                timeout=self.settings.stop_timeout_s,
                what="every process of the node to exit",
            )

    def in_node(self, argv: list[str]) -> list[str]:
        """`argv` run in the node's PID and mount namespaces."""
        return ["nsenter", f"--target={self.init_pid}", "--mount", "--pid", "--", *argv]

    def _daemon(self, name: str, argv: list[str]) -> NodeDaemon:
        log = self.workdir / f"{name}.log"
        return NodeDaemon(Process(name, self.in_node(argv), log).start())

    def _start_containerd(self) -> None:
        s = self.containerd_settings
        config = write_config(s)
        self.containerd = self._daemon("containerd", containerd_argv(config))

        def up() -> bool:
            try:
                ctr(s, "version", timeout=5)
            except (RuntimeError, subprocess.TimeoutExpired):
                return False
            return True

        wait_until(up, timeout=60, what="containerd", process=self.containerd.process)

    def import_image(self, image: NodeImage) -> None:
        import_image(self.containerd_settings, image.archive, image.ref)

    def start_kubelet(self) -> None:
        ks = self.kubelet_settings
        kubeconfig, config = write_kubelet_files(
            ks, self.control_plane.certs, self.control_plane.url
        )
        argv = kubelet_argv(self.control_plane.bin_dir, ks, kubeconfig, config)
        service = self.kubelet_service
        service.mkdir(exist_ok=True)
        for name in ("kubelet.pid", "supervisor.pid"):
            (service / name).unlink(missing_ok=True)
        restart = service / "restart"
        restart.write_text(_RESTART)
        restart.chmod(0o755)
        timeout = str(self.settings.kubelet_stop_timeout_s)
        supervised = [sys.executable, "-c", _SUPERVISOR, str(service), timeout, *argv]
        self.kubelet = self._daemon("kubelet", supervised)
        wait_until(
            self.kubelet_pid, timeout=10, what="the kubelet started", process=self.kubelet.process
        )

    def kubelet_pid(self) -> int | None:
        """The running kubelet's PID (the machine's numbering), not its supervisor's."""
        supervisor = self.kubelet.host_pid if self.kubelet else None
        found = [p for p in children(supervisor) if _alive(p)] if supervisor else []
        return found[0] if found else None

    def signal_kubelet(self, sig: signal.Signals) -> int:
        """Send `sig` to the kubelet itself (e.g. SIGSTOP: a kubelet that no longer makes
        progress); returns its PID."""
        pid = self.kubelet_pid()
        if pid is None:
            raise RuntimeError("no kubelet runs")
        os.kill(pid, sig)
        return pid

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop(self.settings.stop_timeout_s)
            self.kubelet = None

    def wait_ready(self, timeout: float | None = None) -> None:
        proc = self.kubelet.process if self.kubelet else None
        wait_until(
            self._ready,
            timeout=timeout or self.settings.start_timeout_s,
            what=f"node {self.settings.name} Ready",
            process=proc,
        )

    def _ready(self) -> bool:
        try:
            node = self.control_plane.request("GET", f"/api/v1/nodes/{self.settings.name}")
        except OSError:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # -- use -----------------------------------------------------------------------

    def run(self, argv: list[str], log: Path | None = None) -> subprocess.Popen[bytes]:
        """Start a process on the node (its PID and mount namespaces), e.g. a holder of a
        pod's mount; the caller stops it."""
        out = (log or self.workdir / "run.log").open("ab")
        try:
            return subprocess.Popen(
                self.in_node(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            out.close()

    def kill(self, popen: subprocess.Popen[bytes]) -> None:
        """Stop a process `run` started: its own PID on the node first (nsenter, which
        forked it, passes no signal on), then nsenter."""
        for pid in children(popen.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            popen.kill()
        popen.wait()

    def mountinfo(self) -> str:
        """The node's mount table (its init's)."""
        return Path(f"/proc/{self.init_pid}/mountinfo").read_text()

    def pid_namespace(self) -> str:
        try:
            return str(Path(f"/proc/{self.init_pid}/ns/pid").readlink()) if self.init_pid else ""
        except OSError:
            return ""

    def node_pid(self, host_pid: int) -> int:
        """A host PID's number in the node's PID namespace (what the agent reports)."""
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
        raise ValueError(f"no NSpid for {host_pid}")

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.workdir / f"{name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_text(self, name: str) -> str:
        try:
            return (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def helm_values(self) -> dict[str, object]:
        """The chart values that fit this node (paths and the kubelet's restart command;
        the image is the caller's)."""
        return {
            "agent": {
                "kubeletRoot": str(self.kubelet_root),
                "criSocket": str(self.containerd_settings.socket),
                "stateDir": str(self.workdir / "agent-state"),
                "kubeletHealthz": self.kubelet_healthz,
                "restartKubeletCommand": self.restart_kubelet_command,
            }
        }

    def write_helm_values(self, path: Path, extra: dict[str, object]) -> Path:
        path.write_text(yaml.safe_dump(_merge(self.helm_values(), extra)))
        return path

    def leftovers(self) -> list[str]:
        found = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            if hasattr(self, "workdir") and str(self.workdir) in line:
                found.append(f"mount: {line}")
        found += [f"cgroup: {p}" for p in cgroup_dirs(self.settings.cgroup_root)]
        if bridge_exists(self.settings.network.bridge):
            found.append(f"bridge: {self.settings.network.bridge}")
        # New veths (the only interfaces the node's bridge CNI makes besides its bridge,
        # checked above), except those of another bridge: another user of the machine
        # makes interfaces meanwhile too (a kind cluster on podman in the suite beside:
        # its network's bridge, its nodes' veths on it).
        bridge = self.settings.network.bridge
        new = [
            name
            for name, master in links("veth").items()
            if name not in self._links_before and master in ("", bridge)
        ]
        found += [f"link: {name}" for name in sorted(new)]
        # The node's own netns live under its private /run (see the module docstring), so
        # a named netns of the machine is ours only if it appeared during the node's life
        # and has the name containerd's CRI gives a pod's netns (`cni-<uuid>`): another
        # user of the machine keeps its own from before or makes them meanwhile (podman's
        # are `netns-<uuid>`).
        made = named_netns() - self._netns_before
        found += [f"netns: {n}" for n in sorted(made) if n.startswith("cni-")]
        if self._made_cni_cache and CNI_CACHE.exists():
            found.append(f"directory: {CNI_CACHE}")
        if hasattr(self, "workdir") and self.workdir.exists():
            found.append(f"directory: {self.workdir}")
        return found


def named_netns() -> frozenset[str]:
    """The machine's named network namespaces (`ip netns list`), by name."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return frozenset(line.split()[0] for line in out.splitlines() if line.strip())


def _merge(a: dict[str, object], b: dict[str, object]) -> dict[str, object]:
    out = dict(a)
    for key, value in b.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out


# -- cgroups -------------------------------------------------------------------------


def cgroup_mounts() -> list[Path]:
    """Mount points of the machine's cgroup hierarchies (v1 controllers, and v2)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        if fstype in ("cgroup", "cgroup2"):
            out.append(Path(left.split()[4]))
    return out


def make_cgroups(root: str) -> None:
    """The kubelet's --cgroup-root in every v1 hierarchy (the kubelet wants it to exist);
    cpuset needs its cpus and mems set before anything can join."""
    for mount in cgroup_mounts():
        if not (mount / "cgroup.procs").exists() or (mount / "cgroup.controllers").exists():
            continue  # not a hierarchy root we can use, or cgroup v2 (unused in v1 mode)
        path = mount / root.lstrip("/")
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((mount / name).read_text())


def cgroup_dirs(root: str) -> list[Path]:
    """The node's cgroup directories still present (its root in each hierarchy), and
    any `kubepods` at the machine's hierarchy roots."""
    found = []
    for mount in cgroup_mounts():
        found += [p for p in [mount / root.lstrip("/")] if p.exists()]
        found += sorted(mount.glob("kubepods*"))
    return found


def remove_cgroups(root: str, timeout: float) -> None:
    """rmdir the node's cgroup trees, deepest first (a cgroup is removable once its
    processes are gone, which may take a moment after they were killed)."""

    def attempt() -> bool:
        for mount in cgroup_mounts():
            top = mount / root.lstrip("/")
            if not top.exists():
                continue
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*dirs, top]:
                with contextlib.suppress(OSError):
                    d.rmdir()
        return not any((mount / root.lstrip("/")).exists() for mount in cgroup_mounts())

    with contextlib.suppress(TimeoutError):
        wait_until(attempt, timeout=timeout, what=f"cgroups {root} removed")


def processes_in(pid_ns: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if str((entry / "ns" / "pid").readlink()) == pid_ns and _alive(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids
