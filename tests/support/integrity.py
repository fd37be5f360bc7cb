"""Helpers for the Remediation integrity tests: the chart's admission objects applied to the
test API server, and clients that authenticate with ServiceAccount bearer tokens (issued by
the TokenRequest API, optionally bound to a pod on a node) instead of the admin cert."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import yaml

from devcluster import ControlPlane

JSON = dict[str, Any]
MERGE = "application/merge-patch+json"


@dataclass(frozen=True)
class Answer:
    """What the API server said: the HTTP status and the body (a Status on errors)."""

    status: int
    body: JSON

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


@dataclass(frozen=True)
class TokenClient:
    """Requests to the API server as whoever holds `token` (no client certificate)."""

    url: str
    ca_file: str
    token: str

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Answer:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        ctx = ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                return Answer(resp.status, json.loads(resp.read() or b"{}"))
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return Answer(err.code, json.loads(raw))
            except ValueError:
                return Answer(err.code, {"message": raw.decode(errors="replace")})

    def patch(self, path: str, body: JSON) -> Answer:
        return self.request("PATCH", path, body, MERGE)


def token_for(
    cp: ControlPlane, namespace: str, service_account: str, pod: JSON | None = None
) -> TokenClient:
    """A token for the ServiceAccount from the TokenRequest API; bound to `pod` when given
    (the API server then records the pod's node in the token, as for a projected token)."""
    spec: JSON = {"expirationSeconds": 600}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    answer = cp.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return TokenClient(cp.url, str(cp.certs.ca_cert), answer["status"]["token"])


def whoami(client: TokenClient) -> JSON:
    """The user the API server sees for this client (SelfSubjectReview)."""
    answer = client.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert answer.status == 201, answer
    return answer.body["status"]["userInfo"]  # type: ignore[no-any-return]


def apply_objects(cp: ControlPlane, objects: list[JSON]) -> None:
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))


def delete_objects(cp: ControlPlane, objects: list[JSON]) -> None:
    cp.kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-",
        input=yaml.safe_dump_all(objects), check=False,
    )  # fmt: skip


def tenant_refused(cp: ControlPlane, tenant: TokenClient, path: str, body: JSON) -> bool:
    """The chart's admission policy refuses `tenant` this create of a Remediation (a policy
    takes effect a moment after it is applied); one accepted before that is deleted again."""
    answer = tenant.request("POST", path, body)
    if answer.status == 201:
        cp.request("DELETE", f"{path}/{answer.body['metadata']['name']}")
        return False
    return answer.status == 403 and "only the unstick controller" in answer.message


@contextmanager
def applied(
    cp: ControlPlane,
    objects: list[JSON],
    *,
    records_in: Sequence[str],
    agents_in: str,
    keep: Sequence[JSON] = (),
) -> Iterator[None]:
    """`objects` applied (the namespaces, nodes, rendered chart and RBAC of a test's world);
    at the end the Remediations in the namespaces `records_in` deleted, every pod in
    `agents_in` force-deleted (the agents' pods are bound to nodes with no kubelet: deleted
    gracefully they would stay Terminating, stuck and NodeGone once the nodes go, for the
    modules after this) and `objects` deleted, but those in `keep`."""
    try:
        apply_objects(cp, objects)
        yield
    finally:
        for namespace in records_in:
            cp.kubectl("delete", "remediations", "--all", "-n", namespace, check=False)
        cp.kubectl(
            "delete", "pods", "--all", "-n", agents_in, "--grace-period=0", "--force",
            check=False,
        )  # fmt: skip
        delete_objects(cp, [o for o in objects if o not in keep])
