"""medik8s FenceAgentsRemediation (FAR) v0.7.0 in the kind suite's cluster, fencing its
workers for real (docs/fencing.md, docs/kind.md "FAR and fence_docker"):

- FAR's manager, built from ../shared/thirdparty by hack/build-thirdparty.sh, in an image
  with Debian bookworm's `fence-agents` (hack/build-images.sh, `far`), loaded onto the
  control-plane node only. Its CRDs, ServiceAccount and RBAC are read from the release
  archive's config/ and given FAR's namespace and name prefix as its kustomization does
  (config/rbac: `fence-agents-remediation-`); its Deployment is config/manager's with what
  this cluster needs: one replica without leader election, on the control plane (never the
  node it fences), on the host's network (pods reach no address outside the cluster here,
  docs/kind.md), a self-signed certificate for its webhook server (no webhook is
  registered: OLM does that in a real install).
- FAR runs the agent itself, as a child of its manager: `fence_docker --ip --ipport
  --ssl-insecure --plug <node> --action off`. fence_docker speaks the Docker API over
  HTTPS; podman serves that API (`podman system service`) on a unix socket in the run's
  work directory, and the test's gate (`DockerGate`, a TLS front on the cluster network's
  gateway address) passes on only `GET containers/<worker>/json` and `POST
  containers/<worker>/kill|start` for this cluster's two workers: nothing else on the
  machine can be powered off through it. Both are stopped at the end (the service by its
  PID)."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import socket
import ssl
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from devcluster.kind_check import ROOT, kind_env
from devcluster.process import Process, wait_until

from . import runs
from .support import Kind, podman

log = logging.getLogger(__name__)

THIRDPARTY = Path(os.environ.get("UNSTICK_THIRDPARTY", ROOT.parent / "shared" / "thirdparty"))
ARCHIVE = "fence-agents-remediation-v0.7.0.tar.gz"
TOP = ARCHIVE.removesuffix(".tar.gz")
NAMESPACE = "kind-far"  # FAR's own: where its records are (the policy names it)
PREFIX = "fence-agents-remediation-"  # config/rbac's and config/default's namePrefix
API = "fence-agents-remediation.medik8s.io/v1alpha1"
SUCCEEDED = "FenceAgentActionSucceeded"
TAINT = "remediation.medik8s.io/fence-agents-remediation"  # FAR's NoSchedule while it remediates
CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"  # controller-runtime's default


def sources_missing() -> str:
    """Why FAR cannot be deployed here ('' when its sources are there): the test skips."""
    if not (THIRDPARTY / ARCHIVE).is_file():
        return f"FAR's sources: no {ARCHIVE} in {THIRDPARTY} (set UNSTICK_THIRDPARTY)"
    return ""


def require_image(images: dict[str, dict[str, str]]) -> None:
    """With FAR's sources there its image must have been built (`make tools images`): its
    absence is an error, not a skip."""
    if "far" not in images:
        why = ""
        with contextlib.suppress(OSError, ValueError):
            why = json.loads((ROOT / "bin" / "thirdparty.json").read_text()).get("missing", "")
        raise FileNotFoundError(
            "bin/node-images.json has no 'far' image: run `make tools images` "
            f"(hack/build-thirdparty.sh builds FAR's manager, hack/build-images.sh its image) {why}"
        )


def certificate(work: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key (FAR's webhook server and the gate's TLS)."""
    crt, key = work / "far-tls.crt", work / "far-tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=unstick-kind-far", "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self.path))


# what fence_docker asks: status (GET json), off (POST kill), on (POST start)
_ALLOWED = re.compile(r"^/v[0-9.]+/containers/(?P<name>[^/?]+)/(?P<op>json|kill|start)(\?.*)?$")
_METHOD = {"json": "GET", "kill": "POST", "start": "POST"}


