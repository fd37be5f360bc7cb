"""agent/probe/kubelet_metrics.py against a real HTTPS server on loopback: the token is sent
only to a server whose certificate the ServiceAccount's CA signed; a refusal, a silence or
text that is not Prometheus leaves the counts absent and says why; never an exception."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from devcluster.certs import CertPaths, make_certs
from unstick.agent.probe.kubelet_metrics import read_kubelet_pods
from unstick.core.model.kubelet_pods import ByLifecycle

TOKEN = "the-agents-token"
BODY = (Path(__file__).parents[1] / "core/data/kubelet-metrics-v1.36.3.txt").read_bytes()
ANSWERS = {"/metrics": BODY, "/garbage": b'kubelet_working_pods{lifecycle="sync" 1\n'}


class _Kubelet(BaseHTTPRequestHandler):
    """A kubelet's /metrics: 401 without the token, 403 on /forbidden."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)
            self.end_headers()
            return
        body = ANSWERS.get(self.path)
        self.send_response(403 if body is None else 200)
        self.end_headers()
        self.wfile.write(body or b"Forbidden (user=system:serviceaccount:x:y, verb=get)")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[str, CertPaths]]:
    """(its https://127.0.0.1:<port>, the certificates of its CA)."""
    certs = make_certs(tmp_path / "pki")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Kubelet)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.serving_cert, certs.serving_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", certs
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _account(directory: Path, ca: Path, token: str = TOKEN) -> str:
    directory.mkdir()
    (directory / "token").write_text(token + "\n")
    (directory / "ca.crt").write_bytes(ca.read_bytes())
    return str(directory)


def test_the_kubelets_counts_read_with_the_token(
    kubelet: tuple[str, CertPaths], tmp_path: Path
) -> None:
    url, certs = kubelet
    pods = read_kubelet_pods(f"{url}/metrics", _account(tmp_path / "sa", certs.ca_cert))
    assert pods.unread == "" and pods.working is not None, pods
    assert pods.orphaned == ByLifecycle(0, 0, 0)


@pytest.mark.parametrize(
    ("path", "token", "says"),
    [
        ("/metrics", "another", "refused the agent's token (401): its webhook authentication"),
        (
            "/stats",
            TOKEN,
            "refused the read (403): the agent's ServiceAccount may not get nodes/metrics",
        ),
        ("/garbage", TOKEN, "is not Prometheus text: line 1 "),
    ],
)
def test_a_refusal_or_bad_text_is_said(
    kubelet: tuple[str, CertPaths], tmp_path: Path, path: str, token: str, says: str
) -> None:
    url, certs = kubelet
    pods = read_kubelet_pods(url + path, _account(tmp_path / "sa", certs.ca_cert, token))
    assert pods.working is None and says in pods.unread, pods.unread


def test_no_token_goes_to_a_kubelet_the_cluster_ca_did_not_sign(
    kubelet: tuple[str, CertPaths], tmp_path: Path
) -> None:
    url, _ = kubelet
    other = make_certs(tmp_path / "other-ca")
    pods = read_kubelet_pods(f"{url}/metrics", _account(tmp_path / "sa", other.ca_cert))
    assert pods.working is None
    assert "did not answer: [SSL: CERTIFICATE_VERIFY_FAILED]" in pods.unread, pods.unread


def test_no_address_no_account_no_answer(tmp_path: Path) -> None:
    assert "was not given the kubelet's /metrics address" in read_kubelet_pods("").unread
    missing = read_kubelet_pods("https://127.0.0.1:1/metrics", str(tmp_path / "none"))
    assert "cannot read the agent's ServiceAccount token or CA" in missing.unread
    certs = make_certs(tmp_path / "pki")
    closed = read_kubelet_pods(
        "https://127.0.0.1:1/metrics", _account(tmp_path / "sa", certs.ca_cert)
    )
    assert "did not answer: [Errno 111] Connection refused" in closed.unread, closed.unread
