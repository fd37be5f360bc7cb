"""A real local Kubernetes control plane: etcd + kube-apiserver on loopback.

Started the way controller-runtime's envtest starts it: client-certificate auth with an
admin user in `system:masters`, service-account signing keys, RBAC authorization, and no
kube-controller-manager or kubelet. Pods bound to a node that no kubelet (or kwok) serves
stay `Terminating` for real once deleted: that is how tests and the demo make stuck pods.

Every request is written to a JSON audit log, so tests and the benchmark can count the
requests each client made, by verb and user agent.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster.certs import CertPaths, make_certs
from devcluster.process import Process, env_with_path, free_port, wait_until

_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "Metadata"},
    ],
}


UNSTICK_CRDS = Path(__file__).resolve().parents[1] / "operator" / "unstick" / "crds"


def find_bin_dir() -> Path:
    """Where the control-plane binaries are: $UNSTICK_BIN_DIR, the repo's bin/, or $PATH."""
    candidates = []
    if os.environ.get("UNSTICK_BIN_DIR"):
        candidates.append(Path(os.environ["UNSTICK_BIN_DIR"]))
    candidates.append(Path(__file__).resolve().parents[1] / "bin")
    on_path = shutil.which("kube-apiserver")
    if on_path:
        candidates.append(Path(on_path).parent)
    for candidate in candidates:
        if (candidate / "kube-apiserver").exists() and (candidate / "etcd").exists():
            return candidate
    raise FileNotFoundError(
        "kube-apiserver and etcd not found (looked in $UNSTICK_BIN_DIR, the repo's bin/ and "
        "$PATH): run `make tools` to build them"
    )


@dataclass(frozen=True)
class ControlPlaneSettings:
    bin_dir: Path | None = None
    workdir: Path | None = None  # default: a fresh temporary directory, removed on stop
    audit: bool = True
    extra_apiserver_args: tuple[str, ...] = ()
    start_timeout_s: float = 120.0
    # The ServiceAccount admission plugin (pods get their projected token volume); off as
    # in envtest, where no kube-controller-manager creates the `default` ServiceAccounts.
    # The real-node suite turns it on (its pods talk to the API server).
    service_account_admission: bool = False
    # The API server talks to kubelets (`kubectl logs`, `exec`): it verifies their serving
    # certificates against the control plane's CA, presents the admin client certificate,
    # and dials a node's InternalIP (the real-node suite's kubelets register one). Off by
    # default: envtest has no kubelet.
    kubelet_access: bool = False


@dataclass
class ControlPlane:
    settings: ControlPlaneSettings = field(default_factory=ControlPlaneSettings)
    workdir: Path = field(init=False)
    bin_dir: Path = field(init=False)
    certs: CertPaths = field(init=False)
    url: str = field(init=False, default="")
    kubeconfig: Path = field(init=False)
    etcd: Process | None = field(init=False, default=None)
    apiserver: Process | None = field(init=False, default=None)
    _own_workdir: bool = field(init=False, default=False)
    _apiserver_argv: list[str] = field(init=False, default_factory=list)

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> ControlPlane:
        self.bin_dir = self.settings.bin_dir or find_bin_dir()
        if self.settings.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="unstick-cp-"))
            self._own_workdir = True
        else:
            self.workdir = self.settings.workdir
            self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.certs = make_certs(self.workdir / "pki")
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in (self.apiserver, self.etcd):
            if proc is not None:
                proc.stop()
        self.apiserver = self.etcd = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart_apiserver(self) -> None:
        """Stop and start kube-apiserver on the same port (etcd keeps the data)."""
        assert self.apiserver is not None
        self.apiserver.stop()
        self.apiserver = Process(
            "kube-apiserver", self._apiserver_argv, self.workdir / "kube-apiserver.log"
        ).start()
        self._wait_ready()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start-up ----------------------------------------------------------------

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        argv = [
            str(self.bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ]
        self.etcd = Process("etcd", argv, self.workdir / "etcd.log").start()
        wait_until(
            lambda: _http_ok(f"{self.etcd_url}/health"),
            timeout=self.settings.start_timeout_s,
            what="etcd /health",
            process=self.etcd,
        )

    def _start_apiserver(self) -> None:
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        c = self.certs
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={c.serving_cert}",
            f"--tls-private-key-file={c.serving_key}",
            f"--client-ca-file={c.ca_cert}",
            f"--service-account-key-file={c.sa_pub}",
            f"--service-account-signing-key-file={c.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            "--v=1",
        ]
        if not self.settings.service_account_admission:
            # No kube-controller-manager creates the `default` ServiceAccount: as in envtest.
            argv.append("--disable-admission-plugins=ServiceAccount")
        if self.settings.kubelet_access:
            argv += [
                f"--kubelet-certificate-authority={c.ca_cert}",
                f"--kubelet-client-certificate={c.admin_cert}",
                f"--kubelet-client-key={c.admin_key}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        if self.settings.audit:
            policy = self.workdir / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(_AUDIT_POLICY))
            argv += [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--audit-log-maxbackup=0",
                "--audit-log-maxsize=0",
            ]
        argv += list(self.settings.extra_apiserver_args)
        self._apiserver_argv = argv
        self.apiserver = Process(
            "kube-apiserver", argv, self.workdir / "kube-apiserver.log"
        ).start()
        self._wait_ready()

    def _wait_ready(self) -> None:
        wait_until(
            self._readyz,
            timeout=self.settings.start_timeout_s,
            what="kube-apiserver /readyz",
            process=self.apiserver,
        )

    def _readyz(self) -> bool:
        try:
            self.request("GET", "/readyz")
        except OSError:
            return False
        return True

    def _write_kubeconfig(self) -> None:
        self.kubeconfig = self.workdir / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "unstick-local",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.certs.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(self.certs.admin_cert),
                        "client-key": str(self.certs.admin_key),
                    },
                }
            ],
            "contexts": [
                {"name": "unstick-local", "context": {"cluster": "unstick-local", "user": "admin"}}
            ],
            "current-context": "unstick-local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    # -- use -----------------------------------------------------------------------

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs.ca_cert))
        ctx.load_cert_chain(str(self.certs.admin_cert), str(self.certs.admin_key))
        return ctx

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """One admin request with the standard library (no client needed); JSON in and out."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as resp:
            raw = resp.read()
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` for the admin user."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            check=check,
            capture_output=True,
            text=True,
            input=input,
            env=env_with_path(self.bin_dir),
        )

    def install_crds(self, directory: Path = UNSTICK_CRDS) -> list[str]:
        """`kubectl apply` every CRD in `directory` (default: unstick's own) and wait until
        each is Established; returns their names."""
        names = [
            doc["metadata"]["name"]
            for path in sorted(directory.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") == "CustomResourceDefinition"
        ]
        self.kubectl("apply", "-f", str(directory))
        for name in names:
            self.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        return names

    def audit_events(self) -> Iterator[dict[str, Any]]:
        """Every audited request so far (stage ResponseComplete), oldest first."""
        if not self.audit_log.exists():
            return
        with self.audit_log.open() as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