@dataclass
class DockerGate:
    """A TLS front on `address` for podman's Docker API socket, passing on only fence_docker's
    requests about the `machines` named; what it was asked, and answered, in `seen`."""

    socket_path: Path
    machines: set[str]
    seen: list[tuple[str, str, int]] = field(default_factory=list)

    def allowed(self, method: str, path: str) -> bool:
        m = _ALLOWED.match(path)
        return bool(m and m["name"] in self.machines and _METHOD[m["op"]] == method)

    def forward(self, method: str, path: str) -> tuple[int, bytes]:
        if not self.allowed(method, path):
            return 403, json.dumps({"message": f"not for this gate: {method} {path}"}).encode()
        conn = _UnixConnection(self.socket_path)
        try:
            conn.request(method, path)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    @contextlib.contextmanager
    def serving(self, address: str, crt: Path, key: Path) -> Iterator[int]:
        """Listening on `address` (a free port: yielded) until the end."""
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                status, body = gate.forward(self.command, self.path)
                gate.seen.append((self.command, self.path, status))
                log.info("docker gate: %s %s -> %d", self.command, self.path, status)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass  # (each request is logged above)

        server = ThreadingHTTPServer((address, 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(crt, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(target=server.serve_forever, name="docker-gate", daemon=True)
        thread.start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


@contextlib.contextmanager
def podman_service(work: Path) -> Iterator[Path]:
    """`podman system service` on a unix socket in `work` (kind's podman settings), until
    the end; stopped by its PID."""
    sock = work / "docker-api.sock"
    argv = ["podman", "system", "service", "--time=0", f"unix://{sock}"]
    proc = Process("podman-service", argv, work / "podman-service.log", env=_podman_env())
    proc.start()
    try:

        def answers() -> bool:
            if not sock.exists():
                return False
            conn = _UnixConnection(sock)
            try:
                conn.request("GET", "/_ping")
                return conn.getresponse().status == 200
            except OSError:
                return False
            finally:
                conn.close()

        wait_until(answers, timeout=60, what="podman's API to answer", process=proc)
        yield sock
    finally:
        proc.stop()
        sock.unlink(missing_ok=True)


def _podman_env() -> dict[str, str]:
    return {**os.environ, **kind_env()}


def gateway(kind: Kind) -> str:
    """The host's IPv4 address on the cluster's podman network (its gateway; kind makes the
    network dual-stack, its IPv6 subnet first)."""
    network = json.loads(podman("network", "inspect", kind.name))[0]
    address: str = next(s["gateway"] for s in network["subnets"] if ":" not in s["gateway"])
    return address


def _read(tar: tarfile.TarFile, member: str) -> list[dict[str, Any]]:
    data = tar.extractfile(f"{TOP}/{member}")
    if data is None:
        raise FileNotFoundError(f"{ARCHIVE}: no {member}")
    return [d for d in yaml.safe_load_all(data) if d]


def _placed(obj: dict[str, Any]) -> dict[str, Any]:
    """kustomize's namespace and namePrefix (config/default) on one object of config/."""
    meta = obj["metadata"]
    meta["name"] = PREFIX + meta["name"]
    if "namespace" in meta:
        meta["namespace"] = NAMESPACE
    if "roleRef" in obj:
        obj["roleRef"]["name"] = PREFIX + obj["roleRef"]["name"]
    for subject in obj.get("subjects", []):
        subject["name"] = PREFIX + subject["name"]
        subject["namespace"] = NAMESPACE
    return obj


def manifests(
    image: str, crt: Path, key: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(FAR's CRDs, the rest: namespace, ServiceAccount, RBAC, webhook certificate,
    Deployment), from the archive's config/."""
    with tarfile.open(THIRDPARTY / ARCHIVE) as tar:
        crds = [
            crd
            for plural in ("fenceagentsremediations", "fenceagentsremediationtemplates")
            for crd in _read(
                tar, f"config/crd/bases/fence-agents-remediation.medik8s.io_{plural}.yaml"
            )
        ]
        rbac = [
            _placed(o)
            for f in ("service_account.yaml", "role.yaml", "role_binding.yaml")
            for o in _read(tar, f"config/rbac/{f}")
        ]
        manager = [
            o for o in _read(tar, "config/manager/manager.yaml") if o["kind"] == "Deployment"
        ]
    deployment = _placed(manager[0])
    spec = deployment["spec"]
    spec["replicas"] = 1
    pod = spec["template"]["spec"]
    pod["serviceAccountName"] = PREFIX + pod["serviceAccountName"]  # (kustomize's namePrefix)
    pod.pop("topologySpreadConstraints", None)  # (its two replicas on two nodes)
    pod["hostNetwork"] = True
    pod["nodeSelector"] = {"node-role.kubernetes.io/control-plane": ""}
    pod["tolerations"] = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
    pod["volumes"] = [
        {"name": "cert", "secret": {"secretName": PREFIX + "webhook-cert"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    manager_container = pod["containers"][0]
    manager_container.update(image=image, imagePullPolicy="Never", args=[])  # one: no election
    manager_container["volumeMounts"] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cert", "mountPath": CERT_DIR, "readOnly": True},
    ]
    cert = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": PREFIX + "webhook-cert", "namespace": NAMESPACE},
        "stringData": {"tls.crt": crt.read_text(), "tls.key": key.read_text()},
    }
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    return crds, [namespace, *rbac, cert, deployment]


@dataclass
class Far:
    """FAR running in the cluster, and how its fence agent reaches podman."""

    kind: Kind
    gate: DockerGate
    address: str
    port: int
    manager: str  # its Deployment's name

    def remediation(self, node: str, *, action: str = "off") -> dict[str, Any]:
        """A FenceAgentsRemediation for `node` as NodeHealthCheck makes one from a template
        (the node's name, the template's spec): fence_docker through the gate, the plug by
        node (each kind node's machine is its podman container of the same name)."""
        return {
            "apiVersion": API,
            "kind": "FenceAgentsRemediation",
            "metadata": {"name": node, "namespace": NAMESPACE},
            "spec": {
                "agent": "fence_docker",
                "sharedparameters": {
                    "--ip": self.address,
                    "--ipport": str(self.port),
                    "--ssl-insecure": "",
                    "--action": action,
                },
                "nodeparameters": {"--plug": {m: m for m in sorted(self.gate.machines)}},
                "remediationStrategy": "ResourceDeletion",
                "retrycount": 3,
                "retryinterval": "5s",
                "timeout": "60s",
            },
        }

    def get(self, node: str) -> dict[str, Any] | None:
        out = self.kind.kubectl(
            "get", "fenceagentsremediations", node, "-n", NAMESPACE, "-o", "json", check=False
        )
        return json.loads(out) if out else None

    def logs(self) -> str:
        return self.kind.kubectl(
            "logs", f"deployment/{self.manager}", "-n", NAMESPACE, "--tail=40", check=False
        )

    def delete_all(self) -> None:
        """Every FAR deleted, FAR removing its finalizer (and its taint on the node); if
        FAR cannot, the finalizer taken off by hand."""
        self.kind.kubectl(
            "delete", "fenceagentsremediations", "--all", "-n", NAMESPACE, "--wait=false",
            check=False,
        )  # fmt: skip
        try:
            wait_until(lambda: not self._names(), timeout=60, what="the FARs gone")
        except TimeoutError:
            log.warning("FAR did not finish deleting its records: %s", self.logs())
            for name in self._names():
                self.kind.kubectl(
                    "patch", "fenceagentsremediations", name, "-n", NAMESPACE,
                    "--type=merge", "-p", '{"metadata": {"finalizers": null}}', check=False,
                )  # fmt: skip

    def _names(self) -> list[str]:
        out = self.kind.kubectl(
            "get", "fenceagentsremediations", "-n", NAMESPACE, "-o", "name", check=False
        )
        return out.split()


def condition(far: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    if far is None:
        return None
    found = (far.get("status") or {}).get("conditions") or []
    return next((c for c in found if c["type"] == kind), None)


@contextlib.contextmanager
def deployed(kind: Kind) -> Iterator[Far]:
    """FAR in the cluster with its agent's way to podman (module docstring); everything of
    it deleted at the end, also on failure: its records first (while FAR runs to remove
    their finalizers), then the manager, RBAC, namespace and CRDs, the gate and podman's
    service."""
    work = runs.workdir(kind.name)
    crt, key = certificate(work)
    control_plane = f"{kind.name}-control-plane"
    kind.start_load("far", "far", control_plane)
    crds, objects = manifests(kind.images["far"]["ref"], crt, key)
    machines = {f"{kind.name}-worker", f"{kind.name}-worker2"}
    address = gateway(kind)
    manager = next(o["metadata"]["name"] for o in objects if o["kind"] == "Deployment")
    cluster_scoped = [
        f"{o['kind'].lower()}/{o['metadata']['name']}"
        for o in objects
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding")
    ]
    with podman_service(work) as sock:
        gate = DockerGate(sock, machines)
        with gate.serving(address, crt, key) as port:
            far = Far(kind, gate, address, port, manager)
            try:
                kind.apply(*crds)
                kind.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
                kind.wait_loaded("far")
                kind.apply(*objects)
                kind.kubectl(
                    "rollout", "status", f"deployment/{manager}", "-n", NAMESPACE, "--timeout=180s"
                )
                yield far
            finally:
                far.delete_all()
                kind.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", check=False)
                kind.kubectl("delete", *cluster_scoped, "--ignore-not-found", check=False)
                names = [f"crd/{crd['metadata']['name']}" for crd in crds]
                kind.kubectl("delete", *names, "--ignore-not-found", check=False)
