"""The four contenders, each a subprocess with its own User-Agent in the audit log.

- `unstick`: `unstick controller` as shipped (lean watcher + Kopf for the CRDs);
- `naive`: `bench/naive.py`, LIST everything every 30 s and force-delete what is overdue;
- `kopf_native`: `bench/kopf_native.py`, unstick's logic fed by Kopf's own pod watch;
- `podgc`: `kube-controller-manager --controllers=podgc`, Kubernetes' own pod garbage
  collector, which force-deletes pods bound to nodes that no longer exist.

Every process is a `devcluster.process.Process`: killed with the benchmark
(PR_SET_PDEATHSIG) and stopped by PID (TERM, then KILL).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.kopf_native import USER_AGENT as KOPF_NATIVE_UA
from bench.naive import USER_AGENT as NAIVE_UA
from devcluster import ControlPlane
from devcluster.process import Process, env_with_path, free_port

ALL = ("unstick", "naive", "kopf_native", "podgc")
# Extra, on request (--contenders): unstick as shipped but with `--workers 32`, to show how
# its reconcile throughput scales with the one knob it has for bursts.
EXTRA = ("unstick_w32",)
KOPF_UA = "kopf/"  # Kopf's own aiohttp client (unstick's and kopf_native's CRD/Node watches)


@dataclass(frozen=True)
class Contender:
    name: str
    agents: tuple[str, ...]  # User-Agent prefixes of its requests
    ready_verb: str  # its start-up is done once it made this request on pods ("watch"/"list")
    acts_on_finalizers: bool  # whether it records FinalizerBlocked pods (Remediations)


CONTENDERS = {
    "unstick": Contender("unstick", ("unstick-controller/", KOPF_UA), "watch", True),
    "unstick_w32": Contender("unstick_w32", ("unstick-controller/", KOPF_UA), "watch", True),
    "naive": Contender("naive", (NAIVE_UA,), "list", False),
    "kopf_native": Contender("kopf_native", (KOPF_NATIVE_UA, KOPF_UA), "watch", True),
    "podgc": Contender("podgc", ("kube-controller-manager/",), "watch", False),
}


@dataclass(frozen=True)
class StartSettings:
    slack_s: int
    naive_interval_s: float = 30.0
    terminated_pod_gc_threshold: int = 12500
    unstick_args: tuple[str, ...] = ()  # more `unstick controller` flags (bench.nodeside)


def _python_argv(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def argv_for(name: str, cp: ControlPlane, settings: StartSettings) -> list[str]:
    kubeconfig = str(cp.kubeconfig)
    if name in ("unstick", "unstick_w32"):
        exe = Path(sys.executable).parent / "unstick"
        base = [str(exe)] if exe.exists() else _python_argv("unstick")
        workers = ["--workers=32"] if name == "unstick_w32" else []
        return [
            *base,
            "controller",
            f"--kubeconfig={kubeconfig}",
            "--standalone",
            f"--metrics-port={free_port()}",
            "--health-port=0",
            # the benchmark's policy permits 1,000,000 a minute: lift the caps that no
            # policy can raise (defaults 60 / 10), or the burst runs at 60 per minute
            "--max-actions-per-minute=1000000",
            "--max-node-actions-per-minute=1000000",
            *workers,
            *settings.unstick_args,
        ]
    if name == "naive":
        return [
            *_python_argv("bench.naive"),
            f"--kubeconfig={kubeconfig}",
            f"--interval={settings.naive_interval_s}",
            f"--slack={settings.slack_s}",
        ]
    if name == "kopf_native":
        return [*_python_argv("bench.kopf_native"), f"--kubeconfig={kubeconfig}"]
    if name == "podgc":
        return [
            str(cp.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            "--controllers=podgc",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--terminated-pod-gc-threshold={settings.terminated_pod_gc_threshold}",
            "--secure-port=0",
            "--v=1",
        ]
    raise ValueError(f"unknown contender {name!r}; choose from {', '.join(ALL)}")


def start(name: str, cp: ControlPlane, settings: StartSettings, log: Path) -> Process:
    """Start one contender; its output goes to `log`."""
    repo = Path(__file__).resolve().parents[1]
    env = env_with_path(cp.bin_dir)
    env["PYTHONPATH"] = f"{repo}:{env.get('PYTHONPATH', '')}".rstrip(":")
    env["PYTHONUNBUFFERED"] = "1"
    return Process(name, argv_for(name, cp, settings), log, env=env).start()


def attach_profiler(proc: Process, name: str, logs: Path) -> Process | None:
    """With $BENCH_PYSPY_DIR set: `py-spy record --idle --threads` attached to a Python
    contender (collapsed stacks in that directory): where its wall time goes. py-spy ends
    by itself, writing its file, when the contender exits. Profiling runs only: sampling
    costs the contender some CPU."""
    out_dir = os.environ.get("BENCH_PYSPY_DIR")
    if not out_dir or name == "podgc" or proc.pid is None:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(out_dir) / f"{name}.txt"
    argv = [spy, "record", "--idle", "--threads", "--format", "raw", "-o", str(out)]
    argv += ["--pid", str(proc.pid)]
    return Process(f"py-spy {name}", argv, logs / f"py-spy-{name}.log").start()


def finish_profiler(spy: Process | None, timeout_s: float = 30.0) -> None:
    """After the contender stopped: let py-spy write its file, then make sure it is gone."""
    if spy is None or spy.popen is None:
        return
    try:
        spy.popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass
    spy.stop()
