"""The real node's kubelet: its client certificate (user `system:node:<name>` in group
`system:nodes`, signed by the local control plane's CA), kubeconfig and configuration.

Settings that make it run on this kind of machine (cgroup v1, swap, no systemd, no
CAP_SYS_RESOURCE for containerd) are here, each said why."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devcluster.certs import CertPaths


@dataclass(frozen=True)
class KubeletSettings:
    node_name: str
    root_dir: Path  # the kubelet's --root-dir (the chart's agent.kubeletRoot)
    workdir: Path  # config, certificates, logs
    runtime_endpoint: str  # unix:///.../containerd.sock
    cgroup_root: str  # e.g. /unstick-node: every pod cgroup under <controller>/<root>/kubepods
    port: int = 10250
    healthz_port: int = 10248
    verbosity: int = 2
    # The node's InternalIP (--node-ip): an address of this machine that the API server
    # dials for `kubectl logs`; empty: the kubelet picks one (and serves a self-signed
    # certificate the API server does not trust).
    node_ip: str = ""


def _load_ca(certs: CertPaths) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca = x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(certs.ca_key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return ca, key


def _write_pair(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, stem: Path) -> None:
    stem.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path = stem.with_suffix(".key")
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _issue(
    certs: CertPaths,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    names: list[x509.GeneralName],
    stem: Path,
) -> tuple[Path, Path]:
    """A leaf certificate signed by the control plane's CA, written to `stem`.crt/.key."""
    ca, ca_key = _load_ca(certs)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    stem.parent.mkdir(parents=True, exist_ok=True)
    _write_pair(builder.sign(ca_key, hashes.SHA256()), key, stem)
    return stem.with_suffix(".crt"), stem.with_suffix(".key")


def write_node_credentials(certs: CertPaths, node_name: str, directory: Path) -> tuple[Path, Path]:
    """A client certificate for the node identity (what the Node authorizer and the
    `system:node` role expect); returns (cert, key)."""
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
        ]
    )
    return _issue(certs, subject, ExtendedKeyUsageOID.CLIENT_AUTH, [], directory / "kubelet-client")


def write_serving_cert(
    certs: CertPaths, node_name: str, node_ip: str, directory: Path
) -> tuple[Path, Path]:
    """The kubelet's serving certificate, signed by the control plane's CA (which the API
    server is told to trust: `kubectl logs` works) for the node's IP and name."""
    names: list[x509.GeneralName] = [x509.DNSName(node_name)]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in (node_ip, "127.0.0.1") if ip]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{node_name}-kubelet")])
    return _issue(certs, subject, ExtendedKeyUsageOID.SERVER_AUTH, names, directory / "kubelet")


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }


def kubelet_config(
    settings: KubeletSettings, client_ca: Path, serving: tuple[Path, Path] | None = None
) -> dict[str, Any]:
    tls = {"tlsCertFile": str(serving[0]), "tlsPrivateKeyFile": str(serving[1])} if serving else {}
    return {
        **tls,
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # No systemd here; and the machine has cgroup v1, which the kubelet refuses by
        # default since 1.35.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupRoot": settings.cgroup_root,
        "failSwapOn": False,
        "containerRuntimeEndpoint": settings.runtime_endpoint,
        # As kubeadm sets it up: a bearer token is checked by a TokenReview and every
        # request by a SubjectAccessReview (the agent reads /metrics with its token and
        # nodes/metrics; the API server's admin certificate is in system:masters).
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "port": settings.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": settings.healthz_port,
        "podLogsDir": str(settings.workdir / "pod-logs"),
        # A test machine's disk is what it is: no eviction, no image garbage collection
        # (the images cannot be pulled again: there is no registry).
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "resolvConf": "/etc/resolv.conf",
        "registerNode": True,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "maxPods": 50,
        "volumePluginDir": str(settings.workdir / "volume-plugins"),
    }


def write_kubelet_files(
    settings: KubeletSettings, certs: CertPaths, server: str
) -> tuple[Path, Path]:
    """Credentials, kubeconfig and configuration; returns (kubeconfig, config)."""
    settings.workdir.mkdir(parents=True, exist_ok=True)
    cert, key = write_node_credentials(certs, settings.node_name, settings.workdir / "pki")
    kc = settings.workdir / "kubeconfig"
    kc.write_text(
        yaml.safe_dump(
            kubeconfig(server, certs.ca_cert, cert, key, f"system:node:{settings.node_name}")
        )
    )
    kc.chmod(0o600)
    config = settings.workdir / "config.yaml"
    serving = None
    if settings.node_ip:
        serving = write_serving_cert(
            certs, settings.node_name, settings.node_ip, settings.workdir / "pki"
        )
    config.write_text(yaml.safe_dump(kubelet_config(settings, certs.ca_cert, serving)))
    return kc, config


def kubelet_argv(
    bin_dir: Path, settings: KubeletSettings, kubeconfig: Path, config: Path
) -> list[str]:
    return [
        str(bin_dir / "kubelet"),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={settings.root_dir}",
        f"--cert-dir={settings.workdir / 'serving-pki'}",
        f"--hostname-override={settings.node_name}",
        f"--v={settings.verbosity}",
        *([f"--node-ip={settings.node_ip}"] if settings.node_ip else []),
    ]
