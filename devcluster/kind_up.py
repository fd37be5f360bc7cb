"""`make kind-up` / `make kind-down` (docs/quickstart.md): a local kind cluster of three
machines (one control plane, two workers) on podman, with unstick installed from the
image built here and the chart of this tree — the kind suite's way (docs/kind.md,
tests/machines/kind), kept instead of deleted.

    python -m devcluster.kind_up          # make kind-up: make (or keep) it, install unstick
    python -m devcluster.kind_up --down   # make kind-down: delete it, its network, volumes

What it shares with the suite: the checks of this machine (kind_check.kind_unavailable),
kind's environment (kind_check.kind_env: podman, the project's containers.conf), the
suite's cluster configuration (tests/machines/kind/cluster.yaml), its node image
(hack/build-kind-node-image.sh) and the unstick and busybox images of bin/node-images.json
(`make images`), loaded with `kind load image-archive`, and the chart installed with the
suite's image values. What differs: the cluster has a fixed name (`unstick-quickstart`,
not the suite's `unstick-kind-<pid>-<hex>`, so the suite's sweep of leftovers never takes
it), the policy stays in dry run (the chart's default), and its kubeconfig is a file of
its own (printed at the end; ~/.kube/config is not touched)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from devcluster.kind_check import ROOT, kind_env, kind_unavailable

NAME = "unstick-quickstart"
NAMESPACE = "unstick"
BIN = ROOT / "bin"
CONFIG = ROOT / "tests" / "machines" / "kind" / "cluster.yaml"  # the kind suite's cluster
# kind mounts the host's /lib/modules into every node (as the suite, tests/machines/kind)
MODULES = Path("/lib/modules")


def state_dir() -> Path:
    """Where its kubeconfig lives: next to the kind suite's cache."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "unstick" / NAME


def kubeconfig() -> Path:
    return state_dir() / "kubeconfig"


def say(what: str) -> None:
    print(f"kind-up: {what}", file=sys.stderr, flush=True)


def run(argv: Sequence[str | Path], *, check: bool = True, quiet: bool = True) -> str:
    """A command in kind's environment; its stdout. A failure raises, naming the command
    and the last lines of its stderr."""
    proc = subprocess.run(
        [str(a) for a in argv],
        capture_output=quiet,
        text=True,
        env={**os.environ, **kind_env(NAME)},
    )
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-5:])
        raise RuntimeError(
            f"{' '.join(str(a) for a in argv[:4])} failed ({proc.returncode}): {tail}"
        )
    return proc.stdout or ""


def exists() -> bool:
    return NAME in run([BIN / "kind", "get", "clusters"], check=False).split()


def images() -> dict[str, dict[str, str]]:
    index = BIN / "node-images.json"
    if not index.exists():
        raise RuntimeError(f"{index} missing: run `make images` (the unstick image)")
    found: dict[str, dict[str, str]] = json.loads(index.read_text())
    return found


def up() -> None:
    built = images()
    say("the node image (hack/build-kind-node-image.sh; cached after the first build)")
    lines = run(["bash", ROOT / "hack" / "build-kind-node-image.sh"]).strip().splitlines()
    if not lines:
        raise RuntimeError("hack/build-kind-node-image.sh printed no image reference")
    state_dir().mkdir(parents=True, exist_ok=True)
    if not MODULES.exists():  # kind mounts it into every node; podman refuses a missing one
        say(f"{MODULES} made (empty: this machine has no kernel modules); left in place")
        MODULES.mkdir()
    kubectl: list[str | Path] = [BIN / "kubectl", f"--kubeconfig={kubeconfig()}"]
    if exists():
        say(f"cluster {NAME} is there already: unstick is installed again")
        run([BIN / "kind", "export", "kubeconfig", "--name", NAME, "--kubeconfig", kubeconfig()])
    else:
        say(f"kind create cluster {NAME} (3 machines; a few minutes)")
        run([BIN / "kind", "create", "cluster", "--name", NAME, "--config", CONFIG,
             "--image", lines[-1], "--kubeconfig", kubeconfig()], quiet=False)  # fmt: skip
    run([*kubectl, "wait", "--for=condition=Ready", "nodes", "--all", "--timeout=300s"])
    for image in ("unstick", "busybox"):
        say(f"kind load image-archive {built[image]['ref']}")
        run([BIN / "kind", "load", "image-archive", "--name", NAME, built[image]["archive"]])
    repository, tag = built["unstick"]["ref"].rsplit(":", 1)
    say(f"helm install unstick charts/unstick (image {repository}:{tag})")
    run([BIN / "helm", "upgrade", "--install", "unstick", ROOT / "charts" / "unstick",
         "-n", NAMESPACE, "--create-namespace", f"--kubeconfig={kubeconfig()}",
         "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
         "--set", "image.pullPolicy=Never", "--wait", "--timeout", "5m"])  # fmt: skip
    print(
        f"unstick runs in kind cluster {NAME}. Next (docs/quickstart.md):\n"
        f"  export KUBECONFIG={kubeconfig()}\n"
        f"  export PATH={ROOT / '.venv' / 'bin'}:{BIN}:$PATH\n"
        "  kubectl unstick status\n"
        "busybox for your pods: " + built["busybox"]["ref"]
    )


def down() -> None:
    if exists():
        say(f"kind delete cluster {NAME}")
        run([BIN / "kind", "delete", "cluster", "--name", NAME])
    else:
        say(f"no cluster {NAME}")
    # what kind on podman leaves: the nodes' /var volumes (labelled with the node's name)
    # and the cluster's own network
    volumes = json.loads(run(["podman", "volume", "ls", "--format", "json"], check=False) or "[]")
    for volume in volumes:
        if any(label.startswith(f"{NAME}-") for label in volume.get("Labels") or {}):
            run(["podman", "volume", "rm", "--force", volume["Name"]], check=False)
    run(["podman", "network", "rm", "--force", NAME], check=False)
    kubeconfig().unlink(missing_ok=True)


def _cannot_delete() -> str | None:
    if os.geteuid() != 0:
        return "needs root (kind's nodes are podman containers of root)"
    if not (BIN / "kind").exists():
        return f"{BIN / 'kind'} missing: run `make tools`"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devcluster.kind_up",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--down", action="store_true", help="delete the cluster")
    args = parser.parse_args(argv)
    problem = kind_unavailable() if not args.down else _cannot_delete()
    if problem:
        print(f"kind-up: cannot run here: {problem}", file=sys.stderr)
        return 2
    try:
        down() if args.down else up()
    except (RuntimeError, KeyError, OSError) as exc:
        print(f"kind-up: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
